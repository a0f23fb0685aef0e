"""Who hands the GIL off: ``python bench/apply/gil_waits.py TRACE.sqlite [THREAD_TEXT]`` reads
an Nsight Systems export made with OS-runtime backtraces (``profile --gil-stacks``, or
``bench/apply/hostprof.sh bt_dlrm``) through recsys-doctor's loader, whose ``os_waits["gil_by"]``
names, for every wait in which a thread takes the GIL back, the native call that had given it up
(``recsys_doctor/loaders/_nsys_gil.py``). Prints every releaser (the ``gil-handoffs`` finding
shows the top ones): waits, share, total and mean wait; and the waits per thread (only the
threads whose label holds THREAD_TEXT, where given).

The tables in ``results/gil_waits_h100/`` were printed by this script's first version (commit
7d54aea), which named the releaser by its full symbol and counted a wait taken inside an op
(``PyInterpreterVTable::incref``) under that hook rather than under the op's binding."""

from __future__ import annotations

import sys

from recsys_doctor.loaders import load
from recsys_doctor.analyzers._util import thread_labels


def main() -> None:
    path = sys.argv[1]
    prefix = sys.argv[2] if len(sys.argv) > 2 else ""
    trace = load(path)
    ow = trace.os_waits
    gil = ow[ow["gil_by"].notna()].copy() if len(ow) else ow
    if prefix and len(gil):
        names = thread_labels(trace, gil["pid"].to_numpy(), gil["tid"].to_numpy())
        gil = gil[[prefix in n for n in names]]
    gil["ns"] = gil["end"] - gil["start"]
    by = gil.groupby(gil["gil_by"].astype(str))["ns"].agg(["size", "sum"]).sort_values("sum", ascending=False)
    total = int(by["size"].sum())
    print(f"{path}: {total} GIL waits, {by['sum'].sum() / 1e6:.1f} ms; {len(ow) - len(gil)} other lock waits")
    print(f"{'waits':>7} {'share':>6} {'total ms':>9} {'mean us':>8}  who gave the GIL up")
    for who, row in by.iterrows():
        n = int(row["size"])
        print(f"{n:>7} {n / max(total, 1):>6.1%} {row['sum'] / 1e6:>9.1f} {row['sum'] / n / 1e3:>8.1f}  {who}")
    per = gil.groupby("tid").size().sort_values(ascending=False)
    print("per thread:", ", ".join(f"tid {t} {n}" for t, n in per.head(12).items()))


if __name__ == "__main__":
    main()
