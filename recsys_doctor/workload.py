"""The Workload protocol: a model the tool can drive itself, and measure exactly.

``recsys-doctor profile model.py`` accepts two kinds of ``model.py``:

* a plain script, profiled as it is (the tool only watches it);
* a *workload module*: a file with a top-level ``def workload(...)`` returning a
  :class:`Workload`. Then the tool drives the load itself (client threads, warm-up,
  measurement window), marks every phase with NVTX ranges, and measures queries/s and
  p50/p99 latency (serving) or step time (training) per call, not estimated from a trace.

The driver (:func:`measure`) is deliberately small and has two hooks for the stream-group
runtime: ``run`` replaces the per-query callable (e.g. a :func:`recsys_doctor.runtime.serve`
``ServedModel``, which takes host tensors and returns host tensors, the same contract as
the default serving query here), and ``client_context`` wraps each client thread (e.g. to
enter a stream group). Nothing here imports torch at module import time.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ContextManager

from .errors import BadInputError, RecsysDoctorError, WorkloadError, first_line

__all__ = [
    "Workload",
    "Measurement",
    "WorkloadError",
    "KINDS",
    "NVTX_DOMAIN",
    "load_workload",
    "is_workload_module",
    "measure",
    "percentile",
    "phase",
]

#: what a workload can be
KINDS = ("serve", "train")
#: the NVTX domain of the tool's own phase ranges (``warmup``, ``measure``, ``query``, ``step``)
NVTX_DOMAIN = "recsys_doctor"


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


# --------------------------------------------------------------------------------------
# loading


def is_workload_module(path: str | Path) -> bool:
    """True when ``path`` defines a top-level ``workload`` function or name - decided by
    parsing, not importing, so a plain script is never executed just to find out."""
    p = _check_file(path)
    try:
        tree = ast.parse(p.read_bytes(), filename=str(p))
    except SyntaxError as e:
        raise BadInputError(f"{p}: not valid Python (line {e.lineno}: {e.msg})") from None
    except ValueError as e:  # null bytes
        raise BadInputError(f"{p}: not a Python source file ({e})") from None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "workload":
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "workload" for t in node.targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == "workload" for a in node.names):
            return True
    return False


def load_workload(path: str | Path, args: Sequence[str] = ()) -> Workload:
    """Import the module file ``path`` and call its ``workload()``.

    The module's folder goes first on ``sys.path`` (as when Python runs a script), so a
    workload can import its neighbours. ``workload`` is called with ``list(args)`` when it
    takes a parameter (the ``-- ARGS`` of the command line), else without; passing ARGS to
    one that takes none is an error rather than silently ignored.
    """
    p = _check_file(path).resolve()
    name = f"_recsys_doctor_workload_{abs(hash(str(p))):x}"
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise BadInputError(f"{p}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = str(p.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise BadInputError(f"{p}: not valid Python (line {e.lineno}: {e.msg})") from None
    except (KeyboardInterrupt, RecsysDoctorError):
        sys.modules.pop(name, None)
        raise
    except BaseException as e:  # noqa: BLE001 - anything the user's module raises, incl. SystemExit
        sys.modules.pop(name, None)
        raise WorkloadError(f"{p}: importing it raised {first_line(e)}") from e
    fn = getattr(module, "workload", None)
    if fn is None:
        raise BadInputError(f"{p}: has no workload() function (a plain script is profiled as it is; "
                            "see docs/profile.md for the Workload protocol)")
    if not callable(fn):
        raise BadInputError(f"{p}: workload is not a function")
    try:
        takes_args = _takes_one_positional(fn)
    except (TypeError, ValueError):
        takes_args = False
    if args and not takes_args:
        raise BadInputError(f"{p}: workload() takes no arguments, but arguments were given after --: {' '.join(args)}")
    try:
        wl = fn(list(args)) if takes_args else fn()
    except (KeyboardInterrupt, RecsysDoctorError):
        raise
    except BaseException as e:  # noqa: BLE001
        raise WorkloadError(f"{p}: workload() raised {first_line(e)}") from e
    if not isinstance(wl, Workload):
        raise BadInputError(f"{p}: workload() returned {type(wl).__name__}, expected a recsys_doctor.workload.Workload")
    if not wl.name:
        wl.name = p.stem
    return wl


def _takes_one_positional(fn: Callable[..., Any]) -> bool:
    params = list(inspect.signature(fn).parameters.values())
    return any(q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD, q.VAR_POSITIONAL) for q in params)


def _check_file(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise BadInputError(f"{p}: no such file")
    if p.is_dir():
        raise BadInputError(f"{p}: is a directory, expected a Python file (a script or a workload module)")
    return p


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


def _nvtx_annotate() -> Callable[[str], ContextManager[Any]] | None:
    try:
        import nvtx
    except ImportError:
        return None
    return lambda name: nvtx.annotate(name, domain=NVTX_DOMAIN)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """An NVTX range named ``name`` in the ``recsys_doctor`` domain (when the ``nvtx``
    package is present), plus any annotators registered with :func:`annotate_with`."""
    with contextlib.ExitStack() as stack:
        nv = _nvtx_annotate()
        if nv is not None:
            stack.enter_context(nv(name))
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


def _default_sync() -> Callable[[], None]:
    torch = _torch_if_loaded()
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return lambda: torch.cuda.current_stream().synchronize()
    return lambda: None


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

    return query


def measure(wl: Workload, *, threads: int | None = None, duration_s: float | None = None,
            steps: int | None = None, run: Callable[..., Any] | None = None,
            client_context: Callable[[int], ContextManager[Any]] | None = None,
            sync: Callable[[], None] | None = None,
            clock: Callable[[], float] = time.perf_counter, profiled: str | None = None) -> Measurement:
    """Drive ``wl``: ``threads`` client threads each make their inputs, warm up, then call
    ``run`` back to back for ``duration_s`` (or exactly ``steps`` calls each), timing
    every call from its start until ``sync()`` returns (default: the calling thread's
    current CUDA stream is synchronized when torch with CUDA is in use).

    NVTX phases: ``warmup`` (per client), ``measure`` (the window, on the calling
    thread) and one ``query`` (serve) or ``step`` (train) range per call.

    Hooks for the stream-group runtime: ``run`` replaces the workload's call (same
    arguments), ``client_context(k)`` is entered by client thread ``k`` around its warm-up
    and measurement. An exception in any client stops the run and is raised as
    :class:`WorkloadError`.
    """
    wl = wl.with_overrides(threads=threads, duration_s=duration_s, steps=steps)
    n = int(wl.concurrency)
    call = run or wl.run or _default_serve_query(wl.model)
    unit = "query" if wl.kind == "serve" else "step"
    lat: list[list[float]] = [[] for _ in range(n)]
    losses: list[Any] = []
    errors: list[BaseException] = []
    stop_at = [math.inf]
    fixed = wl.steps

    epoch: list[float] = []

    def open_window() -> None:  # run by the barrier once every client has warmed up
        epoch.append(time.time())
        if fixed is None:
            stop_at[0] = clock() + float(wl.duration_s)

    barrier = threading.Barrier(n + 1, action=open_window)
    span: list[tuple[float, float]] = []

    def client(k: int) -> None:
        try:
            ctx = client_context(k) if client_context else contextlib.nullcontext()
            with ctx:
                args = wl.inputs(k)
                args = args if isinstance(args, tuple) else (args,)
                do_sync = sync or _default_sync()
                with phase("warmup"):
                    for _ in range(int(wl.warmup)):
                        call(*args)
                    do_sync()
                do_sync = sync or _default_sync()  # CUDA may be initialized only now
                barrier.wait()
                i = 0
                mine = lat[k]
                first = clock()
                while (i < fixed) if fixed is not None else (clock() < stop_at[0]):
                    t0 = clock()
                    with phase(unit):
                        out = call(*args)
                        do_sync()
                    mine.append(clock() - t0)
                    if k == 0 and wl.kind == "train":
                        losses.append(out)
                    i += 1
                span.append((first, clock()))
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:  # noqa: BLE001 - reported on the calling thread
            errors.append(e)
            barrier.abort()

    workers = [threading.Thread(target=client, args=(k,), name=f"client-{k}", daemon=True) for k in range(n)]
    for w in workers:
        w.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    with phase("measure"):
        for w in workers:
            w.join()
    epoch.append(time.time())
    # the window: first call started to last call ended, over all clients
    wall = (max(e for _, e in span) - min(b for b, _ in span)) if span else 0.0
    if errors:
        e = errors[0]
        if isinstance(e, (RecsysDoctorError, KeyboardInterrupt)):
            raise e
        raise WorkloadError(f"{wl.name or 'workload'}: a client thread raised {first_line(e)}") from e
    all_l = sorted(x for row in lat for x in row)
    ms = [x * 1e3 for x in all_l]
    return Measurement(
        kind=wl.kind, threads=n, calls=len(all_l), wall_s=wall,
        qps=(len(all_l) / wall) if wall > 0 else 0.0,
        mean_ms=statistics.fmean(ms) if ms else None,
        p50_ms=percentile(ms, 50) if ms else None,
        p99_ms=percentile(ms, 99) if ms else None,
        max_ms=ms[-1] if ms else None,
        step_ms=(statistics.fmean(x * 1e3 for x in lat[0]) if lat[0] else None) if wl.kind == "train" else None,
        losses=[_to_float(v) for v in losses],
        profiled=profiled,
        window_epoch=epoch[-2:] if len(epoch) >= 2 else [],
    )


def _to_float(v: Any) -> float:
    if isinstance(v, (tuple, list)) and v:
        v = v[0]
    try:
        return float(v.item() if hasattr(v, "item") else v)
    except (TypeError, ValueError):
        return math.nan
