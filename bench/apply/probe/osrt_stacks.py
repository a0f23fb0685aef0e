"""The OS-runtime waits of an nsys export with backtraces, for a trace whose GIL waits the loader
could not name (session 28: 0 named on the H200): ``python bench/apply/probe/osrt_stacks.py
TRACE.sqlite [N]``. Prints the waits by call name for all threads, then the N most common call
stacks of ``pthread_cond_timedwait`` / ``pthread_mutex_lock`` (their first 12 frames, symbol and
module), with counts."""

import collections
import sqlite3
import sys

con = sqlite3.connect(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
rows = con.execute("SELECT s.value, count(*), sum(o.end - o.start) FROM OSRT_API o JOIN StringIds s ON s.id = o.nameId "
                   "GROUP BY s.value ORDER BY 2 DESC LIMIT 15").fetchall()
for name, k, ns in rows:
    print(f"{k:8d} {ns / 1e6:9.1f} ms  {name}")
cols = [r[1] for r in con.execute("PRAGMA table_info(OSRT_API)")]
print("OSRT_API columns:", cols)
if "callchainId" not in cols:
    sys.exit()
chains = collections.Counter(r[0] for r in con.execute(
    "SELECT o.callchainId FROM OSRT_API o JOIN StringIds s ON s.id = o.nameId "
    "WHERE s.value IN ('pthread_cond_timedwait', 'pthread_mutex_lock', 'pthread_cond_wait')"))
print(len(chains), "distinct stacks;", sum(chains.values()), "waits;", chains.get(None, 0), "without a stack")
for cid, k in chains.most_common(n):
    if cid is None:
        continue
    fr = con.execute("SELECT s.value, m.value FROM OSRT_CALLCHAINS c JOIN StringIds s ON s.id = c.symbol "
                     "JOIN StringIds m ON m.id = c.module WHERE c.id = ? ORDER BY c.stackDepth LIMIT 12", (cid,)).fetchall()
    print(f"-- {k} waits, stack {cid}")
    for sym, mod in fr:
        print(f"     {sym[:90]:<90} {mod.rsplit('/', 1)[-1]}")
