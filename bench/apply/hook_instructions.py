"""Instructions the script hook's steady path costs a query, counted by callgrind: ``python
bench/apply/hook_instructions.py [--what query|model] [--queries 2000] [TREE ...]``.

``cpu_hook_path.py`` times the hook's Python on the CPU, but a shared dev box's timings drift by
50% from one run to the next. Counted instructions do not. So each TREE (a checkout, or a `git
archive` of one; default: this one) runs under ``valgrind --tool=callgrind --instr-atstart=no``
with ``PYTHONPATH=TREE``. Its recsys_doctor sets up the thread graph of ``cpu_hook_path.py``
(``--pageable``, 3 inputs, as ``dlrm_numpy_serve.py`` copies them) and runs 50 warm-up queries.
Instrumentation is switched on (``callgrind_control -i on``) for ``--queries`` queries and off
after. Printed: instructions a query. ``--what query`` counts the script's whole query (three
``torch.from_numpy(a).cuda()`` and the model call); ``--what model`` the model call alone. The
trees run side by side, one process each. The valgrind start-up takes ~3 minutes a process.
Needs valgrind (``callgrind_control`` beside it)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def region(tree: str, what: str, n: int) -> None:
    """In the process valgrind runs: the set-up, then ``n`` queries with instrumentation on."""
    sys.path.insert(0, str(Path(tree) / "bench" / "apply"))
    import torch
    import cpu_hook_path as h

    torch.set_num_threads(1)
    model, src, _tg = h.setup(3, True)
    from recsys_doctor.applying._autoapply._common import _tls

    st = _tls.copies
    dense, ids, offs = (t.numpy().copy() for t in src)

    def ctl(switch: str) -> None:
        subprocess.run(["callgrind_control", "-i", switch, str(os.getpid())], capture_output=True, check=False)

    with torch.inference_mode():
        if what == "model":
            a, b, c = torch.from_numpy(dense).cuda(), [torch.from_numpy(ids).cuda()], torch.from_numpy(offs).cuda()

            def query() -> None:
                st.n, st.pending, st.slot_n = 3, True, 0  # (the three copies made: the model call's state)
                model(a, b, c)
        else:
            def query() -> None:
                model(torch.from_numpy(dense).cuda(), [torch.from_numpy(ids).cuda()], torch.from_numpy(offs).cuda())
        for _ in range(50):
            query()
        ctl("on")
        for _ in range(n):
            query()
        ctl("off")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="*", default=[str(HERE.parents[1])])
    ap.add_argument("--what", choices=("query", "model"), default="query")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--region", help=argparse.SUPPRESS)  # (the tree, inside valgrind)
    a = ap.parse_args()
    if a.region:
        region(a.region, a.what, a.queries)
        return
    procs = []
    for tree in a.trees:
        tree = str(Path(tree).resolve())
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null", sys.executable,
               __file__, "--region", tree, "--what", a.what, "--queries", str(a.queries)]
        env = dict(os.environ, PYTHONPATH=tree)
        procs.append((tree, subprocess.Popen(cmd, env=env, cwd="/tmp", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             text=True)))
    for tree, p in procs:
        out = p.communicate()[0]
        m = re.search(r"Collected\s*:\s*(\d+)", out)
        if p.returncode != 0 or m is None:
            print(f"{tree}: no count (exit {p.returncode}): {out.strip().splitlines()[-1:]}")
            continue
        print(f"{tree}: {int(m.group(1)) / a.queries / 1000:.1f}k instructions a {a.what} ({a.queries} of them)")


if __name__ == "__main__":
    main()
