"""How queries combine into one batch, and back: the batching spec of a served model.

A query's tensor inputs each get one kind:

* ``rows``    - stacked on dim 0 (dense features ``[B, 13]``, per-row ids ``[B]``);
* ``indices`` - a 1-D EmbeddingBag index list, concatenated;
* ``offsets`` - the EmbeddingBag offsets of those indices (``[B]``, starting at 0,
  non-decreasing), concatenated with each query's offsets shifted by the indices of the
  queries before it.

:func:`infer_spec` reads the kinds off the example inputs where that is unambiguous and
says why not otherwise (declare them then: ``serve(..., batch_spec=[...])``).
:class:`BatchPlan` lays one query out as a block of a request-major staging buffer and
:meth:`BatchPlan.regroup` turns ``k`` such blocks into the model's batched arguments with
device-side copies (the same code eagerly, on the CPU, and inside a CUDA graph).
:func:`check_spec` runs the model eagerly on two different queries, one at a time and
batched, and refuses the spec when the split batched outputs differ.

Needs torch (CPU is enough); no CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import BadInputError
from ._policy import pack_layout

__all__ = ["KINDS", "infer_spec", "BatchPlan", "check_spec", "SpecRefused"]

KINDS = ("rows", "indices", "offsets")


class SpecRefused(BadInputError):
    """Batching does not hold for this model and these inputs (the message says why)."""


def _is_offsets(t: Any, rows: int) -> bool:
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype.is_complex or t.numel() != rows or rows == 0:
        return False
    return int(t[0]) == 0 and bool((t[1:] >= t[:-1]).all())


def infer_spec(tensors: Sequence[Any]) -> tuple[str, ...]:
    """The kind of each tensor input (see the module docstring); raises
    :class:`SpecRefused` naming the input that makes the spec ambiguous."""
    floats = [t for t in tensors if t.dtype.is_floating_point and t.dim() >= 1]
    if not floats:
        raise SpecRefused("no floating-point input tells the rows of a query; declare batch_spec")
    rows = int(floats[0].shape[0])
    kinds: list[str] = []
    for i, t in enumerate(tensors):
        if t.dim() == 0:
            raise SpecRefused(f"input tensor {i} is a scalar: it cannot be batched; declare batch_spec")
        if t.dtype.is_floating_point:
            if int(t.shape[0]) != rows:
                raise SpecRefused(f"input tensor {i} has {t.shape[0]} rows where the first float input has {rows}")
            kinds.append("rows")
        elif _is_offsets(t, rows):
            kinds.append("offsets")
        elif t.dim() == 1 and int(t.shape[0]) != rows:
            kinds.append("indices")
        elif int(t.shape[0]) == rows:
            kinds.append("rows")
        else:
            raise SpecRefused(f"input tensor {i} (shape {list(t.shape)}) is neither rows nor a 1-D index list")
    if "indices" not in kinds:  # sorted ids that start at 0 are rows when nothing is indexed by them
        return tuple("rows" if k == "offsets" else k for k in kinds)
    if kinds.count("offsets") != 1:
        raise SpecRefused(f"{kinds.count('offsets')} offsets candidates for the 1-D index inputs; declare batch_spec")
    return tuple(kinds)


@dataclass(frozen=True)
class _Leaf:
    kind: str
    dtype: Any
    shape: tuple[int, ...]
    offset: int  # byte offset inside a query's block


class BatchPlan:
    """One query's tensors as a block of a request-major staging buffer, and how ``k``
    blocks become the batched arguments.

    ``block`` bytes a query (256-aligned); ``tensors`` the example's tensor leaves;
    ``kinds`` from :func:`infer_spec` or declared. Raises :class:`SpecRefused` when the
    kinds do not fit the tensors."""

    def __init__(self, tensors: Sequence[Any], kinds: Sequence[str]) -> None:
        kinds = tuple(kinds)
        if len(kinds) != len(tensors):
            raise SpecRefused(f"batch_spec has {len(kinds)} kinds for {len(tensors)} input tensors")
        bad = [k for k in kinds if k not in KINDS]
        if bad:
            raise SpecRefused(f"unknown batch_spec kind {bad[0]!r} (kinds: {', '.join(KINDS)})")
        idx_len = {int(t.shape[0]) for t, k in zip(tensors, kinds) if k == "indices"}
        if kinds.count("offsets") > 1 or (kinds.count("offsets") == 1) != bool(idx_len):
            raise SpecRefused("batch_spec needs exactly one offsets input when there are indices inputs")
        if len(idx_len) > 1:
            raise SpecRefused(f"index inputs of different lengths {sorted(idx_len)} share one offsets input")
        for t, k in zip(tensors, kinds):
            if k != "rows" and t.dim() != 1:
                raise SpecRefused(f"a {k} input must be 1-D, got shape {list(t.shape)}")
        #: indices per query (what each later query's offsets are shifted by)
        self.shift = idx_len.pop() if idx_len else 0
        lay = pack_layout([(str(t.dtype), tuple(t.shape), t.element_size()) for t in tensors])
        self.block = lay.nbytes
        self.leaves = tuple(_Leaf(k, t.dtype, tuple(int(d) for d in t.shape), off)
                            for t, k, off in zip(tensors, kinds, lay.offsets))
        self.kinds = kinds

    def slot_views(self, buf: Any, slots: int) -> list[Any]:
        """Per-tensor views of ``slots`` query blocks of the uint8 buffer ``buf``, query by
        query (what ``torch._foreach_copy_`` packs ``slots`` queries into)."""
        out = []
        for j in range(slots):
            base = j * self.block
            for lf in self.leaves:
                nb = _nbytes(lf)
                out.append(buf[base + lf.offset:base + lf.offset + nb].view(lf.dtype).view(lf.shape))
        return out

    def regroup(self, buf: Any, k: int, shifts: Any = None) -> list[Any]:
        """The batched tensors of the first ``k`` query blocks of the uint8 buffer ``buf``:
        each input's ``k`` copies concatenated on dim 0 (a copy where ``k > 1``), offsets
        shifted by ``shifts`` (``arange(k) * shift`` on ``buf``'s device, made by the
        caller outside any graph capture)."""
        import torch

        out = []
        for lf in self.leaves:
            item = torch.empty((), dtype=lf.dtype).element_size()
            typed = buf.view(lf.dtype)
            inner = _contiguous_strides(lf.shape)
            v = typed.as_strided((k, *lf.shape), (self.block // item, *inner), lf.offset // item)
            if lf.kind == "offsets" and k > 1:
                v = v + shifts[:k, None]
            out.append(v.reshape((k * lf.shape[0], *lf.shape[1:])))
        return out


def _nbytes(lf: _Leaf) -> int:
    import math

    import torch

    return math.prod(lf.shape) * torch.empty((), dtype=lf.dtype).element_size()


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


def check_spec(model: Any, rebuild: Any, tensors: Sequence[Any], plan: BatchPlan, device: Any,
               atol: float = 1e-5, rtol: float = 1e-4) -> tuple[Any, tuple[int, ...]]:
    """Run ``model`` eagerly on the example and on a :func:`perturbed` second query, one
    at a time and batched through ``plan`` (on ``device``); returns the outputs' tree spec
    and each output leaf's rows per query. Raises :class:`SpecRefused` when an output has
    no rows to split or the split batched outputs differ from the single runs.
    ``rebuild(tensor_leaves)`` gives the model's positional arguments."""
    import torch
    from torch.utils._pytree import tree_flatten

    second = perturbed(tensors, plan.kinds)
    with torch.no_grad():
        singles = [tree_flatten(model(*rebuild([t.to(device) for t in q]))) for q in (tensors, second)]
        buf = torch.zeros(2 * plan.block, dtype=torch.uint8, device=device)
        for dst, src in zip(plan.slot_views(buf, 2), [*tensors, *second]):
            dst.copy_(src)
        shifts = torch.arange(2, device=device) * plan.shift
        batched, spec = tree_flatten(model(*rebuild(plan.regroup(buf, 2, shifts))))
    (one, spec1), (two, _) = singles
    if spec != spec1 or len(batched) != len(one):
        raise SpecRefused("the batched model returns another output structure than one query does")
    rows = []
    for i, (b, a, c) in enumerate(zip(batched, one, two)):
        if not isinstance(b, torch.Tensor) or b.dim() == 0 or a.dim() == 0 or b.shape[0] != 2 * a.shape[0]:
            raise SpecRefused(f"output {i} does not grow by rows with the batch (no per-query rows to split)")
        want = torch.cat([a, c]).to(b.device)
        if want.shape != b.shape or not torch.allclose(b, want, atol=atol, rtol=rtol, equal_nan=True):
            err = float((b.double() - want.double()).abs().max()) if want.shape == b.shape else float("nan")
            raise SpecRefused(f"batching changes output {i} (max abs error {err:.3g} on two queries)")
        rows.append(int(a.shape[0]))
    return spec, tuple(rows)


def perturbed(tensors: Sequence[Any], kinds: Sequence[str], seed: int = 7) -> list[Any]:
    """A second query unlike the example, valid wherever the example is: rows reversed
    (floating-point ones also halved and moved by 1/8, so batch statistics differ),
    index values permuted (each stays an index the example used), offsets kept."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for t, k in zip(tensors, kinds):
        if k == "rows" and t.dtype.is_floating_point:
            out.append((t.flip(0) * 0.5 + 0.125).contiguous())
        elif k == "rows":
            out.append(t.flip(0).contiguous())
        elif k == "indices":
            out.append(t[torch.randperm(t.numel(), generator=g).to(t.device)].contiguous())
        else:
            out.append(t.clone())
    return out
