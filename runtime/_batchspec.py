"""How queries combine into one batch, and back: the batching spec of a served model.

A query's tensor inputs each get one kind:

* ``rows``    - stacked on dim 0 (dense features ``[B, 13]``, per-row ids ``[B]``);
* ``indices`` - a 1-D EmbeddingBag index list, concatenated;
* ``offsets`` - the EmbeddingBag offsets of those indices (``[B]``, starting at 0,
  non-decreasing), concatenated with each query's offsets shifted by the indices of the
  queries before it;
* ``offsets_total`` - the same with a trailing total (``include_last_offset=True``,
  ``[B + 1]`` ending at the index count): shifted likewise, then ONE total;
* ``jagged_lengths`` / ``jagged_offsets`` and ``jagged_values`` - a KeyedJaggedTensor-style
  feature (F keys, key-major), merged the way TorchRec concatenates KJTs (:mod:`._jagged`).

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

from ..errors import BadInputError, first_line
from ._jagged import JAGGED_KINDS, JaggedShape, gather_index, jagged_shape, merge_offsets_total, merged_lengths, \
    own_offsets, perturb_jagged, query_lengths
from ._policy import pack_layout

__all__ = ["KINDS", "infer_spec", "BatchPlan", "check_spec", "SpecRefused"]

KINDS = ("rows", "indices", "offsets", "offsets_total", *JAGGED_KINDS)
_OFFSETS = ("offsets", "offsets_total")


class SpecRefused(BadInputError):
    """Batching does not hold for this model and these inputs (the message says why)."""


def _is_offsets(t: Any, n: int) -> bool:
    """``t`` could be offsets of ``n`` entries: 1-D integers from 0, never decreasing."""
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype.is_complex or t.numel() != n or n == 0:
        return False
    return int(t[0]) == 0 and bool((t[1:] >= t[:-1]).all())


def infer_spec(tensors: Sequence[Any]) -> tuple[str, ...]:
    """The kind of each tensor input (see the module docstring); raises
    :class:`SpecRefused` naming the input that makes the spec ambiguous. Jagged features
    are never inferred (their lengths look like an index list): declare them."""
    floats = [t for t in tensors if t.dtype.is_floating_point and t.dim() >= 1]
    if not floats:
        raise SpecRefused("no floating-point input tells the rows of a query; declare batch_spec")
    rows = int(floats[0].shape[0])
    kinds = [_infer_one(i, t, rows) for i, t in enumerate(tensors)]
    idx_len = {int(t.shape[0]) for t, k in zip(tensors, kinds) if k == "indices"}
    # rows + 1 sorted entries from 0 are a trailing-total offsets only when they end at
    # the index count; otherwise they are one more index list
    kinds = [("offsets_total" if idx_len == {int(t[-1])} else "indices") if k == "total?" else k
             for t, k in zip(tensors, kinds)]
    if "indices" not in kinds:  # sorted ids that start at 0 are rows when nothing is indexed by them
        return tuple("rows" if k == "offsets" else k for k in kinds)
    n_off = sum(k in _OFFSETS for k in kinds)
    if n_off != 1:
        raise SpecRefused(f"{n_off} offsets candidates for the 1-D index inputs; declare batch_spec "
                          "(a jagged feature: jagged_lengths or jagged_offsets and jagged_values)")
    return tuple(kinds)


def _infer_one(i: int, t: Any, rows: int) -> str:
    if t.dim() == 0:
        raise SpecRefused(f"input tensor {i} is a scalar: it cannot be batched; declare batch_spec")
    if t.dtype.is_floating_point:
        if int(t.shape[0]) != rows:
            raise SpecRefused(f"input tensor {i} has {t.shape[0]} rows where the first float input has {rows}")
        return "rows"
    if _is_offsets(t, rows):
        return "offsets"
    if _is_offsets(t, rows + 1):
        return "total?"
    if t.dim() == 1 and int(t.shape[0]) != rows:
        return "indices"
    if int(t.shape[0]) == rows:
        return "rows"
    raise SpecRefused(f"input tensor {i} (shape {list(t.shape)}) is neither rows nor a 1-D index list")


def _index_count(tensors: Sequence[Any], kinds: tuple[str, ...]) -> int:
    """The index count of a query (0 without indices); raises :class:`SpecRefused` unless
    there is exactly one offsets input (plain or with a total) for index inputs of one
    length, and a total that ends at that count."""
    idx_len = {int(t.shape[0]) for t, k in zip(tensors, kinds) if k == "indices"}
    offs = [(t, k) for t, k in zip(tensors, kinds) if k in _OFFSETS]
    if len(offs) > 1 or bool(offs) != bool(idx_len):
        raise SpecRefused("batch_spec needs exactly one offsets or offsets_total input when there are indices inputs")
    if len(idx_len) > 1:
        raise SpecRefused(f"index inputs of different lengths {sorted(idx_len)} share one offsets input")
    if not idx_len:
        return 0
    n = idx_len.pop()
    t, k = offs[0]
    if k == "offsets_total" and (t.numel() < 2 or int(t[0]) != 0 or int(t[-1]) != n):
        raise SpecRefused(f"offsets_total must run from 0 to the {n} indices of a query (include_last_offset), "
                          f"the example's runs from {int(t[0]) if t.numel() else '-'} to {int(t[-1]) if t.numel() else '-'}")
    return n


def _query_rows(tensors: Sequence[Any], kinds: tuple[str, ...]) -> int | None:
    """The rows of a query: a rows input's dim 0, else the offsets' length (less the total)."""
    for want, less in (("rows", 0), ("offsets", 0), ("offsets_total", 1)):
        for t, k in zip(tensors, kinds):
            if k == want:
                return int(t.shape[0]) - less
    return None


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
        for t, k in zip(tensors, kinds):
            if k != "rows" and t.dim() != 1:
                raise SpecRefused(f"a {k} input must be 1-D, got shape {list(t.shape)}")
        #: indices per query (what each later query's offsets are shifted by)
        self.shift = _index_count(tensors, kinds)
        #: the jagged feature of a query (keys, rows, values per query), or None
        self.jagged: JaggedShape | None = jagged_shape(tensors, kinds, _query_rows(tensors, kinds), SpecRefused)
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
        kept inside their own query's indices (:func:`~._jagged.own_offsets`, for a lone
        query too) and shifted by ``shifts`` (``arange(k) * shift`` on ``buf``'s device,
        made by the caller outside any graph capture; made here when not given), jagged
        features merged key-major (:mod:`._jagged`). Static shapes and no host reads: it
        runs inside a CUDA graph."""
        views = [self._view(buf, lf, k) for lf in self.leaves]
        if k == 1 and set(self.kinds) <= {"rows", "indices"}:
            return [v.reshape(lf.shape) for v, lf in zip(views, self.leaves)]
        if shifts is None:
            import torch

            shifts = torch.arange(k, device=buf.device) * self.shift
        js, lens, gather = self.jagged, None, None
        if js is not None:
            lens = query_lengths(next(v for v, lf in zip(views, self.leaves)
                                      if lf.kind in ("jagged_lengths", "jagged_offsets")), js)
            gather = gather_index(lens, js.values)
        out = []
        for lf, v in zip(self.leaves, views):
            if lf.kind == "offsets":
                out.append((own_offsets(v, self.shift) + shifts[:k, None]).to(lf.dtype).reshape(-1))
            elif lf.kind == "offsets_total":
                out.append(merge_offsets_total(v, k, shifts, self.shift))
            elif lf.kind in ("jagged_lengths", "jagged_offsets"):
                out.append(merged_lengths(lens, lf.dtype, lf.kind == "jagged_offsets"))
            elif lf.kind == "jagged_values":
                out.append(v.reshape(-1)[gather])
            else:
                out.append(v.reshape((k * lf.shape[0], *lf.shape[1:])))
        return out

    def _view(self, buf: Any, lf: _Leaf, k: int) -> Any:
        """Leaf ``lf`` of the first ``k`` blocks of ``buf`` as one ``[k, *shape]`` view."""
        import torch

        item = torch.empty((), dtype=lf.dtype).element_size()
        strides = (self.block // item, *_contiguous_strides(lf.shape))
        return buf.view(lf.dtype).as_strided((k, *lf.shape), strides, lf.offset // item)


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

    second = perturbed(tensors, plan.kinds, jagged=plan.jagged)
    with torch.no_grad():
        one, spec1 = tree_flatten(model(*rebuild([t.to(device) for t in tensors])))
        two, _ = _refused_on_error("a second query (the example perturbed)",
                                   lambda: tree_flatten(model(*rebuild([t.to(device) for t in second]))))
        buf = torch.zeros(2 * plan.block, dtype=torch.uint8, device=device)
        for dst, src in zip(plan.slot_views(buf, 2), [*tensors, *second]):
            dst.copy_(src)
        shifts = torch.arange(2, device=device) * plan.shift
        batched, spec = _refused_on_error("the batch of two queries",
                                          lambda: tree_flatten(model(*rebuild(plan.regroup(buf, 2, shifts)))))
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


def _refused_on_error(what: str, run: Any) -> Any:
    """``run()``, its exception turned into :class:`SpecRefused` naming ``what`` failed (a
    spec that feeds the model inputs it cannot take does not hold)."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - the reason batching is refused
        raise SpecRefused(f"the model fails on {what}: {first_line(e)}") from e


def perturbed(tensors: Sequence[Any], kinds: Sequence[str], seed: int = 7,
              jagged: JaggedShape | None = None) -> list[Any]:
    """A second query unlike the example, valid wherever the example is: rows reversed
    (floating-point ones also halved and moved by 1/8, so batch statistics differ),
    index values permuted (each stays an index the example used), offsets (plain or with
    a total) kept; a ``jagged`` feature's lengths permuted over the rows and its values
    within each key (:func:`._jagged.perturb_jagged`)."""
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
    if jagged is not None:
        for i, t in perturb_jagged(tensors, kinds, jagged, g).items():
            out[i] = t
    return out
