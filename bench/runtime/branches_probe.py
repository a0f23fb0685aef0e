"""Branch-parallel capture (runtime/_branches.py) against the one-stream capture: GPU time of
one replay alone and of 4 graphs replayed side by side on 4 streams, per model and batch, and
the largest difference between their outputs. Prints one JSON line per case.

    python bench/runtime/branches_probe.py            # on a GPU machine
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "examples" / "scripts")]

from recsys_doctor.runtime._branches import BranchCapture  # noqa: E402


def wdl(rows):
    from wdl_serving import WideDeep, host_query

    m = WideDeep(100_000).cuda().eval()
    d, idx, offs = host_query(rows, 100_000)
    return m, (d.cuda(), [t.cuda() for t in idx], offs.cuda())


def dlrm(rows):
    import dlrm_numpy_serve as D

    m = D.DLRM(100_000).cuda().eval()
    dense, ids = D.make_request(0, 1, rows, 100_000)
    return m, (torch.from_numpy(dense).cuda(), [torch.from_numpy(np.ascontiguousarray(r)).cuda() for r in ids],
               torch.arange(rows, device="cuda"))


def mmoe(rows):
    import mmoe_ranker as M

    m = M.MMoE(200_000).cuda().eval()
    ids, dense = M.make_request(0, 1, rows, 200_000)
    return m, (torch.from_numpy(ids).cuda(), torch.from_numpy(dense).cuda())


def capture(model, args, extra):
    s = torch.cuda.Stream()
    side = [torch.cuda.Stream() for _ in range(extra)]
    with torch.no_grad(), torch.cuda.stream(s):
        model(*args)
        if extra:
            with BranchCapture(side):
                model(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g, stream=s):
        if extra:
            with BranchCapture(side) as mode:
                out = model(*args)
            info = {"branches": mode.branches, "joins": mode.joins}
        else:
            out = model(*args)
            info = {}
    torch.cuda.synchronize()
    return g, out, info


def flat(out):
    return torch.cat([o.float().reshape(-1) for o in (out if isinstance(out, (tuple, list)) else [out])])


def timed(fn, reps):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


def main():
    for name, make, rows_list in (("wdl", wdl, (256, 2048, 8192)), ("dlrm", dlrm, (256, 2048)), ("mmoe", mmoe, (200, 1600))):
        for rows in rows_list:
            torch.manual_seed(0)
            model, args = make(rows)
            ref_g, ref_out, _ = capture(model, args, 0)
            ref_g.replay()
            torch.cuda.synchronize()
            ref = flat(ref_out).clone()
            for extra in (0, 1, 3, 7):
                gs = [capture(model, args, extra) for _ in range(4)]
                g, out, info = gs[0]
                g.replay()
                torch.cuda.synchronize()
                err = float((flat(out) - ref).abs().max())
                alone = timed(g.replay, 200)
                streams = [torch.cuda.Stream() for _ in range(4)]

                def four(gs=gs, streams=streams):
                    for st, (gg, _, _) in zip(streams, gs):
                        with torch.cuda.stream(st):
                            gg.replay()
                    for st in streams:
                        torch.cuda.current_stream().wait_stream(st)

                side4 = timed(four, 50) / 4
                print(json.dumps({"model": name, "rows": rows, "streams": extra + 1, "alone_us": round(alone, 1),
                                  "four_side_by_side_us_per_graph": round(side4, 1), "max_abs_diff": err, **info}),
                      flush=True)
                del gs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
