"""Kernel-mix notes: GPU time in kernels that a cheaper form of the same work would cut.

* ``copy-kernels``: memory-bound copy and concatenation kernels (``CatArrayBatchedCopy*``,
  ``direct_copy_kernel`` - ``torch.cat``, ``.contiguous()``, dtype casts, ``.to()`` on
  device): no arithmetic, only bytes moved; often a layout the model could keep.
* ``fp32-gemm``: single-precision GEMMs on CUDA cores (``volta_sgemm_*``,
  ``cutlass_*_simt_sgemm_*``, ``xmma_gemm_f32f32_..._ffma``) where the GPU has TF32 or
  bf16 tensor cores (Ampere and newer), several times faster.

Each is reported as a note - no recoverable time: how much a cast or a removed copy wins
depends on the model - when its kernels take at least ``Options.kernel_mix_note_share``
of kernel time. Communication kernels never count here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._kernel_classes import COPY, FP32_GEMM, kernel_classes, kernel_durations, kernel_where, offenders
from ._recoverable import finish, report, steady_window
from ._util import r

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "copy-kernels": {
        "count": "number", "kernel_time_us": "us", "kernels": "number", "median_us": "us",
        "time_share": "share", "time_us": "us", "total_us": "us",
    },
    "fp32-gemm": {
        "count": "number", "kernel_time_us": "us", "kernels": "number", "median_us": "us",
        "time_share": "share", "time_us": "us", "total_us": "us",
    },
}

_TEXT = {
    "copy-kernels": (
        "{share:.0%} of kernel time is copies and concatenations ({n:,} copy/cat kernels)",
        "Keep tensors in the layout and dtype the next op wants: build the concatenated (e.g. pooled "
        "embedding) output once into a preallocated buffer instead of torch.cat per step, drop "
        ".contiguous()/.to() round trips, and let torch.compile fuse the copies into their consumers.",
        "remove the per-step cat/contiguous copies (preallocate, or fuse with torch.compile)"),
    "fp32-gemm": (
        "{share:.0%} of kernel time is FP32 GEMMs on CUDA cores ({n:,} kernels)",
        "On Ampere or newer GPUs let the GEMMs use tensor cores: torch.backends.cuda.matmul.allow_tf32 = True "
        "(torch.set_float32_matmul_precision('high')), or run the dense layers under "
        "torch.autocast(dtype=torch.bfloat16); on Volta, float16 autocast.",
        "enable TF32 (set_float32_matmul_precision('high')) or bf16 autocast for the dense layers"),
}


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    if not len(trace.kernels):
        return AnalysisResult(name="kernel-mix", data={"kernels": 0})
    res = AnalysisResult(name="kernel-mix")
    cls = kernel_classes(trace)
    dur = kernel_durations(trace)
    total = int(dur.sum())
    res.data = {"kernel_time_us": r(total / 1000, 3)}
    for fid, c in (("copy-kernels", COPY), ("fp32-gemm", FP32_GEMM)):
        rows = np.flatnonzero(cls == c)
        t = int(dur[rows].sum())
        share = t / total if total else 0.0
        ev: dict[str, Any] = {"kernels": int(rows.size), "time_us": r(t / 1000, 3), "time_share": r(share)}
        res.data[fid] = ev
        if not rows.size or share < options.kernel_mix_note_share:
            continue
        ev = dict(ev, offenders=offenders(trace, rows, dur, options.top_n))
        if fid == "fp32-gemm" and len(trace.devices):
            ev["devices"] = sorted({str(n) for n in trace.devices["name"].dropna()})
        title, fix, action = _TEXT[fid]
        f = report(res, fid, title=title.format(share=share, n=int(rows.size)), evidence=ev,
                   where=kernel_where(trace, rows, options.top_n, dur[rows]), recommendation=fix, action=action)
        finish(f, 0, steady_window(trace, options), options)
    return res
