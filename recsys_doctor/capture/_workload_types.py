"""The two records of the Workload protocol: :class:`Workload` (what a workload module's
``workload()`` returns) and :class:`Measurement` (what driving it measured). Re-exported by
:mod:`recsys_doctor.capture.workload`, which documents the protocol."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from ..errors import BadInputError

__all__ = ["Workload", "Measurement", "KINDS"]

#: what a workload can be
KINDS = ("serve", "train")


@dataclass
class Workload:
    """What ``workload()`` in a workload module returns.

    ``model``: the model (an ``nn.Module`` already on its device for the default serving
    query; any object for a custom ``run``).
    ``inputs``: input factory, ``inputs(k) -> tuple`` of positional arguments of one query
    or step for client thread ``k``; called once per client before warm-up and reused
    for every call (serving: host tensors, pinned for fast copies; training: whatever
    ``run`` takes). A non-tuple result is passed as the single argument.
    ``kind``: ``serve`` (many client threads, latency matters) or ``train`` (step time).
    ``concurrency``: client threads (``--threads`` overrides).
    ``duration_s``: length of the measurement window per run; ``steps`` (calls per client)
    replaces it when set (``--duration`` / ``--steps`` override).
    ``warmup``: calls per client before measuring (allocator, cuDNN/cuBLAS heuristics).
    ``run``: one query or step, ``run(*inputs)``. Required for ``train`` (it owns the
    optimizer and loss and should return the loss). For ``serve`` the default copies the
    host inputs to the model's device, runs ``model(*inputs)`` under ``no_grad`` and copies
    the output back to the host - the classic serving loop that leaves the GPU idle.
    """

    model: Any
    inputs: Callable[[int], Any]
    kind: str = "serve"
    concurrency: int = 1
    duration_s: float = 1.0
    steps: int | None = None
    warmup: int = 3
    run: Callable[..., Any] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise BadInputError(f"Workload.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not callable(self.inputs):
            raise BadInputError("Workload.inputs must be a callable inputs(client_index) -> tuple of arguments")
        if self.run is not None and not callable(self.run):
            raise BadInputError("Workload.run must be callable")
        if self.kind == "train" and self.run is None:
            raise BadInputError("a train Workload needs run=step_function (it owns the optimizer and the loss)")
        if int(self.concurrency) < 1:
            raise BadInputError(f"Workload.concurrency must be >= 1, got {self.concurrency}")
        if self.steps is None and not float(self.duration_s) > 0:
            raise BadInputError(f"Workload.duration_s must be > 0, got {self.duration_s}")
        if self.steps is not None and int(self.steps) < 1:
            raise BadInputError(f"Workload.steps must be >= 1, got {self.steps}")
        if int(self.warmup) < 0:
            raise BadInputError(f"Workload.warmup must be >= 0, got {self.warmup}")

    def with_overrides(self, *, threads: int | None = None, duration_s: float | None = None,
                       steps: int | None = None, warmup: int | None = None) -> "Workload":
        """A copy with the CLI's ``--threads/--duration/--steps`` applied (``None`` keeps);
        ``--duration`` clears a module-given ``steps`` and vice versa."""
        kw: dict[str, Any] = {}
        if threads is not None:
            kw["concurrency"] = threads
        if duration_s is not None:
            kw["duration_s"], kw["steps"] = duration_s, None
        if steps is not None:
            kw["steps"] = steps
        if warmup is not None:
            kw["warmup"] = warmup
        return replace(self, **kw) if kw else self


@dataclass
class Measurement:
    """What :func:`measure` measured. Latencies are per call (one query or step, ending
    when its results are on the host / its stream is synchronized), wall-clock on the
    client thread; ``qps`` is calls completed over the measurement window's wall time.

    Percentiles are nearest-rank over all calls of all clients (see :func:`percentile`).
    ``step_ms`` (train) is the mean step time. ``losses`` are the training losses in
    call order of client 0 (float), for checking that a faster step computes the same.
    """

    kind: str
    threads: int
    calls: int
    wall_s: float
    qps: float
    mean_ms: float | None
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    step_ms: float | None = None
    losses: list[float] = field(default_factory=list)
    profiled: str | None = None
    #: the measurement window on the Unix clock (``time.time()``), to line up NVML samples
    window_epoch: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
