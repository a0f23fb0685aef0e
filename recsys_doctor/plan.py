"""The one plan type: :class:`Plan`, what the runtime should do, typed and versioned.

The planner (:mod:`recsys_doctor.planning.planner`) writes schema-1 JSON (``stream_groups.count``,
``merge_copy_compute.enabled``, ...); ``profile --apply`` adds a flat ``runtime`` object
with the chosen settings. :meth:`Plan.from_dict` reads either (the ``runtime`` object wins)
and is the only parser: ``RuntimeConfig.from_plan``, the what-if's ``Candidate``, the
script hook (:mod:`recsys_doctor.applying._autoapply`) and the training runner all go through it.
Each path says which fields it cannot honour (:meth:`Plan.unhonoured`); those are
reported, never silently dropped.

Kept free of any import but the standard library (and :mod:`recsys_doctor.errors` when
there is a package): the script hook loads this file by path at interpreter start, where
importing the package (pandas) would slow every hooked program down.
"""

from __future__ import annotations

import math
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

try:
    from .errors import BadInputError
except ImportError:  # loaded by file path by the script hook, outside the package
    class BadInputError(ValueError):  # type: ignore[no-redef]
        """A plan that cannot be used (the package's own class where there is a package)."""

__all__ = ["PLAN_VERSION", "PATHS", "DEFAULT_MAX_BATCH", "RuntimeSettings", "Plan"]

#: the largest dynamic batch when a plan or ``serve`` does not say. With up to 32, a free group took
#: all of 32 coroutines' queries into one batch, so one batch was in flight while their event loop
#: waited for it. Against 32 on H200s (thirty-second session, wide&deep, 4 groups, 2 drivers; 3
#: calls, 7 rounds; bench/apply/results/session32_h200/; docs/runtime.md): coroutines 1.77x /
#: 1.19x / 1.13x the queries a second at 32 / 64 / 128 (1.62-1.99x, 1.06-1.30x, 1.08-1.17x by
#: call); client threads 0.94x / 1.05x / 1.03x, as close to 1 as at 8 / 16 threads (0.94x /
#: 1.12x), where no batch can be larger than 16 either way.
DEFAULT_MAX_BATCH = 16

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
    "batching": ("batching", "dynamic_batching"),
    "max_batch": ("max_batch", "max_batch_size"),
    "max_delay_ms": ("max_delay_ms", "max_queue_delay_ms"),
}
_TYPES: dict[str, type] = {"groups": int, "merge_streams": bool, "per_stream_allocator": bool,
                           "cuda_graphs": bool, "slots_per_group": int, "pool_limit_bytes": int,
                           "batching": bool, "max_batch": int, "max_delay_ms": float}


@dataclass(frozen=True)
class RuntimeSettings:
    """The runtime's knobs, checked: the fields a plan gives the runtime, and the whole of
    ``RuntimeConfig`` (which is this plus how to build one from a plan). Defaults are the
    measured best for a small-batch wide&deep model at 8 client threads on the H100 (see
    ``docs/runtime.md``)."""

    #: stream groups (serving: each a compute stream + copy streams, or one merged stream;
    #: training: branch streams; scripts: client threads round-robin)
    groups: int = 4
    #: a group's copies on its compute stream (no cross-stream waits inside a group)
    merge_streams: bool = True
    #: a memory pool per group (else one pool shared by all groups)
    per_stream_allocator: bool = True
    #: CUDA graphs (serving: the whole query, H2D + forward + D2H, per group and shape;
    #: training: the whole step; scripts: per top-level module call)
    cuda_graphs: bool = True
    #: queries a group can have in flight at once, each with its own staging buffers (serving)
    slots_per_group: int = 2
    #: upper limit in bytes on the runtime's device pools together (serving; None: no limit)
    pool_limit_bytes: int | None = None
    #: dynamic batching of concurrent queries (serving: ``serve(batching=True)``; scripts: the
    #: hook combines concurrent graphed calls of one model, ``docs/profile.md``)
    batching: bool = False
    #: the largest batch, and how long a free group waits for company (0: never; scripts: the
    #: hook never waits for company, it combines the calls that queue while the group is busy)
    max_batch: int = DEFAULT_MAX_BATCH
    max_delay_ms: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.groups, int) or isinstance(self.groups, bool) or self.groups < 1:
            raise BadInputError(f"groups must be a positive integer, got {self.groups!r}")
        if not isinstance(self.slots_per_group, int) or self.slots_per_group < 1:
            raise BadInputError(f"slots_per_group must be a positive integer, got {self.slots_per_group!r}")
        if self.pool_limit_bytes is not None and (not isinstance(self.pool_limit_bytes, int)
                                                  or self.pool_limit_bytes <= 0):
            raise BadInputError(f"pool_limit_bytes must be a positive integer, got {self.pool_limit_bytes!r}")
        if not isinstance(self.max_batch, int) or isinstance(self.max_batch, bool) or self.max_batch < 1:
            raise BadInputError(f"max_batch must be a positive integer, got {self.max_batch!r}")
        if not isinstance(self.max_delay_ms, (int, float)) or isinstance(self.max_delay_ms, bool) \
                or not 0 <= self.max_delay_ms < 10_000:
            raise BadInputError(f"max_delay_ms must be a number of milliseconds >= 0, got {self.max_delay_ms!r}")
        for f in ("merge_streams", "per_stream_allocator", "cuda_graphs", "batching"):
            if not isinstance(getattr(self, f), bool):
                raise BadInputError(f"{f} must be true or false, got {getattr(self, f)!r}")


@dataclass(frozen=True)
class Plan(RuntimeSettings):
    """What the runtime should do: its settings (:class:`RuntimeSettings`, defaults the
    runtime's) plus what the planner said about the trace."""

    #: training: (NVTX range, group) pairs from the planner's ``range_assignment``
    range_assignment: tuple[tuple[str, int], ...] = ()
    #: ``serving`` / ``training`` as the planner saw the trace (None: not said)
    kind: str | None = None
    #: plan schema version
    version: int = PLAN_VERSION
    #: the runtime fields the plan gave (the others are defaults): only those are reported
    given: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
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
        kw["given"] = frozenset(k for k in kw if k in _ALIASES)
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
        if self.batching:
            d.update(batching=True, max_batch=self.max_batch, max_delay_ms=self.max_delay_ms)
        return d

    def runtime_fields(self) -> dict[str, Any]:
        """The fields ``RuntimeConfig`` takes."""
        return {f: getattr(self, f) for f in _ALIASES}

    # ----------------------------------------------------------------------- honouring

    def unhonoured(self, path: str) -> list[str]:
        """One line per setting that ``path`` (one of :data:`PATHS`) cannot honour: the
        caller reports them (stderr, notes), so that nothing is dropped silently. Only
        settings the plan gives (not defaults) are reported, each with what the path does
        instead (:data:`_NOT_APPLIED`); a range assignment is honoured by training when it
        is the branch streams' round-robin (branch ``i`` on group ``i mod groups``)."""
        if path not in PATHS:
            raise BadInputError(f"unknown plan path {path!r} (one of {', '.join(PATHS)})")
        out: list[str] = []
        for name, (asked, why) in _NOT_APPLIED[path].items():
            v = getattr(self, name)
            if name in self.given and (asked is None or (asked(v) if callable(asked) else v == asked)):
                out.append(f"plan {name}={json.dumps(v)} is not applied to {_PATH_NAMES[path]}: {why}")
        if path == "script" and self.batching and not self.cuda_graphs and "batching" in self.given:
            out.append("plan batching=true is not applied to a plain script without cuda_graphs: the hook "
                       "batches only calls it replays as CUDA graphs")
        if self.range_assignment:
            if path != "train":
                out.append(f"plan range_assignment is not applied to {_PATH_NAMES[path]}: "
                           "only training runs ranges on branch streams")
            elif any(g != i % self.groups for i, (_, g) in enumerate(self.range_assignment)):
                out.append("plan range_assignment is not applied to training as given: branch streams take "
                           "branches round-robin (branch i on group i mod groups)")
        return out


_PATH_NAMES = {"serve": "serving", "train": "training", "script": "a plain script"}
#: per path: setting -> (the value it cannot honour, None: any value, or a predicate of the value;
#: what it does instead)
_NOT_APPLIED: dict[str, dict[str, tuple[Any, str]]] = {
    "serve": {},
    "train": {
        "per_stream_allocator": (True, "the step's tensors come from PyTorch's allocator shared by all branch streams"),
        "slots_per_group": (None, "a training step has no query slots"),
        "pool_limit_bytes": (None, "training uses no runtime pools"),
        "batching": (True, "a training step is not batched with others"),
    },
    "script": {
        "merge_streams": (False, "the script's copies run on its thread's group stream (merged) whatever the plan says"),
        "per_stream_allocator": (True, "activations come from PyTorch's allocator shared by all groups"),
        "slots_per_group": (None, "each client thread has its group's stream; there are no slots"),
        "pool_limit_bytes": (None, "no runtime pools exist in a plain script"),
        "max_delay_ms": (lambda v: v > 0, "the hook never holds a call back for company: it batches the calls "
                                          "that queue while their group is busy"),
    },
}


def _ranges(v: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(v, Mapping) or not v.get("enabled"):
        return ()
    rows = v.get("assignments") or []
    try:
        return tuple((str(a["nvtx"]), int(a["group"])) for a in rows)
    except (TypeError, KeyError, ValueError):
        raise BadInputError("plan field range_assignment: assignments must be {nvtx, group} objects") from None


def _bad_number(name: str, v: Any) -> Any:
    raise BadInputError(f"plan field {name}: expected a number, got {v!r}")


def _coerce(name: str, v: Any, typ: type) -> Any:
    if isinstance(v, Mapping):  # planner schema 1: {"count": 4, ...} / {"enabled": true, ...}
        v = v.get("count") if "count" in v else v.get("enabled")
        if v is None:
            raise BadInputError(f"plan field {name}: expected 'count' or 'enabled' in it")
    if typ is float:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        try:
            return float(v) if isinstance(v, str) else _bad_number(name, v)
        except ValueError:
            return _bad_number(name, v)
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

