"""PyTorch profiler / Kineto Chrome-trace JSON -> canonical :class:`~recsys_doctor.model.Trace`.

What the loader copes with (all seen in real traces from torch 1.8 to 2.9, see
``shared/traces/kineto/FORMAT.md``):

* plain or gzip-compressed JSON (detected by the ``1f 8b`` magic, not the extension);
  a ``{"traceEvents": [...]}`` object or, in torch 1.8, a bare JSON array of events;
* legacy category names (``Kernel``, ``Memcpy``, ``Memset``, ``Runtime``, ``Operator``)
  and modern ones (``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_runtime``,
  ``cuda_driver``, ``cpu_op``, ``user_annotation``, ``cuda_sync``);
* string thread ids (``"4093687616"``) and GPU rows named ``"stream 7"``;
* integer-µs epoch timestamps, float-µs epoch timestamps with ns digits, and float µs
  relative to ``baseTimeNanoseconds``.

Time: ``ts``/``dur`` are always microseconds whatever ``displayTimeUnit`` says. They
become integer ns exactly, from the number's own decimal digits (float64 resolves only
~0.25 µs at 1.7e15 µs; see :mod:`._kineto_time`): ``start = ts - ts0`` where ``ts0`` is
the earliest ``ts`` among the loaded events (so the earliest event starts at 0), and
``end = start + dur`` (a missing or negative ``dur`` is 0). A ``ts`` or ``dur`` that is
not finite or does not fit int64 ns (``Infinity``, ``1e29``) is refused in one line
naming the event. ``meta["origin_ns_epoch"]`` says where 0 is on the Unix clock when
the trace lets us know.

GPU events carry ``pid`` = device index, so their ``pid`` column is replaced by the
host process that issued the matching runtime/driver call (same ``correlation``);
failing that (launched before the profiling window opened), the only CPU process of
the trace; failing that, -1. (A Kineto file is one process in practice; were two
processes to reuse a correlation id, the first launch seen wins.) Those unmatched GPU events are normal, not errors: their
number is in ``meta["unmatched_gpu_events"]``.

Kineto has no interval for a CUDA-graph execution, so ``graphs`` stays empty; kernels,
copies and memsets whose ``(pid, correlation)`` belongs to a ``cudaGraphLaunch``
carry ``in_graph = True`` instead.

``gpu_user_annotation`` (the GPU-side projection of record_function ranges),
``python_function`` (with_stack), ``overhead`` and the profiler's own ``Trace`` span
are not loaded into ``ranges``, which holds CPU-thread annotations only; their counts
are in ``meta["skipped_categories"]`` and the profiler span, when present, in
``meta["profiler_window_ns"]``.
"""

from __future__ import annotations

import gc
import os
from functools import partial
from typing import Any

import pandas as pd

from .._util.fork import run_in_two
from ..errors import TraceFormatError
from ..model import Trace
from .._util.progress import ProgressHandle
from . import _kineto_decode as decode
from ._kineto_columns import EventColumns, int_col, num
from ._kineto_decode import Event
from ._kineto_time import BadTime, NeedExact
from ._kineto_tables import HostLink, Tables, copy_kind_from_name

__all__ = ["load_kineto_json", "copy_kind_from_name"]

#: traces with at least this many events build their ranges and their other tables in two
#: processes (where a second CPU is ours)
PARALLEL_EVENTS = 500_000

# Above this a ts in µs is on the Unix epoch (1e14 µs is 1973); below it, it is relative.
_EPOCH_US_THRESHOLD = 1e14


def load_kineto_json(path: str | os.PathLike[str], *, progress: ProgressHandle | None = None) -> Trace:
    """Load a PyTorch profiler (Kineto) JSON trace, plain or gzip-compressed.
    ``progress`` follows the bytes decoded on large files.

    Raises :class:`~recsys_doctor.errors.TraceFormatError` (one line naming the file and
    the problem) for corrupt gzip, invalid or truncated JSON, and JSON that is not a
    trace. A trace with an empty ``traceEvents`` list loads as a trace with no events; a
    bare empty array (``[]``) is refused: nothing in it says it is a trace.
    """
    p = os.fspath(path)
    # the decoded structs are left out of the cyclic GC, but pandas and numpy allocate
    # plenty of containers on the way; none is garbage, so do not rescan them
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _load(p, progress)
    except BadTime as e:
        raise TraceFormatError(f"{p}: {e}") from None
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        # values of a type no profiler writes (a list where a number belongs, ...)
        raise TraceFormatError(f"{p}: unexpected value in trace events ({type(e).__name__}: {e})") from None
    finally:
        if gc_was_enabled:
            gc.enable()


def _load(path: str, progress: ProgressHandle | None) -> Trace:
    """Decode the events into columns (streamed when large), then build the tables."""
    top, is_array, cols = _decode(path, progress)
    if is_array and cols.n_events == 0:  # nothing says it is a trace at all
        raise TraceFormatError(f"{path}: an empty JSON array, no trace events: a PyTorch profiler trace is "
                               "an object with 'traceEvents' or (torch 1.8) an array of events")
    tables = Tables(cols)
    tasks = [partial(_ranges_part, tables), partial(_calls_and_gpu_part, tables)]
    if cols.n_events >= PARALLEL_EVENTS:  # a forked process builds one of the two parts
        parts = run_in_two(tasks)
    else:
        parts = [t() for t in tasks]
    (ranges,), (api, kernels, memcpys, memsets, syncs, cpu_pids) = (p[0] for p in parts)
    for _, dropped, unmatched in parts:
        tables.dropped += dropped
        tables.unmatched.update(unmatched)
    threads, process_names = _threads(cols.meta_events, set(cpu_pids))
    used_devices = sorted({int(d) for df in (kernels, memcpys, memsets, syncs) if len(df)
                           for d in df["device"].unique() if d >= 0})
    meta = _meta(top, is_array, tables, process_names)
    return Trace(path=path, format="kineto-json", kernels=kernels, memcpys=memcpys, memsets=memsets,
                 api=api, syncs=syncs, ranges=ranges, threads=threads, devices=_devices(top, used_devices),
                 meta=meta)


def _decode(path: str, progress: ProgressHandle | None) -> tuple[dict[str, Any], bool, EventColumns]:
    """The events as columns (streamed when large). Float literals are decoded as floats,
    or as their text where a float ts of 2**40 µs or more is met (:class:`NeedExact`: the
    decoding starts again; the start of the file is looked at first to spare that)."""
    exact = decode.needs_exact(path)
    while True:
        try:
            with decode.exact_floats(exact):
                streamed = decode.load_streamed(path, EventColumns, progress)
                if streamed is not None:
                    return streamed
                cols = EventColumns()
                return (*decode.decode_whole(path, cols), cols)
        except NeedExact:
            if exact:  # (float literals are text then: never)
                raise
            exact = True


def _ranges_part(tables: Tables) -> tuple[tuple[pd.DataFrame], int, dict[str, int]]:
    """The ranges table, with the rows it dropped and (none) unmatched: one of the two
    independent parts of the tables (:func:`_load` may build them in two processes, so
    each works on its own copy of the counters and returns them)."""
    t = tables.fresh()
    return (t.ranges(),), t.dropped, t.unmatched


def _calls_and_gpu_part(tables: Tables) -> tuple[tuple[Any, ...], int, dict[str, int]]:
    """The API calls and the GPU tables (each GPU event's host process is found through
    the calls), with the CPU processes, the rows dropped and the GPU events unmatched."""
    t = tables.fresh()
    api = t.api()
    # the host process of a GPU event no call links to: the only CPU process, else -1
    api_pids = {int(x) for x in api["pid"].unique()} if len(api) else set()
    cpu_pids = sorted(p for p in api_pids | t.range_pids() if p >= 0)
    link = HostLink(api, cpu_pids[0] if len(cpu_pids) == 1 else -1)
    gpu = (t.kernels(link), t.memcpys(link), t.memsets(link), t.syncs(link))
    return (api, *gpu, cpu_pids), t.dropped, t.unmatched


def _threads(meta_events: list[Event], cpu_pids: set[int]) -> tuple[pd.DataFrame, dict[str, str]]:
    """CPU thread names from ``thread_name`` metadata. GPU rows (``"stream 7 "``,
    ``"Device 0"``) and pseudo rows of processes with no CPU events are left out;
    when a thread is renamed (``pt_main_thread`` -> ``pt_autograd_0``) the last name wins."""
    rows: dict[tuple[int, int], str] = {}
    procs: dict[str, str] = {}
    for e in meta_events:
        kind = e.name
        if kind not in ("thread_name", "process_name"):
            continue
        name = e.args.name if e.args is not None else None
        pid = int(int_col(num([e.pid]), -1)[0])
        if pid not in cpu_pids or not isinstance(name, str):
            continue
        if kind == "process_name":
            procs[str(pid)] = name
        elif not name.startswith(("stream ", "Device ")):
            rows[(pid, int(int_col(num([e.tid]), -1)[0]))] = name
    if not rows:
        return pd.DataFrame(), procs
    return pd.DataFrame([(p, t, n) for (p, t), n in rows.items()], columns=["pid", "tid", "name"]), procs


def _devices(top: dict[str, Any], used: list[int]) -> pd.DataFrame:
    """GPUs that appear in GPU events; name/SM count from ``deviceProperties``, which
    lists every visible GPU, not only the traced one."""
    if not used:
        return pd.DataFrame()
    props: dict[int, dict] = {}
    dp = top.get("deviceProperties")
    if isinstance(dp, list):
        for i, d in enumerate(dp):
            if isinstance(d, dict):
                did = d.get("id", i)
                try:
                    props[int(did)] = d
                except (TypeError, ValueError):
                    continue
    rows = []
    for d in used:
        p = props.get(d, {})
        name = p.get("name")
        rows.append({"device": d, "name": name if isinstance(name, str) else None, "sm_count": p.get("numSms")})
    return pd.DataFrame(rows)


def _meta(top: dict[str, Any], is_array: bool, tables: Tables, process_names: dict[str, str]) -> dict[str, Any]:
    cols = tables.cols
    meta: dict[str, Any] = {"tool": "pytorch-profiler", "container": "array" if is_array else "object",
                            "events": cols.n_events}
    for k in ("schemaVersion", "displayTimeUnit", "baseTimeNanoseconds", "trace_id", "cupti_version",
              "cuda_runtime_version", "cuda_driver_version"):
        v = top.get(k)
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            meta[k] = v
    di = top.get("distributedInfo")
    if isinstance(di, dict):
        for k in ("rank", "world_size", "backend"):
            if isinstance(di.get(k), (str, int)):
                meta[k] = di[k]
    meta.update(_time_base(top.get("baseTimeNanoseconds"), tables))
    unmatched = tables.unmatched
    meta["unmatched_gpu_events"] = int(sum(unmatched.get(k, 0) for k in ("kernel", "memcpy", "memset")))
    meta["unmatched_gpu_events_by_table"] = {
        t: unmatched.get(k, 0) for t, k in (("kernels", "kernel"), ("memcpys", "memcpy"), ("memsets", "memset"))
    }
    if cols.skipped:
        meta["skipped_categories"] = dict(sorted(cols.skipped.items()))
    if tables.dropped:
        meta["dropped_events_without_ts"] = tables.dropped
    if process_names:
        meta["process_names"] = process_names
    return meta


def _time_base(base: Any, tables: Tables) -> dict[str, Any]:
    """Where 0 is: ``origin_us`` (the earliest ts), on the Unix clock when the trace says."""
    t0_ns = tables.t0_ns
    if t0_ns is None:
        return {"time_base": "none"}
    t0 = t0_ns / 1000
    out: dict[str, Any] = {"origin_us": t0}
    if t0 >= _EPOCH_US_THRESHOLD:
        out |= {"time_base": "epoch", "origin_ns_epoch": t0_ns}
    elif isinstance(base, int) and not isinstance(base, bool):
        out |= {"time_base": "baseTimeNanoseconds", "origin_ns_epoch": base + t0_ns}
    else:
        out |= {"time_base": "unknown", "origin_ns_epoch": None}
    if tables.cols.size("trace"):
        s, e, valid = tables.ns("trace")
        if valid[0]:
            out["profiler_window_ns"] = [int(s[0]), int(e[0])]
    return out
