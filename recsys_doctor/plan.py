"""The one plan type: :class:`Plan`, what the runtime should do, typed and versioned.

The planner (:mod:`recsys_doctor.planner`) writes schema-1 JSON (``stream_groups.count``,
``merge_copy_compute.enabled``, ...); ``profile --apply`` adds a flat ``runtime`` object
with the chosen settings. :meth:`Plan.from_dict` reads either (the ``runtime`` object wins)
and is the only parser: ``RuntimeConfig.from_plan``, the what-if's ``Candidate``, the
script hook (:mod:`recsys_doctor._autoapply`) and the training runner all go through it.
Each path says which fields it cannot honour (:meth:`Plan.unhonoured`); those are
reported, never silently dropped.

Kept free of any import but the standard library (and :mod:`recsys_doctor.errors` when
there is a package): the script hook loads this file by path at interpreter start, where
importing the package (pandas) would slow every hooked program down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

try:
    from .errors import BadInputError
except ImportError:  # loaded by file path by the script hook, outside the package
    class BadInputError(ValueError):  # type: ignore[no-redef]
        """A plan that cannot be used (the package's own class where there is a package)."""

__all__ = ["PLAN_VERSION", "PATHS", "Plan"]

#: the plan JSON's ``schema`` (planner schema 1)
PLAN_VERSION = 1

#: the paths that apply a plan: serving workloads (``runtime.serve``), training
#: workloads (branch streams + whole-step graph), plain scripts (the interpreter-start hook)
PATHS = ("serve", "train", "script")

#: accepted spellings of each field in a plan dict (older plans and hand-written ones)
_ALIASES: dict[str, tuple[str, ...]] = {
    "groups": ("groups", "stream_groups", "num_groups", "streams"),
    "merge_streams": ("merge_streams", "merge_copy_compute", "merge", "stream_merging"),
    "per_stream_allocator": ("per_stream_allocator", "per_stream_allocators", "per_group_allocator"),
    "cuda_graphs": ("cuda_graphs", "graphs", "use_cuda_graphs"),
    "slots_per_group": ("slots_per_group", "slots"),
    "pool_limit_bytes": ("pool_limit_bytes",),
}
_TYPES: dict[str, type] = {"groups": int, "merge_streams": bool, "per_stream_allocator": bool,
                           "cuda_graphs": bool, "slots_per_group": int, "pool_limit_bytes": int}


@dataclass(frozen=True)
class Plan:
    """What the runtime should do. Defaults are the runtime's (``RuntimeConfig``)."""

    #: stream groups (serving: a compute stream [+ copy streams] each; training: branch streams)
    groups: int = 4
    #: a group's copies on its compute stream
    merge_streams: bool = True
    #: a memory pool per group (else one shared)
    per_stream_allocator: bool = True
    #: CUDA graphs (serving: per group and shape; training: the whole step; scripts: per module call)
    cuda_graphs: bool = True
    #: queries a group can have in flight (serving)
    slots_per_group: int = 2
    #: limit in bytes on the runtime's device pools together (serving; None: none)
    pool_limit_bytes: int | None = None
    #: training: (NVTX range, group) pairs from the planner's ``range_assignment``
    range_assignment: tuple[tuple[str, int], ...] = ()
    #: ``serving`` / ``training`` as the planner saw the trace (None: not said)
    kind: str | None = None
    #: plan schema version
    version: int = PLAN_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.groups, int) or isinstance(self.groups, bool) or self.groups < 1:
            raise BadInputError(f"groups must be a positive integer, got {self.groups!r}")
        if not isinstance(self.slots_per_group, int) or self.slots_per_group < 1:
            raise BadInputError(f"slots_per_group must be a positive integer, got {self.slots_per_group!r}")
        if self.pool_limit_bytes is not None and (not isinstance(self.pool_limit_bytes, int)
                                                  or self.pool_limit_bytes <= 0):
            raise BadInputError(f"pool_limit_bytes must be a positive integer, got {self.pool_limit_bytes!r}")
        for f in ("merge_streams", "per_stream_allocator", "cuda_graphs"):
            if not isinstance(getattr(self, f), bool):
                raise BadInputError(f"{f} must be true or false, got {getattr(self, f)!r}")
        if self.version != PLAN_VERSION:
            raise BadInputError(f"plan schema {self.version!r} is not supported (this version reads {PLAN_VERSION})")

    # ----------------------------------------------------------------------- reading

    @classmethod
    def from_dict(cls, plan: Mapping[str, Any]) -> "Plan":
        """A plan from ``advise --json``'s ``plan`` (schema 1), a ``plan.json`` (its
        ``runtime`` object wins) or a flat dict of the field names. Unknown keys are
        ignored (a plan carries reasons and evidence the runtime does not need); a
        recognized key with a wrong type raises :class:`BadInputError`."""
        if not isinstance(plan, Mapping):
            raise BadInputError(f"a plan must be a mapping, got {type(plan).__name__}")
        src: Mapping[str, Any] = plan
        for sub in ("runtime", "config"):
            if isinstance(plan.get(sub), Mapping):
                src = {**plan, **plan[sub]}
        kw: dict[str, Any] = {}
        for name, aliases in _ALIASES.items():
            for alias in aliases:
                if alias in src and src[alias] is not None:
                    kw[name] = _coerce(name, src[alias], _TYPES[name])
                    break
        kw["range_assignment"] = _ranges(plan.get("range_assignment"))
        if isinstance(plan.get("kind"), str):
            kw["kind"] = plan["kind"]
        schema = plan.get("schema")
        if schema is not None:
            kw["version"] = schema
        return cls(**kw)

    # ----------------------------------------------------------------------- writing

    def to_runtime(self, clients: int | None = None) -> dict[str, Any]:
        """The flat ``runtime`` object of ``plan.json``; with ``clients``, enough slots per
        group that every client thread can have a query in flight (``groups x slots >= clients``)."""
        d: dict[str, Any] = {"groups": self.groups, "merge_streams": self.merge_streams,
                             "per_stream_allocator": self.per_stream_allocator, "cuda_graphs": self.cuda_graphs}
        if clients:
            d["slots_per_group"] = max(2, math.ceil(clients / self.groups))
        return d

    def runtime_fields(self) -> dict[str, Any]:
        """The fields ``RuntimeConfig`` takes."""
        return {f: getattr(self, f) for f in _ALIASES}

    # ----------------------------------------------------------------------- honouring

    def unhonoured(self, path: str) -> list[str]:
        """One line per field that ``path`` (one of :data:`PATHS`) cannot honour as set:
        the caller reports them (stderr, notes), so that nothing is dropped silently.

        Training and scripts run a group's work on one stream and keep PyTorch's caching
        allocator, which already keeps its blocks per stream: ``merge_streams`` and
        ``per_stream_allocator`` set true are what they do, false is reported (training's
        copies are not per step, so it has no copy streams to keep apart: ``merge_streams``
        does not apply there). Query slots and pool limits exist only when serving; range
        assignment only when training, where branch ``i`` runs on group ``i mod groups``."""
        if path not in PATHS:
            raise BadInputError(f"unknown plan path {path!r} (one of {', '.join(PATHS)})")
        d = Plan()
        out: list[str] = []
        if path in ("train", "script"):
            who = "training" if path == "train" else "the script hook"
            if not self.merge_streams and path == "script":
                out.append(f"merge_streams=false: {who} runs a group's work on one stream")
            if not self.per_stream_allocator:
                out.append(f"per_stream_allocator=false: {who} keeps PyTorch's allocator")
            if self.slots_per_group != d.slots_per_group:
                out.append(f"slots_per_group={self.slots_per_group}: only serving workloads have query slots")
            if self.pool_limit_bytes is not None:
                out.append("pool_limit_bytes: only serving workloads have runtime pools")
        if self.range_assignment:
            if path != "train":
                out.append("range_assignment: only training workloads run ranges on branch streams")
            elif any(g != i % self.groups for i, (_, g) in enumerate(self.range_assignment)):
                out.append("range_assignment: branch streams take branches round-robin "
                           "(branch i on group i mod groups); this assignment differs")
        return out


def _ranges(v: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(v, Mapping) or not v.get("enabled"):
        return ()
    rows = v.get("assignments") or []
    try:
        return tuple((str(a["nvtx"]), int(a["group"])) for a in rows)
    except (TypeError, KeyError, ValueError):
        raise BadInputError("plan field range_assignment: assignments must be {nvtx, group} objects") from None


def _coerce(name: str, v: Any, typ: type) -> Any:
    if isinstance(v, Mapping):  # planner schema 1: {"count": 4, ...} / {"enabled": true, ...}
        v = v.get("count") if "count" in v else v.get("enabled")
        if v is None:
            raise BadInputError(f"plan field {name}: expected 'count' or 'enabled' in it")
    if typ is bool:
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return v.lower() in ("true", "yes", "on", "1")
        raise BadInputError(f"plan field {name}: expected true/false, got {v!r}")
    if isinstance(v, bool):
        raise BadInputError(f"plan field {name}: expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().isdigit():
        return int(v)
    raise BadInputError(f"plan field {name}: expected an integer, got {v!r}")

