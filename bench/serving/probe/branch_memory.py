"""GPU memory a served wide&deep model (examples/wdl_serving.py, vocab 100k, 256 rows a query)
holds after serve(..., batching=True), per group count and branch_streams (each group has its
own extra branch streams, and PyTorch's cuBLAS workspace is one buffer per stream): PyTorch's
reserved bytes and the device's used bytes (cuMemGetInfo) over the state before serve().
One JSON line per configuration; each in a fresh process (argv: groups branch_streams)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

import torch  # noqa: E402
from wdl_serving import WideDeep, host_query  # noqa: E402

from recsys_doctor.runtime import serve  # noqa: E402


def main() -> None:
    groups, b = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    model = WideDeep(100_000).cuda().eval()
    q = host_query(256, 100_000)
    with torch.no_grad():
        model(q[0].cuda(), [t.cuda() for t in q[1]], q[2].cuda())  # the eager path's own workspace first
    torch.cuda.synchronize()
    r0, (f0, _) = torch.cuda.memory_reserved(), torch.cuda.mem_get_info()
    with serve(model, q, groups=groups, batching=True, branch_streams=b) as s:
        torch.cuda.synchronize()
        r1, (f1, _) = torch.cuda.memory_reserved(), torch.cuda.mem_get_info()
        fb = len(s.stats()["branch_fallbacks"])
    print(json.dumps({"groups": groups, "branch_streams": b, "reserved_mib": round((r1 - r0) / 2**20, 1),
                      "device_used_mib": round((f0 - f1) / 2**20, 1), "branch_fallbacks": fb}), flush=True)


if __name__ == "__main__":
    main()
