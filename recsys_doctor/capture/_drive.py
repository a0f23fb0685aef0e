"""Driving a Workload: the client threads, the measurement window, the per-call timing
(:func:`measure`), and the NVTX phases that mark them (:func:`phase`). Re-exported by
:mod:`recsys_doctor.capture.workload`. Nothing here imports torch: it is used only when the
workload already did."""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ContextManager

from ._workload_types import Measurement, Workload
from ..errors import RecsysDoctorError, WorkloadError, first_line

__all__ = ["NVTX_DOMAIN", "annotate_with", "phase", "percentile", "measure"]

#: the NVTX domain of the tool's own phase ranges (``warmup``, ``measure``, ``query``, ``step``)
NVTX_DOMAIN = "recsys_doctor"

# --------------------------------------------------------------------------------------
# phases (NVTX, and torch.profiler annotations for the torch backend)

_annotators: list[Callable[[str], ContextManager[Any]]] = []
_ann_lock = threading.Lock()


@contextlib.contextmanager
def annotate_with(fn: Callable[[str], ContextManager[Any]]) -> Iterator[None]:
    """While active, every :func:`phase` also enters ``fn(name)`` (the torch backend adds
    ``torch.profiler.record_function`` so the phases show up in Kineto traces, which do
    not record NVTX)."""
    with _ann_lock:
        _annotators.append(fn)
    try:
        yield
    finally:
        with _ann_lock:
            _annotators.remove(fn)


class _Range:
    """A reusable NVTX range of one name: push on enter, pop on exit (the event attributes
    are built once, not per call: a phase wraps every query)."""

    __slots__ = ("_domain", "_attributes")

    def __init__(self, domain: Any, attributes: Any) -> None:
        self._domain, self._attributes = domain, attributes

    def __enter__(self) -> None:
        self._domain.push_range(self._attributes)

    def __exit__(self, *exc: Any) -> None:
        self._domain.pop_range()


_NO_RANGE = contextlib.nullcontext()
_ranges: dict[str, ContextManager[Any]] = {}


def _nvtx_range(name: str) -> ContextManager[Any]:
    """The NVTX range ``name`` in the ``recsys_doctor`` domain, made once per name (a
    no-op context without the ``nvtx`` package; the package itself makes it a no-op when
    no profiler is attached)."""
    r = _ranges.get(name)
    if r is None:
        try:
            import nvtx
        except ImportError:
            r = _NO_RANGE
        else:
            domain = nvtx.get_domain(NVTX_DOMAIN)
            r = _Range(domain, domain.get_event_attributes(message=name))
        _ranges[name] = r
    return r


def phase(name: str) -> ContextManager[Any]:
    """An NVTX range named ``name`` in the ``recsys_doctor`` domain (when the ``nvtx``
    package is present), plus any annotators registered with :func:`annotate_with`.
    Without annotators it is one prebuilt push/pop pair: it wraps every query."""
    if not _annotators:
        return _nvtx_range(name)
    return _annotated(name)


@contextlib.contextmanager
def _annotated(name: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        stack.enter_context(_nvtx_range(name))
        for fn in list(_annotators):
            stack.enter_context(fn(name))
        yield


# --------------------------------------------------------------------------------------
# the driver


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least ``q`` percent of the
    values at or below it (``sorted_values[ceil(q/100 * n) - 1]``); no interpolation, so
    the p99 is a latency some call really had."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    k = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return float(sorted_values[k - 1])


def _torch_if_loaded() -> Any:
    """torch when the workload already imported it (never import it ourselves)."""
    return sys.modules.get("torch")


def _no_sync() -> None:
    pass


def _default_sync() -> Callable[[], None]:
    torch = _torch_if_loaded()
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return lambda: torch.cuda.current_stream().synchronize()
    return _no_sync


def _default_serve_query(model: Any) -> Callable[..., Any]:
    """H2D copy of the host inputs, forward, D2H copy of the output (which waits for it)."""
    torch = _torch_if_loaded()
    if torch is None:
        return lambda *a: model(*a)
    try:
        device = next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    def to(x: Any, dev: Any, nb: bool) -> Any:
        if isinstance(x, torch.Tensor):
            return x.to(dev, non_blocking=nb)
        if isinstance(x, (list, tuple)):
            return type(x)(to(v, dev, nb) for v in x)
        if isinstance(x, dict):
            return {k: to(v, dev, nb) for k, v in x.items()}
        return x

    def query(*args: Any) -> Any:
        with torch.no_grad():
            out = model(*to(args, device, True))
            return to(out, torch.device("cpu"), False)

    query.synchronous = True  # type: ignore[attr-defined] # the blocking D2H copy waited for the stream
    return query


def measure(wl: Workload, *, threads: int | None = None, duration_s: float | None = None,
            steps: int | None = None, run: Callable[..., Any] | None = None,
            client_context: Callable[[int], ContextManager[Any]] | None = None,
            sync: Callable[[], None] | None = None,
            clock: Callable[[], float] = time.perf_counter, profiled: str | None = None) -> Measurement:
    """Drive ``wl``: ``threads`` client threads each make their inputs, warm up, then call
    ``run`` back to back for ``duration_s`` (or exactly ``steps`` calls each), timing
    every call from its start until ``sync()`` returns (default: the calling thread's
    current CUDA stream is synchronized when torch with CUDA is in use, unless the call
    has a true ``synchronous`` attribute: it returns only once its GPU work is done and
    its results are on the host, as the default serving query and a
    :func:`~recsys_doctor.runtime.serve` model do, so a synchronize after it would only
    add a wait for nothing).

    NVTX phases: ``warmup`` (per client), ``measure`` (the window, on the calling
    thread) and one ``query`` (serve) or ``step`` (train) range per call.

    Hooks for the stream-group runtime: ``run`` replaces the workload's call (same
    arguments), ``client_context(k)`` is entered by client thread ``k`` around its warm-up
    and measurement. An exception in any client stops the run and is raised as
    :class:`WorkloadError`.
    """
    wl = wl.with_overrides(threads=threads, duration_s=duration_s, steps=steps)
    drive = _Drive(wl, run or wl.run or _default_serve_query(wl.model), client_context, sync, clock)
    drive.run()
    return drive.result(profiled)


class _Drive:
    """One run of :func:`measure`: the client threads and what they record."""

    def __init__(self, wl: Workload, call: Callable[..., Any],
                 client_context: Callable[[int], ContextManager[Any]] | None,
                 sync: Callable[[], None] | None, clock: Callable[[], float]) -> None:
        self.wl, self.call, self.client_context, self.sync, self.clock = wl, call, client_context, sync, clock
        self.n = int(wl.concurrency)
        self.unit = "query" if wl.kind == "serve" else "step"
        self.lat: list[list[float]] = [[] for _ in range(self.n)]
        self.losses: list[Any] = []
        self.errors: list[BaseException] = []
        self.stop_at = math.inf
        self.epoch: list[float] = []  # the window on the Unix clock
        self.opened: float | None = None  # the window's start on ``clock``: the barrier opened
        self.ends: list[float] = []  # each client's last call end
        self.barrier = threading.Barrier(self.n + 1, action=self._open_window)

    def _open_window(self) -> None:  # run by the barrier once every client has warmed up
        self.epoch.append(time.time())
        self.opened = self.clock()
        if self.wl.steps is None:
            self.stop_at = self.opened + float(self.wl.duration_s)

    def run(self) -> None:
        """Start the clients, open the window when all have warmed up, wait for them; an
        exception in any client is raised here."""
        workers = [threading.Thread(target=self._client, args=(k,), name=f"client-{k}", daemon=True)
                   for k in range(self.n)]
        for w in workers:
            w.start()
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            pass
        with phase("measure"):
            for w in workers:
                w.join()
        self.epoch.append(time.time())
        if self.errors:
            e = self.errors[0]
            if isinstance(e, (RecsysDoctorError, KeyboardInterrupt)):
                raise e
            raise WorkloadError(f"{self.wl.name or 'workload'}: a client thread raised {first_line(e)}") from e

    def _client(self, k: int) -> None:
        try:
            with self.client_context(k) if self.client_context else contextlib.nullcontext():
                args = self.wl.inputs(k)
                args = args if isinstance(args, tuple) else (args,)
                with phase("warmup"):
                    for _ in range(int(self.wl.warmup)):
                        self.call(*args)
                    self._sync()()
                do_sync = self._sync()  # CUDA may be initialized only now
                self.barrier.wait()
                self._calls(k, args, do_sync)
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:  # noqa: BLE001 - reported on the calling thread
            self.errors.append(e)
            self.barrier.abort()

    def _sync(self) -> Callable[[], None]:
        """What ends a timed call: the given ``sync``, nothing for a synchronous call, else
        the calling thread's current stream synchronized."""
        if self.sync is not None:
            return self.sync
        if getattr(self.call, "synchronous", False):
            return _no_sync
        return _default_sync()

    def _calls(self, k: int, args: tuple[Any, ...], do_sync: Callable[[], None]) -> None:
        """Client ``k``'s calls in the window, back to back, each timed until ``do_sync`` returns."""
        clock, fixed, mine = self.clock, self.wl.steps, self.lat[k]
        keep_loss = k == 0 and self.wl.kind == "train"
        i = 0
        while (i < fixed) if fixed is not None else (clock() < self.stop_at):
            t0 = clock()
            with phase(self.unit):
                out = self.call(*args)
                do_sync()
            mine.append(clock() - t0)
            if keep_loss:
                self.losses.append(out)
            i += 1
        self.ends.append(clock())

    def result(self, profiled: str | None) -> Measurement:
        # the window: from the moment every client was released (before any timed call
        # started) to the last call's end, so a timed window is never shorter than asked
        wall = (max(self.ends) - self.opened) if self.ends and self.opened is not None else 0.0
        all_l = sorted(x for row in self.lat for x in row)
        ms = [x * 1e3 for x in all_l]
        lat0 = self.lat[0]
        return Measurement(
            kind=self.wl.kind, threads=self.n, calls=len(all_l), wall_s=wall,
            qps=(len(all_l) / wall) if wall > 0 else 0.0,
            mean_ms=statistics.fmean(ms) if ms else None,
            p50_ms=percentile(ms, 50) if ms else None,
            p99_ms=percentile(ms, 99) if ms else None,
            max_ms=ms[-1] if ms else None,
            step_ms=(statistics.fmean(x * 1e3 for x in lat0) if lat0 else None) if self.wl.kind == "train" else None,
            losses=[_to_float(v) for v in self.losses],
            profiled=profiled,
            window_epoch=self.epoch[-2:] if len(self.epoch) >= 2 else [],
        )


def _to_float(v: Any) -> float:
    if isinstance(v, (tuple, list)) and v:
        v = v[0]
    try:
        return float(v.item() if hasattr(v, "item") else v)
    except (TypeError, ValueError):
        return math.nan
