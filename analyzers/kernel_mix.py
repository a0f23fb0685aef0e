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
from ._framework import framework, idiom
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

#: what each note says: its title, and per framework (:func:`_fix`) the fix and the action
_TITLE = {
    "copy-kernels": "{share:.0%} of kernel time is copies and concatenations ({n:,} copy/cat kernels)",
    "fp32-gemm": "{share:.0%} of kernel time is FP32 GEMMs on CUDA cores ({n:,} kernels)",
}
_PYTORCH_COPIES = (
    "Keep tensors in the layout and dtype the next op wants: build the concatenated (e.g. pooled "
    "embedding) output once into a preallocated buffer instead of torch.cat per step, drop "
    ".contiguous()/.to() round trips, and let torch.compile fuse the copies into their consumers.",
    "remove the per-step cat/contiguous copies (preallocate, or fuse with torch.compile)")


def _fix(trace: Trace, fid: str) -> tuple[str, str]:
    """The fix and the action of note ``fid``, in the words of the framework that made ``trace``."""
    pytorch = framework(trace)["name"] == "pytorch"
    if fid == "copy-kernels":
        if pytorch:
            return _PYTORCH_COPIES
        return ("Keep tensors in the layout and dtype the next op wants: build a concatenated output once in a "
                "preallocated buffer instead of copying it every step, drop layout and dtype round trips, and fuse "
                f"the copies into their consumers ({idiom(trace, 'fuse')}).",
                "remove the per-step concatenation and layout copies (preallocate, or fuse)")
    return ("On Ampere or newer GPUs let the GEMMs use tensor cores: " + idiom(trace, "tensor_cores"),
            "enable TF32 (set_float32_matmul_precision('high')) or bf16 autocast for the dense layers" if pytorch
            else "let the dense layers' GEMMs use tensor cores (TF32 or bfloat16)")


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
        fix, action = _fix(trace, fid)
        f = report(res, fid, title=_TITLE[fid].format(share=share, n=int(rows.size)), evidence=ev,
                   where=kernel_where(trace, rows, options.top_n, dur[rows]), recommendation=fix, action=action)
        finish(f, 0, steady_window(trace, options), options)
    return res
