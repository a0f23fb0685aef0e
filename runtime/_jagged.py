"""Offsets with a trailing total and jagged (KeyedJaggedTensor-style) features: how ``k``
queries of these kinds merge into one batch, with static-shape, sync-free torch ops only
(the same code eagerly on the CPU and inside a CUDA graph), how a plan checks them on the
example, and how :func:`~._batchspec.perturbed` varies them.

* ``offsets_total`` - EmbeddingBag offsets with a trailing total
  (``include_last_offset=True``): ``B + 1`` entries, from 0 up to the query's index count
  ``V``. Batched: each query's first ``B`` entries shifted by ``j * V``, then ONE total
  ``k * V``.
* ``jagged_lengths`` - a KeyedJaggedTensor's ``lengths``: ``F * B`` entries, key-major
  (key 0's lengths of rows 0..B-1, then key 1's, ...). Batched as TorchRec concatenates
  KJTs along the batch: key ``f``'s lengths of query 0, of query 1, ..., then key ``f+1``.
* ``jagged_offsets`` - the same feature as a KJT's ``offsets`` (``F * B + 1`` entries, the
  running sum of the lengths from 0 to ``V``): merged like the lengths, then summed again.
* ``jagged_values`` - the KJT's ``values`` (or ``weights``): ``V`` entries, key 0's
  values of every row, then key 1's, .... Batched key-major: key ``f``'s segment of query
  0, of query 1, ..., then key ``f+1``; every output position finds its (key, query)
  segment with ``torch.searchsorted`` and is gathered from the request-major blocks.

A query's lengths must sum to its values count, as a KJT's do (TorchRec refuses others);
a query that breaks this has no defined batched answer, but it moves nothing of the
other queries of its batch: each query's offsets and lengths are kept inside its own
indices and values (:func:`own_offsets`, :func:`query_lengths`), and the gather index is
clamped. Needs torch (CPU is enough); no CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import BadInputError

__all__ = ["JAGGED_KINDS", "JaggedShape", "jagged_shape", "merge_offsets_total", "merged_lengths",
           "query_lengths", "gather_index", "perturb_jagged"]

JAGGED_KINDS = ("jagged_values", "jagged_lengths", "jagged_offsets")


@dataclass(frozen=True)
class JaggedShape:
    """One query's jagged feature: ``keys`` (F), ``rows`` (B), ``values`` (V, values per
    query), and whether it comes as ``offsets`` (``jagged_offsets``) or lengths."""

    keys: int
    rows: int
    values: int
    offsets: bool


def _is_int(t: Any) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == _torch().bool)


def _torch() -> Any:
    import torch

    return torch


def jagged_shape(tensors: Sequence[Any], kinds: Sequence[str], rows: int | None,
                 refuse: type[BadInputError]) -> JaggedShape | None:
    """The example's jagged feature (None without jagged kinds); raises ``refuse`` naming
    what does not fit: exactly one ``jagged_lengths`` or ``jagged_offsets`` input, one or
    more ``jagged_values`` of one length, ``rows`` known, the lengths a multiple of it and
    summing to the values count."""
    lens = [t for t, k in zip(tensors, kinds) if k in ("jagged_lengths", "jagged_offsets")]
    vals = [t for t, k in zip(tensors, kinds) if k == "jagged_values"]
    if not lens and not vals:
        return None
    if len(lens) != 1 or not vals:
        raise refuse("jagged inputs need exactly one jagged_lengths or jagged_offsets input and "
                     f"at least one jagged_values input (got {len(lens)} and {len(vals)})")
    if len({int(v.numel()) for v in vals}) != 1:
        raise refuse(f"jagged_values inputs of different lengths {sorted({int(v.numel()) for v in vals})}")
    if not rows:
        raise refuse("a jagged feature needs a rows, offsets or offsets_total input to tell the rows of a query")
    ln, as_off, v = lens[0], "jagged_offsets" in kinds, int(vals[0].numel())
    if not _is_int(ln):
        raise refuse(f"jagged lengths/offsets must be integers, got {ln.dtype}")
    n = int(ln.numel()) - (1 if as_off else 0)
    if n < rows or n % rows:
        raise refuse(f"jagged {'offsets' if as_off else 'lengths'} of {ln.numel()} entries are not "
                     f"{'1 + ' if as_off else ''}a multiple of the {rows} rows of a query")
    per = (ln[1:] - ln[:-1]) if as_off else ln
    if as_off and int(ln[0]) != 0:
        raise refuse(f"jagged_offsets must start at 0, the example's starts at {int(ln[0])}")
    if bool((per < 0).any()) or int(per.sum()) != v:
        raise refuse(f"the example's jagged lengths sum to {int(per.sum())} (negative: {bool((per < 0).any())}) "
                     f"where its jagged_values have {v} entries")
    return JaggedShape(n // rows, rows, v, as_off)


def own_offsets(v: Any, indices: int) -> Any:
    """``k`` queries' offsets (``v``: ``[k, n]``) kept inside each query's own ``indices``
    indices: clamped into ``[0, indices]``, the first set to 0, never decreasing (a
    running maximum; EmbeddingBag refuses decreasing offsets, which would fail the whole
    batch). A well-formed query's are
    unchanged; a malformed one's bags then read only its own indices, so it cannot move
    the bags of the queries next to it in the batch (an offset past its indices would read
    the next query's, a first offset above 0 would lend the previous query's last bag some
    of its indices). Static-shape: runs inside a CUDA graph."""
    out = v.clamp(0, indices)
    out[:, 0] = 0
    return out.cummax(1).values


def merge_offsets_total(v: Any, k: int, shifts: Any, shift: int) -> Any:
    """``k`` queries' offsets with a trailing total (``v``: ``[k, B + 1]``) as one: each
    query's first ``B`` (kept inside its own indices, :func:`own_offsets`) shifted by
    ``shifts[j]`` (``j * shift``), then the total ``k * shift``."""
    torch = _torch()
    head = (own_offsets(v[:, :-1], shift) + shifts[:k, None]).to(v.dtype).reshape(-1)
    return torch.cat([head, torch.full((1,), k * shift, dtype=v.dtype, device=v.device)])


def query_lengths(v: Any, js: JaggedShape) -> Any:
    """Per query, key and row, the lengths ``[k, F, B]`` of ``k`` queries' lengths or
    offsets (``v``: ``[k, F * B (+ 1)]``), each query's summing to exactly its own ``V``
    values: no length below 0, the running sum capped at ``V``, and the last (key, row)
    ending at ``V``. A well-formed query's are unchanged; a malformed one (lengths summing
    to more or fewer than its values) then moves none of the other queries' values in the
    batch, and the batch's lengths sum to its values count (a model that takes the last
    bag to the end of the values, as ``EmbeddingBag`` without ``include_last_offset`` does,
    reads no value of another query in it).
    Static-shape: runs inside a CUDA graph."""
    torch = _torch()
    per = (v[:, 1:] - v[:, :-1]) if js.offsets else v
    ends = per.clamp(min=0).cumsum(1).clamp_(max=js.values)
    ends[:, -1] = js.values  # a query short of values lends its last bag the rest of its own
    per = torch.diff(ends, dim=1, prepend=torch.zeros_like(ends[:, :1]))
    return per.reshape(v.shape[0], js.keys, js.rows)


def merged_lengths(lens: Any, dtype: Any, offsets: bool) -> Any:
    """The batch's key-major lengths (or offsets, from 0) of ``lens`` ``[k, F, B]``."""
    torch = _torch()
    flat = lens.permute(1, 0, 2).reshape(-1)
    if not offsets:
        return flat.to(dtype)
    cum = flat.cumsum(0, dtype=dtype)
    return torch.cat([torch.zeros(1, dtype=dtype, device=lens.device), cum])


def gather_index(lens: Any, values: int) -> Any:
    """For each position of the batch's key-major values (``k * V`` of them), its position
    in the request-major values of ``k`` queries (``lens``: ``[k, F, B]``): segment sizes
    per (query, key) on the device, the batch's segments ordered key-major, each position's
    segment by ``searchsorted`` over the segments' ends. Clamped into range."""
    torch = _torch()
    k, keys, _ = lens.shape
    seg = lens.sum(2, dtype=torch.int64)  # [k, F]: query j's values of key f
    base = torch.arange(k, device=lens.device, dtype=torch.int64)[:, None] * values
    src_start = (seg.cumsum(1) - seg + base).t().reshape(-1)  # key-major (f, j) order
    sizes = seg.t().reshape(-1)
    ends = sizes.cumsum(0)
    pos = torch.arange(k * values, device=lens.device, dtype=torch.int64)
    which = torch.searchsorted(ends, pos, right=True).clamp_(max=keys * k - 1)
    src = src_start[which] + pos - (ends - sizes)[which]
    return src.clamp_(0, k * values - 1)


def perturb_jagged(tensors: Sequence[Any], kinds: Sequence[str], js: JaggedShape, g: Any) -> dict[int, Any]:
    """A second query's jagged inputs (by input position): within each key, the rows'
    lengths permuted and every values input's entries permuted (one permutation for all,
    so values and weights stay paired), so each key keeps its values count and each value
    stays one the example gave that key."""
    torch = _torch()
    i_len = next(i for i, k in enumerate(kinds) if k in ("jagged_lengths", "jagged_offsets"))
    ln = tensors[i_len]
    per = ((ln[1:] - ln[:-1]) if js.offsets else ln).reshape(js.keys, js.rows)
    rows = torch.stack([torch.randperm(js.rows, generator=g) for _ in range(js.keys)])
    new = per.gather(1, rows.to(per.device)).reshape(-1)
    out = {i_len: (torch.cat([ln[:1], ln[:1] + new.cumsum(0)]).to(ln.dtype) if js.offsets else new).contiguous()}
    sizes = per.sum(1).tolist()
    perm, at = [], 0
    for n in sizes:
        perm.append(at + torch.randperm(int(n), generator=g))
        at += int(n)
    idx = torch.cat(perm) if perm else torch.zeros(0, dtype=torch.int64)
    for i, k in enumerate(kinds):
        if k == "jagged_values":
            out[i] = tensors[i][idx.to(tensors[i].device)].contiguous()
    return out
