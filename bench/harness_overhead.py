"""What the workload driver adds on top of the runtime: the wide&deep workload of
``examples/wdl_workload.py`` served by ``runtime.serve`` (the plan ``profile --apply`` keeps:
Q merged groups with graphs), driven

  bare          by a plain closed loop: ``served(*args)`` back to back per client thread
  measure       by ``recsys_doctor.workload.measure`` exactly as the applied child runs it
                (NVTX ``query`` range + the calling thread's stream synchronize per call)
  no_phase      measure with the per-call NVTX range off
  no_sync       measure with the per-call stream synchronize off
  eager         the workload's own eager query through ``measure`` (the baseline)

each in its own process, in one run, Q=8 by default. A ``+release`` suffix (``bare+release``)
runs the configuration with ``RECSYS_DOCTOR_LAUNCH=release-gil`` (graph launches and event
records release the GIL too).

    python bench/harness_overhead.py            # prints and writes $OUT/harness_overhead.json
    QS=4,8 DUR=2 CONFIGS=bare,measure python bench/harness_overhead.py
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from serve_anchors import _client_loop  # noqa: E402 - the one closed-loop client driver of the benches

CONFIGS = ["eager", "measure", "no_phase", "no_sync", "bare"]


def _workload(q: int):
    from recsys_doctor.capture.workload import load_workload

    return load_workload(HERE.parent / "examples" / "wdl_workload.py", ["--threads", str(q)])


def _bare(served, wl, q: int, dur: float) -> dict:
    """``served(*args)`` back to back on each client thread: the closed loop of
    ``bench/serve_anchors.py`` (5 warm-up calls per client, then the window)."""
    args = [wl.inputs(k) for k in range(q)]
    lat, _, errors, wall = _client_loop(q, dur, [(lambda a=a: served(*a)) for a in args])
    if errors:
        raise RuntimeError(errors[0])
    ms = sorted(x * 1e3 for row in lat for x in row)
    n = len(ms)
    return {"queries": n, "qps": round(n / wall, 1), "p99_ms": round(ms[int(0.99 * n) - 1], 3) if n else None,
            "wall_s": round(wall, 2)}


def run_one(config: str, q: int, dur: float) -> dict:
    import torch

    from recsys_doctor.capture import _drive
    from recsys_doctor.applying.train_runner import make_runner
    from recsys_doctor.capture.workload import measure

    wl = _workload(q)
    if config == "eager":
        m = measure(wl, threads=q, duration_s=dur)
        return {"qps": round(m.qps, 1), "p99_ms": round(m.p99_ms, 3), "queries": m.calls}
    runtime = {"groups": q, "merge_streams": True, "cuda_graphs": True, "per_stream_allocator": True}
    run, close, info, wl2 = make_runner(wl, runtime)
    try:
        if config == "bare":
            return _bare(run, wl2, q, dur)
        kw = {}
        if config == "no_phase":
            _drive.phase = lambda name: contextlib.nullcontext()  # type: ignore[assignment]
        if config == "no_sync":
            kw["sync"] = lambda: None
        m = measure(wl2, threads=q, duration_s=dur, run=run, **kw)
        return {"qps": round(m.qps, 1), "p99_ms": round(m.p99_ms, 3), "queries": m.calls,
                "torch": torch.__version__}
    finally:
        close()


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] != "--":
        print(json.dumps(run_one(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))))
        return
    qs = [int(x) for x in os.environ.get("QS", "8").split(",")]
    dur = float(os.environ.get("DUR", "2"))
    configs = os.environ.get("CONFIGS", ",".join(CONFIGS)).split(",")
    rows = []
    for q in qs:
        for c in configs:
            base, _, variant = c.partition("+")
            env = dict(os.environ, **({"RECSYS_DOCTOR_LAUNCH": "release-gil"} if variant == "release" else {}))
            p = subprocess.run([sys.executable, __file__, base, str(q), str(dur)], capture_output=True, text=True,
                               env=env)
            line = (p.stdout.strip().splitlines() or [""])[-1]
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                r = {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
            r.update(config=c, q=q)
            rows.append(r)
            print(json.dumps(r), flush=True)
    out = Path(os.environ.get("OUT", HERE / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / os.environ.get("NAME", "harness_overhead.json")).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
