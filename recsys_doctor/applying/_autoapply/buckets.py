"""Varying shapes, bounded: a model call whose row count varies (the last partial batch,
per-request candidate counts) is graphed per row *bucket* - its rows padded up to the next
power of two - where padding is verified to leave the real rows as they are, and per exact
shape otherwise and for the site's common row count (most of its calls: the full batches); a
call site holds at most ``MAX_GRAPHS_PER_SITE`` graphs per group of each *argument family* (the
call's key without its tensors' sizes: which arguments it has, their dtypes and ranks, the plain
values passed), at most ``MAX_FAMILIES_PER_SITE`` families, all the hook's group graphs at most
``GRAPH_MEMORY_BUDGET`` bytes. The pure logic (no CUDA) is here; the flow is
:func:`.graphs._graphed_call`.

Why families: a script whose calls pass optional features or a setting (``model(**feats,
temperature=t)`` with 4 feature sets and 2 temperatures, ``examples/heldout/
optional_features_serve.py``) has 8 families, each with its row buckets: 40 graphs it uses
all the time. One bound over all of them (8) left 42% of its calls eager on the H200. Sizes
still vary within a family only as far as ``MAX_GRAPHS_PER_SITE`` goes, and a value that
changes every call (a counter passed as an argument) still fills at most
``MAX_FAMILIES_PER_SITE`` families.

Why padding is safe where it is used:

* the padding rows are copies of the last real row, so every value the model sees is one of
  the script's own (an index stays in range, offsets stay non-decreasing), and a reduction
  over rows that ignores repeats (max, min, any, all) gives the same result for any input;
* the first ``VERIFY_CALLS`` padded calls of each bucket run eagerly twice, as they are and
  padded, and the real rows of the outputs must be equal each time (``torch.equal``; floats
  within ``PAD_RTOL``/``PAD_ATOL``), on calls whose padded tensors each have rows that differ
  (with equal rows, a mean over rows could not tell; on two calls, a sum over rows whose
  last row added nothing on one is caught on the other): a model that mixes rows (softmax
  over the batch, BatchNorm in train mode, a sum over rows) then fails, and its call site
  gets exact-shape graphs only (another padding, copies of the first row say, would make a
  non-decreasing input such as EmbeddingBag offsets decrease: not a valid input);
* an output is cut back to the real rows only where its leading dimension is the padded row
  count, and the verification checks the cut outputs' shapes against the unpadded ones;
* a call whose output holds integers that are not one value per row (the indices of a top-k or
  an argmax over the rows) is never padded: a copy of the last row changes such an output only
  when it ranks among the chosen, which two verification calls rarely show
  (:func:`index_outputs`). Float order statistics over the rows (a top-k's values alone, a
  median) have the same weakness and are only verified.

A site whose padding failed a verification keeps the graphs of the buckets verified before
(their keys keep their places in the bound; a graph is never freed while it may replay) and
takes no padded path again.
"""

from __future__ import annotations

from typing import Any

#: graphs one call site (a module, in one group) may hold of one argument family (:func:`family`):
#: one per row bucket or exact shape
MAX_GRAPHS_PER_SITE = 8
#: argument families one call site (a module, in one group) may hold graphs of
MAX_FAMILIES_PER_SITE = 8
#: bytes the hook's group graphs may hold together (their private pools, measured as the growth
#: of ``torch.cuda.memory_reserved`` over each capture); no capture starts beyond it
GRAPH_MEMORY_BUDGET = 2 << 30
#: padded calls of a bucket verified (run eagerly as they are and padded) before its graph is used
VERIFY_CALLS = 2
#: a row count that makes at least this share of a site's calls, once the site has had
#: ``COMMON_AFTER`` calls, is graphed at its own shape, not padded (:meth:`_Site.pads`); 4: before
#: its bucket's graph is captured (2 calls verify the padding, 2 warm up), so that a script whose
#: calls all hold one row count gets no graph it will not use
COMMON_SHARE = 0.5
COMMON_AFTER = 4
#: keys a site remembers the refusal of (:meth:`_Site.refused`)
MAX_REFUSALS = 1024
#: row counts a site counts (more distinct ones are not counted: none of them is common)
MAX_ROW_COUNTS = 64
#: (call key, bucket) pairs a site remembers the padded key of (:meth:`_Site.pad_keys`)
MAX_PAD_KEYS = 256
#: how close a padded call's real rows must be to the unpadded call's (float outputs; others equal)
PAD_RTOL = 1e-6
PAD_ATOL = 1e-6

#: why a call ran eagerly (``accounting.fell_back`` reasons; stable texts, counted per site)
BOUND_REACHED = f"no graph for this shape: the call site holds {MAX_GRAPHS_PER_SITE} graphs already"
FAMILIES_REACHED = (f"no graph for these arguments: the call site holds graphs of {MAX_FAMILIES_PER_SITE} other "
                    "sets of arguments (optional ones, plain values) already")
BUDGET_SPENT = "no graph for this shape: the graphs' memory budget is spent"
VERIFYING = "padding rows to a bucket being verified on this call"
WARMING_UP = "the first calls of a shape run eagerly before its capture"
MIXES_ROWS = "padded rows change the real rows' outputs (rows mixed): exact shapes only"
INDEX_OUTPUT = ("an output that is not one value per row holds integers (top-k or argmax indices, counts): "
                "padded rows could enter it: exact shapes only")


def call_rows(tensors: list[Any]) -> int:
    """A call's row count: the largest leading dimension of its tensor arguments (0 if none
    has a dimension). On every graphed call: a plain loop over the shapes (half the time of
    ``max()`` over ``dim()``/``shape[0]``, 28 tensors)."""
    n = 0
    for t in tensors:
        s = t.shape
        if s and s[0] > n:
            n = s[0]
    return n


def bucket_rows(n: int) -> int:
    """The bucket of ``n`` rows: the smallest power of two >= n (0 for 0)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def row_tensors(tensors: list[Any], n: int) -> list[bool]:
    """Which tensors are padded: those whose leading dimension is the row count ``n``."""
    return [t.dim() > 0 and int(t.shape[0]) == n for t in tensors]


def pad_views(static_in: list[Any], tensors: list[Any], n: int) -> tuple[list[Any], list[bool]]:
    """Where a call of ``n`` rows is copied into a padded graph's inputs ``static_in`` without
    padded tensors being made first: per tensor, the rows ``[:n]`` and ``[n:]`` of its static
    input where it is padded (its real rows, then copies of its last row), else the whole one;
    and which tensors are padded (:func:`row_tensors`)."""
    which = row_tensors(tensors, n)
    dsts: list[Any] = []
    for s, padded in zip(static_in, which):
        dsts += [s[:n], s[n:]] if padded else [s]
    return dsts, which


def pad_rows(torch: Any, tensors: list[Any], n: int, b: int) -> list[Any]:
    """``tensors`` with those of ``n`` rows padded to ``b`` rows by copies of their last row."""
    return [torch.cat([t, t[n - 1:n].expand(b - n, *t.shape[1:])]) if padded else t
            for t, padded in zip(tensors, row_tensors(tensors, n))]


def rows_differ(torch: Any, tensors: list[Any], n: int) -> bool:
    """Whether every padded tensor has two real rows that differ (a verification needs it)."""
    rows = [t for t, padded in zip(tensors, row_tensors(tensors, n)) if padded]
    return n >= 2 and bool(rows) and all(not torch.equal(t[1:n], t[:1].expand(n - 1, *t.shape[1:])) for t in rows)


#: the plain leaves a graphed output may hold beside its tensors (a ``"model_version"`` string in
#: a dict of scores): immutable, handed out by every replay as the capture returned them
PLAIN_LEAVES = (str, bytes, int, float, complex, bool, type(None))


def outputs(torch: Any, out: Any) -> tuple[Any, ...] | None:
    """A model output's tensors: ``(out,)`` for a tensor, else its tensor leaves in pytree
    order (``torch.utils._pytree``: tuples, lists, dicts, namedtuples, nested; a None leaf,
    or another plain immutable one (:data:`PLAIN_LEAVES`), is kept by the structure, not
    listed); None where a leaf is something else or no leaf is a tensor (not graphed, not padded)."""
    if isinstance(out, torch.Tensor):
        return (out,)
    from torch.utils._pytree import tree_leaves

    leaves = [o for o in tree_leaves(out) if not isinstance(o, PLAIN_LEAVES)]
    if not leaves or not all(isinstance(o, torch.Tensor) for o in leaves):
        return None
    return tuple(leaves)


def plain_leaves(torch: Any, out: Any) -> list[Any]:
    """An output's leaves other than tensors (:func:`outputs`' plain ones), in pytree order."""
    if isinstance(out, torch.Tensor):
        return []
    from torch.utils._pytree import tree_leaves

    return [o for o in tree_leaves(out) if not isinstance(o, torch.Tensor)]


def index_outputs(torch: Any, out: Any, n: int) -> bool:
    """Whether a call of ``n`` rows returns an integer (or bool) tensor that is not one value per
    row (its leading dimension not ``n``, or none): the indices of a top-k or an argmax over the
    rows, a count. Such an output changes only when a padding row (a copy of the last real row)
    ranks among the chosen, which two verification calls rarely show (the last row is in a
    top-10 of 200 one call in 20), so padding is not tried at all (:func:`.graphs._verify_padding`)."""
    leaves = outputs(torch, out)
    if leaves is None:
        return False
    return any(not (o.is_floating_point() or o.is_complex()) and not (o.dim() > 0 and int(o.shape[0]) == n)
               for o in leaves)


def cut_rows(o: Any, n: int, b: int) -> Any:
    """An output as the script gets it: its first ``n`` rows where its leading dimension is the
    padded row count ``b``, as it is otherwise."""
    return o[:n] if o.dim() > 0 and int(o.shape[0]) == b else o


def same_rows(torch: Any, out: Any, padded_out: Any, n: int, b: int) -> bool:
    """Whether a padded call's outputs, cut back to the real rows, are the unpadded call's:
    the same structure, shapes and dtypes, values equal (floats within the tolerance), and
    plain leaves equal (one that counts the rows differs: no padding)."""
    from torch.utils._pytree import tree_structure

    u, p = outputs(torch, out), outputs(torch, padded_out)
    if u is None or p is None or len(u) != len(p) or tree_structure(out) != tree_structure(padded_out):
        return False
    if plain_leaves(torch, out) != plain_leaves(torch, padded_out):
        return False
    for a, c in zip(u, p):
        c = cut_rows(c, n, b)
        if a.shape != c.shape or a.dtype != c.dtype or a.device != c.device:
            return False
        if a.is_floating_point() or a.is_complex():
            if not torch.allclose(a, c, rtol=PAD_RTOL, atol=PAD_ATOL, equal_nan=True):
                return False
        elif not torch.equal(a, c):
            return False
    return True


def family(key: Any) -> Any:
    """A call's key (:func:`.graphs._key`) without its tensors' sizes: each ``torch.Size`` in
    it (the only tuple subclass a key holds) replaced by its length, so keys that differ in
    sizes alone (rows, a sequence length) are one family, and keys that differ in which
    arguments are passed, their dtypes, ranks or plain values are not."""
    if isinstance(key, tuple):
        if type(key) is not tuple:
            return len(key)
        return tuple([family(v) for v in key])
    return key


class _Site:
    """A call site's shapes in one group (a module called by the group's threads): the keys
    that hold (or may get) a graph, the padded keys' verifications passed, and why padding
    is off."""

    __slots__ = ("keys", "verified", "no_pad", "rows", "calls", "pad_keys", "families", "refusals")

    def __init__(self) -> None:
        #: (a call's key, its row bucket) -> the padded call's key, learned from the calls padded so far
        self.pad_keys: dict[tuple[Any, int], Any] = {}
        self.keys: set[Any] = set()
        #: argument family (:func:`family`) -> its keys admitted
        self.families: dict[Any, int] = {}
        #: keys refused a graph -> why (up to ``MAX_REFUSALS``): asked again at each of their calls
        self.refusals: dict[Any, str] = {}
        self.verified: dict[Any, int] = {}
        self.no_pad: str | None = None
        self.rows: dict[int, int] = {}  # calls per row count (up to MAX_ROW_COUNTS counts)
        self.calls = 0

    def seen(self, n: int) -> None:
        """Count a call of ``n`` rows (once per call, before :meth:`pads` is asked)."""
        self.calls += 1
        c = self.rows.get(n)
        if c is not None:
            self.rows[n] = c + 1
        elif len(self.rows) < MAX_ROW_COUNTS:
            self.rows[n] = 1

    def pads(self, n: int) -> bool:
        """Whether a call of ``n`` rows goes to its row bucket padded: not where ``n`` is a
        bucket already, padding is off here, or ``n`` is the site's common row count (at least
        ``COMMON_SHARE`` of its calls, from the ``COMMON_AFTER``-th call): a script whose batches
        all hold 200 rows gets a graph of 200 rows, not one of 256 that computes 56 padding rows
        and pads and cuts every call (and whose padded call no thread graph can take)."""
        if self.no_pad is not None or bucket_rows(n) == n:
            return False
        return not (self.calls >= COMMON_AFTER and self.rows.get(n, 0) >= COMMON_SHARE * self.calls)

    def padded_ok(self, key: Any) -> bool:
        """Whether padded calls of ``key`` may use its graph (``VERIFY_CALLS`` verifications passed)."""
        return self.verified.get(key, 0) >= VERIFY_CALLS

    def refused(self, key: Any, fam: Any = None) -> str | None:
        """Why ``key`` may not have a graph here (``MAX_GRAPHS_PER_SITE`` of its family held, or
        ``MAX_FAMILIES_PER_SITE`` other families), or None: admitted (now, or before). ``fam``:
        its family where not :func:`family` of it (a batching site's batch sizes: one family)."""
        if key in self.keys:
            return None
        why = self.refusals.get(key)  # (a refusal stands: the bounds are fixed and families only fill)
        if why is not None:
            return why
        f = family(key) if fam is None else fam
        n = self.families.get(f)
        if n is None and len(self.families) >= MAX_FAMILIES_PER_SITE:
            why = FAMILIES_REACHED
        elif n is not None and n >= MAX_GRAPHS_PER_SITE:
            why = BOUND_REACHED
        else:
            self.families[f] = (n or 0) + 1
            self.keys.add(key)
            return None
        if len(self.refusals) < MAX_REFUSALS:
            self.refusals[key] = why
        return why
