"""The read-mark GPU test's scenario (``tests/test_autoapply_gpu.py::
test_copies_made_while_the_last_replay_still_runs_wait_for_its_mark``) run many times in one
process, to tell a fault of lent outputs from a latent one of the read mark (session 26: one wrong
output of 60 once, with lending on): ``python bench/apply/probe/mark_race.py [--iters 10]
[--threads 2] [--rounds 30]``. Lending is on or off by ``RECSYS_DOCTOR_LEND_OUTPUTS`` (read at
import).

Each iteration activates the hook anew (one group), runs the client threads (each keeps all its
outputs on the GPU and reads them at the end), and compares every output with eager's. The path of
each query is logged: which thread replayed which graph (``tg.replays``), whether the replay lent its
outputs, reclaims. A wrong output is printed with its error, the query it equals if any (another
round's, another thread's: a stale input or an overwritten output), and the log of its thread's
neighbouring queries. The last line is JSON: iterations, wrong outputs, per-iteration stats."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--groups", type=int, default=1)
    a = ap.parse_args()
    from recsys_doctor.planning.io import write_plan
    from recsys_doctor.applying.script_hook import activate_in_process
    from recsys_doctor.planning.whatif import Candidate

    from test_autoapply_gpu import _slow_model  # (the read-mark GPU test's model)

    model = _slow_model(torch, 3)
    rows = 256

    def arrays(k: int, r: int):
        rng = np.random.default_rng([k, r, 25])
        return (rng.random((rows, 16), dtype=np.float32), rng.integers(0, 1000, rows * 4, dtype=np.int64),
                np.arange(0, rows * 4, 4, dtype=np.int64))

    def call(k: int, r: int):
        dense, idx, offs = arrays(k, r)
        with torch.no_grad():
            return model(torch.from_numpy(dense).cuda(), torch.from_numpy(idx).cuda(), torch.from_numpy(offs).cuda())

    ref = {(k, r): call(k, r).cpu() for k in range(a.threads) for r in range(a.rounds)}
    tls = threading.local()
    log: list[tuple] = []
    wrong_all, stats_all = [], []
    for it in range(a.iters):
        d = Path(tempfile.mkdtemp(prefix="mark-race-"))
        plan = write_plan(d / "plan.json", {}, Candidate(a.groups, True, True, True))
        undo = activate_in_process(plan)
        tgm = sys.modules["_recsys_doctor_autoapply.thread_graphs"]
        orig_replay = tgm._thread_replay

        tgs: dict = {}

        def logged_replay(tg, _orig=orig_replay):
            seen0 = int(tg.mark.seen[0]) if tg.mark is not None else None
            out = _orig(tg)
            lent = getattr(tg, "lent", None)
            tgs[getattr(tls, "k", None)] = tg
            log.append((it, getattr(tls, "k", None), getattr(tls, "r", None), "replay", tg.replays,
                        bool(lent is not None and not lent.off and out is lent.handout()),
                        "seen before", seen0, "base", tg.mark.base if tg.mark is not None else None))
            return out

        tgm._thread_replay = logged_replay
        import time as _time
        orig_mark, orig_graph_of = tgm.ReadMark, tgm._graph_of

        class LoggedMark(orig_mark):
            def __init__(self, torch_, device):
                super().__init__(torch_, device)
                log.append((it, getattr(tls, "k", None), getattr(tls, "r", None), "mark made", self.dev.data_ptr(),
                            torch.cuda.current_stream().cuda_stream, _time.perf_counter()))

        def logged_graph_of(torch_, stream, run):
            t = _time.perf_counter()
            g, out = orig_graph_of(torch_, stream, run)
            log.append((it, getattr(tls, "k", None), getattr(tls, "r", None), "captured", stream.cuda_stream, t,
                        _time.perf_counter()))
            return g, out

        tgm.ReadMark, tgm._graph_of = LoggedMark, logged_graph_of
        lo = sys.modules.get("_recsys_doctor_autoapply.lentout")
        orig_reclaim = lo.Lent.reclaim if lo is not None else None
        if lo is not None:
            def logged_reclaim(self, _orig=orig_reclaim):
                ok = _orig(self)
                log.append((it, getattr(tls, "k", None), getattr(tls, "r", None), "reclaim", ok, None))
                return ok
            lo.Lent.reclaim = logged_reclaim
        got: dict = {}

        def client(k: int) -> None:
            tls.k = k
            kept = []
            for r in range(a.rounds):
                tls.r = r
                kept.append(call(k, r))
            for r, out in enumerate(kept):
                got[k, r] = out.cpu()

        hook = sys.modules["_recsys_doctor_autoapply"]
        threads = [threading.Thread(target=client, args=(k,)) for k in range(a.threads)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            st = hook.stats()
        finally:
            tgm._thread_replay = orig_replay
            tgm.ReadMark, tgm._graph_of = orig_mark, orig_graph_of
            if lo is not None:
                lo.Lent.reclaim = orig_reclaim
            undo()
        torch.cuda.synchronize()
        marks = {k: {"dev": int(tg.mark.dev.item()), "seen": int(tg.mark.seen[0]), "base": tg.mark.base,
                     "replays": tg.replays, "dev_ptr": tg.mark.dev.data_ptr(), "host_ptr": tg.mark.host.data_ptr(),
                     "tin": [t.data_ptr() for t in tg.tin], "out_ptr": tg.static_out.data_ptr()}
                 for k, tg in tgs.items() if tg.mark is not None}
        print(f"iter {it} marks {marks}", flush=True)
        stats_all.append({k: st.get(k) for k in ("thread_graphs", "thread_replays", "mark_waits", "outputs_lent",
                                                   "replays", "captured")})
        for key, want in ref.items():
            err = float((got[key] - want).abs().max())
            if err > 1e-4:
                same = [o for o, w in ref.items() if torch.allclose(got[key], w, atol=1e-5, rtol=1e-4)]
                near = [e for e in log if e[0] == it and e[1] == key[0] and e[2] is not None and abs(e[2] - key[1]) <= 2]
                if not any(w["iter"] == it for w in wrong_all):  # the iteration's first: its captures, both threads
                    print(f"iter {it} captures and marks: {[e for e in log if e[0] == it and e[3] in ('mark made', 'captured')]}",
                          flush=True)
                wrong_all.append({"iter": it, "key": key, "err": err, "equals": same, "log": near})
                print(f"WRONG iter {it} thread {key[0]} round {key[1]}: max err {err:.4g}, equals {same}; "
                      f"log {near}", flush=True)
        print(f"iter {it}: {st.get('thread_replays')} thread replays, {st.get('mark_waits')} mark waits, "
              f"{st.get('outputs_lent')} lent, wrong {sum(1 for w in wrong_all if w['iter'] == it)}", flush=True)
    print(json.dumps({"lend": os.environ.get("RECSYS_DOCTOR_LEND_OUTPUTS", "1"), "threads": a.threads,
                      "iters": a.iters, "wrong": len(wrong_all), "wrong_keys": [w["key"] for w in wrong_all],
                      "stats": stats_all}), flush=True)


if __name__ == "__main__":
    main()
