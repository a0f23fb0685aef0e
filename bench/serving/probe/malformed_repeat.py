"""Repeat tests/test_batching_gpu.py::test_a_malformed_query_changes_no_neighbour REPS times per
branch_streams value (argv: values, default 1 4): how often a well-formed neighbour of the
malformed query gets a result off eager, and by how much (one JSON line per run). RD_GROUPS (default
2) stream groups; SHARED=1 gives every group the same branch streams, as the runtime did before
each group had its own (to compare both in one call)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402
from test_batching_gpu import B, hammer, make_query, reference  # noqa: E402
from wdl_serving import WideDeep  # noqa: E402

from recsys_doctor.runtime import serve  # noqa: E402


def main() -> None:
    reps = int(os.environ.get("REPS", 8))
    groups = int(os.environ.get("RD_GROUPS", 2))
    shared = os.environ.get("SHARED") == "1"
    if shared:
        from recsys_doctor.runtime import serving

        made: dict = {}
        real = serving.branch_streams_for
        serving.branch_streams_for = lambda torch, n, device: made.setdefault(n, real(torch, n, device))
    torch.manual_seed(0)
    wdl = WideDeep(1000, hidden=128).cuda().eval()
    qs = [make_query(40 + k) for k in range(12)]
    ref = [reference(wdl, q) for q in qs]
    bad = (qs[0][0], qs[0][1], torch.arange(0, B * 4, 4) + 7)
    bad[2][5] = 10_000
    for b in [int(x) for x in (sys.argv[1:] or ["1", "4"])]:
        for rep in range(reps):
            with serve(wdl, qs[0], batching=True, groups=groups, branch_streams=b) as s:
                res, errs = hammer(lambda k: s(*(bad if k == 0 else qs[k])), 12, 30)
                st = s.stats()
            wrong = [(k, float((o - ref[k]).abs().max())) for k, o in res if k and float((o - ref[k]).abs().max()) > 1e-5]
            print(json.dumps({"branch_streams": b, "shared": shared, "groups": groups, "rep": rep, "errors": len(errs), "results": len(res),
                              "wrong": len(wrong), "max_err": max((e for _, e in wrong), default=0.0),
                              "neighbours": sorted({k for k, _ in wrong}),
                              "branch_fallbacks": len(st["branch_fallbacks"]),
                              "eager_buckets": st["batching"]["eager_buckets"],
                              "sizes": st["batching"]["batch_sizes"]}), flush=True)


if __name__ == "__main__":
    main()
