"""Who hands the GIL off: ``python bench/apply/gil_waits.py TRACE.sqlite [THREAD_PREFIX]`` reads
an Nsight Systems export made with OS-runtime backtraces (``-t osrt --osrt-backtrace-threshold``,
``bench/apply/hostprof.sh bt_dlrm``) and, for every ``pthread_cond_timedwait`` whose call stack
goes through ``PyEval_RestoreThread`` (a thread taking the GIL back), names the native function
that had given it up: the first resolved frame above ``PyEval_RestoreThread`` outside the Python
binary and past pybind11's ``gil_scoped_release`` (a PyTorch binding, a numpy loop, a lock's acquire). Prints, per releaser: waits, total
and mean wait, and the share of all GIL waits; per thread name: waits. Plain SQL on the export."""

from __future__ import annotations

import sqlite3
import sys
from collections import Counter, defaultdict


def main() -> None:
    path = sys.argv[1]
    prefix = sys.argv[2] if len(sys.argv) > 2 else ""
    db = sqlite3.connect(path)
    s = dict(db.execute("SELECT id, value FROM StringIds"))
    names = {tid: s.get(n, "?") for n, tid in db.execute("SELECT nameId, globalTid FROM ThreadNames")}
    waits = db.execute(
        "SELECT a.callchainId, a.end - a.start, a.globalTid FROM OSRT_API a JOIN StringIds n ON n.id = a.nameId "
        "WHERE n.value LIKE 'pthread_cond_timedwait%' AND a.callchainId IS NOT NULL").fetchall()
    chains: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    for cid, sym, mod, unres in db.execute(
            "SELECT id, symbol, module, unresolved FROM OSRT_CALLCHAINS ORDER BY id, stackDepth"):
        chains[cid].append((s.get(sym, "?"), s.get(mod, "?"), unres or 0))
    by = Counter()
    dur: Counter = Counter()
    per_thread = Counter()
    total = 0
    other = 0
    for cid, d, tid in waits:
        tname = names.get(tid, str(tid))
        if prefix and not tname.startswith(prefix):
            continue
        ch = chains.get(cid, [])
        at = next((i for i, (sym, _, _) in enumerate(ch) if sym in ("PyEval_RestoreThread", "PyGILState_Ensure")), None)
        if at is None:
            other += 1
            continue
        who = ch[at][0]
        for sym, mod, unres in ch[at + 1:]:
            if not unres and "python3" not in mod.rsplit("/", 1)[-1] and "gil_scoped" not in sym:
                who = f"{sym[:110]} [{mod.rsplit('/', 1)[-1]}]"
                break
        else:
            frames = [sym for sym, _, unres in ch[at + 1:at + 6] if not unres]
            who = "python: " + " < ".join(frames)
        by[who] += 1
        dur[who] += d
        per_thread[tname] += 1
        total += 1
    print(f"{path}: {total} GIL waits (pthread_cond_timedwait under PyEval_RestoreThread), "
          f"{sum(dur.values()) / 1e6:.1f} ms; {other} other timed waits")
    print(f"{'waits':>7} {'share':>6} {'total ms':>9} {'mean us':>8}  who gave the GIL up")
    for who, n in by.most_common(40):
        print(f"{n:>7} {n / max(total, 1):>6.1%} {dur[who] / 1e6:>9.1f} {dur[who] / n / 1e3:>8.1f}  {who}")
    print("per thread:", ", ".join(f"{k} {v}" for k, v in per_thread.most_common(12)))


if __name__ == "__main__":
    main()
