"""What a kernel does, judged from its name once per distinct name.

The trace model's ``kernels["name"]`` is a categorical: each regex below runs over its
categories (a few hundred names, even in a 10-million-row export) and the class of each
row is a gather of the category's class by its code. The classes are the ones the
recommender findings need: embedding lookups, optimizer kernels (foreach, fused),
memory-bound copy/cat kernels, FP32 GEMMs on CUDA cores, and communication (which the
others never claim).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..model import Trace
from ._comm import COMM_RE
from ._ops import cached

__all__ = ["OTHER", "COMM", "EMBEDDING", "OPT_FUSED", "OPT_FOREACH", "COPY", "FP32_GEMM", "CLASS_NAMES",
           "classify_names", "kernel_classes", "kernel_where", "offenders", "iterations"]

OTHER, COMM, EMBEDDING, OPT_FUSED, OPT_FOREACH, COPY, FP32_GEMM = range(7)
CLASS_NAMES = ("other", "communication", "embedding", "optimizer-fused", "optimizer-foreach", "copy", "fp32-gemm")

#: collectives and point-to-point transfers: the one rule of ``analyzers/_comm.py``
#: (``Options.comm_kernel_pattern``'s default), as small-grid and comm-exposed use it
_COMM = COMM_RE
#: embedding lookups and their backward: PyTorch EmbeddingBag / embedding kernels, FBGEMM
#: TBE (``split_embedding_*``, ``batched_embedding_*``) and its index checks
_EMBEDDING = re.compile(r"(?i)embedding|bounds_check_indices")
#: optimizers fused into one pass over params and state: PyTorch ``fused=True``
#: (``FusedAdamMathFunctor``, ``fused_sgd``), apex (``AdamFunctor``, ``LAMBStage``)
_OPT_FUSED = re.compile(r"(?i)fused\w*(?:adam|sgd|adagrad|lamb|lion|optim)|\b(?:Adam|AdamW|SGD|Adagrad|Lamb)Functor|"
                        r"LAMBStage")
#: foreach (``torch._foreach_*``): one launch per op over a list of tensors
_OPT_FOREACH = re.compile(r"multi_tensor_apply")
#: copies and concatenations done by kernels: memory-bound, no arithmetic
_COPY = re.compile(r"CatArrayBatchedCopy|direct_copy_kernel|\bcopy_kernel|copy_device_to_device|"
                   r"cat_array_batched_copy")
#: single-precision GEMMs on CUDA cores (cuBLAS ``*_sgemm_*``, cutlass ``simt_sgemm``,
#: ``xmma_gemm_f32f32_..._ffma``, ``gemmSN``) ...
_FP32_GEMM = re.compile(r"(?i)sgemm|xmma_gemm_f32f32_f32f32_f32|gemmSN_|gemmk1_kernel")
#: ... not tensor-core ones (TF32 ``s1688``/``s16816``, half, bf16, int8)
_TENSOR_CORE = re.compile(r"(?i)tf32|1688|16816|\bh\d*gemm|hgemm|bf16|f16|i8|imma|hmma")


def _classify(name: object) -> int:
    if not isinstance(name, str):
        return OTHER
    if _COMM.search(name):
        return COMM
    if _EMBEDDING.search(name):
        return EMBEDDING
    if _OPT_FUSED.search(name):
        return OPT_FUSED
    if _OPT_FOREACH.search(name):
        return OPT_FOREACH
    if _COPY.search(name):
        return COPY
    if _FP32_GEMM.search(name) and not _TENSOR_CORE.search(name):
        return FP32_GEMM
    return OTHER


def classify_names(names: pd.Series) -> np.ndarray:
    """The class (int8, one of the constants above) of each row of a kernel-name column:
    one regex pass per distinct name, then a gather by code."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        cats = np.array([_classify(c) for c in names.cat.categories] + [OTHER], dtype=np.int8)
        return cats[names.cat.codes.to_numpy()]
    return np.array([_classify(n) for n in names.to_numpy(object)], dtype=np.int8)


def kernel_durations(trace: Trace) -> np.ndarray:
    """Each kernel's duration (ns), in the order of ``trace.kernels``."""
    k = trace.kernels
    return (k["end"] - k["start"]).to_numpy(np.int64)


def kernel_classes(trace: Trace) -> np.ndarray:
    """:func:`classify_names` of ``trace.kernels["name"]``, built once per trace."""
    return cached(trace, "kernel_classes", lambda: classify_names(trace.kernels["name"]))


def kernel_where(trace: Trace, rows: np.ndarray, top: int, weights: np.ndarray | None = None) -> list[dict]:
    """``where`` of some kernels (``rows`` of ``trace.kernels``): the code regions (NVTX,
    ``record_function``) open on the launching thread, else the aten op, else the
    launching thread, else (no launch calls in the trace) the stream."""
    from ._attribution import any_region, attribute, where_shares
    from ._ops import launches
    from ._util import stream_label_codes, thread_label_codes

    k = trace.kernels
    w = None if weights is None else np.asarray(weights)
    j = launches(trace, ("kernel",))
    if len(j) and len(rows):
        mask = np.zeros(len(k), dtype=bool)
        mask[rows] = True
        pos = np.flatnonzero(mask[j["row"].to_numpy(np.int64)])
        if pos.size:
            js = j.iloc[pos]
            jw = None
            if w is not None:
                lookup = np.zeros(len(k), dtype=float)
                lookup[rows] = w
                jw = lookup[js["row"].to_numpy(np.int64)]
            for cpu_ops, key in ((False, "nvtx"), (True, "cpu_op")):
                reg = attribute(trace, js["pid"], js["tid"], js["api_start"], cpu_ops=cpu_ops)
                if any_region(reg):
                    return where_shares(reg, jw, key=key, top=top)
            return where_shares(thread_label_codes(trace, js["pid"], js["tid"]), jw, key="thread", top=top)
    return where_shares(stream_label_codes(k["pid"].to_numpy()[rows], k["device"].to_numpy()[rows],
                                           k["stream"].to_numpy()[rows]), w, key="stream", top=top)


def offenders(trace: Trace, rows: np.ndarray, dur: np.ndarray, top: int) -> list[dict]:
    """The ``top`` kernel names among ``rows`` by total time: name, count, total and median
    us (summed per category code: no string per row)."""
    from ._util import r

    if not len(rows):
        return []
    names = trace.kernels["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):
        codes, cats = names.cat.codes.to_numpy()[rows].astype(np.int64), names.cat.categories
    else:
        codes, cats = pd.factorize(names.to_numpy(object)[rows], use_na_sentinel=True)
    d = dur[rows]
    shift = codes + 1  # code -1 (missing name) -> 0
    count = np.bincount(shift)
    total = np.bincount(shift, weights=d)
    out = []
    for c in np.argsort(-total, kind="stable")[:top]:
        if not count[c]:
            break
        name = None if c == 0 else str(cats[c - 1])
        out.append({"name": name, "count": int(count[c]), "total_us": r(total[c] / 1000, 3),
                    "median_us": r(float(np.median(d[shift == c])) / 1000, 3)})
    return out


def iterations(trace: Trace) -> tuple[int | None, str]:
    """How many iterations (steps, queries) the trace holds, and how that is known: the
    ``ProfilerStep#N`` ranges where there are some, else the greatest common divisor of
    the per-name kernel counts (every kernel of a repeated model runs a multiple of the
    iteration count; names seen once, warm-up or set-up, are left out); None below 2."""
    from ._util import str_contains, take_str

    rg = trace.ranges
    if len(rg):  # (Kineto may repeat a step as a GPU annotation: count distinct names)
        n = len(set(take_str(rg["name"], np.flatnonzero(str_contains(rg["name"], r"^ProfilerStep#\d+$")))))
        if n:
            return n, "ProfilerStep ranges"
    k = trace.kernels
    if not len(k):
        return None, ""
    codes = k["name"].cat.codes.to_numpy() if isinstance(k["name"].dtype, pd.CategoricalDtype) else \
        pd.factorize(k["name"])[0]
    counts = np.bincount(codes[codes >= 0])
    counts = counts[counts >= 2]
    g = int(np.gcd.reduce(counts)) if counts.size else 0
    return (g, "greatest common divisor of the kernel counts per name") if g >= 2 else (None, "")
