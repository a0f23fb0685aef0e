"""Plan search: which runtime settings ``profile --apply`` considers and which it measures.

Every candidate (:func:`candidates`) is priced by :mod:`recsys_doctor.planning.whatif`; the best
few by estimate (:func:`select_to_measure`) are measured. :func:`runtime_plan` turns a
candidate into the runtime settings for a given number of client threads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from ..errors import BadInputError
from ..plan import Plan
from ._batching import UNPRICED
from .whatif import Candidate, Prediction

__all__ = ["GROUP_COUNTS", "candidates", "plan_candidate", "runtime_plan",
           "select_to_measure"]

#: group counts tried by the plan search
GROUP_COUNTS = (1, 2, 4, 8)


def candidates(kind: str = "serve", group_counts: Sequence[int] = GROUP_COUNTS,
               clients: int | None = None) -> list[Candidate]:
    """Every plan the search considers. Serving: groups x merge x allocator x graphs (32),
    plus dynamic batching (merged, own pools, graphs) at each group count.
    Training: branch streams x graphs (copies are not per-step). A plain script: groups x
    graphs (its copies are its own, on the group's stream; any number of client threads per
    group: the hook captures with any, see ``docs/profile.md``), plus the hook's batching
    (graphs) at each group count below ``clients`` (with one client thread a group there is
    nothing to combine; ``clients=1``, a training loop: none). With ``clients=1`` one group
    only: the hook places each thread that calls a model in a group, so one thread leaves every
    other group idle, and measuring them measures the machine's spread. Both with PyTorch's one
    shared allocator, the only one they can have."""
    if kind == "serve":
        return ([Candidate(g, m, a, gr) for g in group_counts for m in (True, False) for a in (True, False)
                 for gr in (True, False)] + [Candidate(g, batching=True) for g in group_counts])
    if kind in ("script", "train"):
        # shared pool: neither path can give a group its own allocator (Plan.unhonoured), so
        # the search never offers one there
        out = [Candidate(g, True, False, gr) for g in (group_counts if clients != 1 else (1,)) for gr in (True, False)]
        if kind == "script":
            out += [Candidate(g, True, False, True, batching=True) for g in group_counts
                    if clients is None or g < clients]
        return out
    raise BadInputError(f"unknown candidate kind {kind!r}")


def plan_candidate(plan: dict[str, Any]) -> Candidate:
    """The advisor's plan as a :class:`Candidate` (through :meth:`Plan.from_dict`)."""
    return Candidate.from_plan(Plan.from_dict(plan))


def runtime_plan(cand: Candidate, clients: int) -> dict[str, Any]:
    """The runtime settings for ``cand`` with ``clients`` client threads: enough slots per
    group that every client can have a query in flight (``groups x slots >= clients``;
    fewer makes waiting for a slot unfair, see ``docs/runtime.md``)."""
    return cand.to_plan().to_runtime(clients)


def select_to_measure(ranked: Sequence[Prediction], top_k: int, prefer: Candidate | None = None,
                      allocator_twin: bool = True) -> list[Prediction]:
    """The first ``top_k`` of ``ranked`` that differ in something the estimate prices
    (groups, merged streams, graphs: the allocator variants of one plan estimate the
    same, so only the first of them is taken), then, with ``allocator_twin``, the best
    one's twin with the other allocator setting (own pools per group vs one shared pool
    are measured, not guessed), plus ``prefer`` (the advisor's plan) when it is not among
    them; and the best batching candidate when none is among them (batching against
    unbatched is measured, not guessed: the estimate prices the GIL convoy of many
    unbatched clients only in part, see :mod:`recsys_doctor.planning._batching`). Where the
    batching candidates are not priced (a plain script's), the one at the best candidate's
    group count is taken (the batched twin of the best), else the first ranked."""
    out: list[Prediction] = []
    seen: set[tuple[int, bool, bool, bool]] = set()
    for p in ranked:
        c = p.candidate
        k = (c.groups, c.merge_streams, c.cuda_graphs, c.batching)
        if k in seen:
            continue
        if len(out) < top_k:
            out.append(p)
            seen.add(k)
    if allocator_twin and out and out[0].candidate.groups > 1:
        top = out[0].candidate
        twin = replace(top, per_stream_allocator=not top.per_stream_allocator)
        out.extend(p for p in ranked if p.candidate == twin and all(q.candidate != twin for q in out))
    if prefer is not None and all(p.candidate != prefer for p in out):
        out.extend(p for p in ranked if p.candidate == prefer)
    if not any(p.candidate.batching for p in out):
        batched = [p for p in ranked if p.candidate.batching]
        same = [p for p in batched if p.bound == UNPRICED and out and p.candidate.groups == out[0].candidate.groups]
        out.extend((same or batched)[:1])
    return out
