"""The built-in backend: CUPTI through ``torch.profiler``, in this process.

Used when Nsight Systems is not installed (or with ``--backend torch``). A plain script
runs through :func:`runpy.run_path` as ``__main__`` (with its own ``sys.argv``) inside a
``torch.profiler.profile`` context; a Workload is driven by the tool inside it. Either
way the result is a Chrome-trace JSON (Kineto) that ``advise`` reads like any other.

Kineto does not record NVTX, so while this backend drives a Workload the tool's phases
are also ``torch.profiler.record_function`` ranges (CPU ``user_annotation`` events),
which the Kineto loader turns into the same named ranges the nsys backend gets from NVTX.
"""

from __future__ import annotations

import contextlib
import runpy
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import BadInputError, RecsysDoctorError, first_line
from .workload import Measurement, Workload, WorkloadError, annotate_with, measure

__all__ = ["require_torch_cuda", "profile_script", "profile_workload"]


def require_torch_cuda() -> Any:
    """torch, when it is installed and sees a CUDA GPU; else :class:`BadInputError`
    saying which of the two is missing."""
    try:
        import torch
    except ImportError:
        raise BadInputError("the torch capture backend needs PyTorch (pip install torch); "
                            "or install Nsight Systems for --backend nsys") from None
    if not torch.cuda.is_available():
        raise BadInputError("no CUDA GPU visible to PyTorch: profile needs a GPU "
                            "(to diagnose an existing trace, use `recsys-doctor advise TRACE`)")
    return torch


@contextlib.contextmanager
def _profiler(torch: Any) -> Iterator[Any]:
    from torch.profiler import ProfilerActivity, profile

    # The profiler's CPU side is thread-local by default: record_function ranges and aten
    # ops of client threads would be lost (only CUPTI's kernels and API calls are
    # process-wide). profile_all_threads (PyTorch >= 2.8) records every thread; the
    # CUDA sync events feed the sync-api analyzer.
    kw: dict[str, Any] = {}
    try:
        from torch._C._profiler import _ExperimentalConfig

        kw["experimental_config"] = _ExperimentalConfig(profile_all_threads=True, enable_cuda_sync_events=True)
    except (ImportError, TypeError):  # older PyTorch: main-thread annotations only
        pass
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=False,
                 with_stack=False, **kw) as prof:
        yield prof
        torch.cuda.synchronize()  # the last kernels' records must reach CUPTI's buffers


@contextlib.contextmanager
def _redirect(log: Path) -> Iterator[None]:
    with open(log, "a", encoding="utf-8", errors="replace") as fh, \
            contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
        yield


def profile_script(script: Path, args: Sequence[str], out_dir: Path) -> Path:
    """Run ``script`` as ``__main__`` under torch.profiler; return the trace JSON path.
    The script's output goes to ``<out_dir>/program.log``. ``sys.exit(0)`` is success;
    any other exit or exception is a :class:`WorkloadError`."""
    torch = require_torch_cuda()
    out = out_dir / "trace.json"
    log = out_dir / "program.log"
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        with _profiler(torch) as prof, _redirect(log):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise WorkloadError(f"{script} exited with status {e.code} (output in {log})") from None
            except (KeyboardInterrupt, RecsysDoctorError):
                raise
            except BaseException as e:  # noqa: BLE001 - anything the user's script raises: a WorkloadError
                raise WorkloadError(f"{script} raised {type(e).__name__}: {first_line(e, with_type=False)} (output in {log})") from e
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path and sys.path[0] == str(script.resolve().parent):
            sys.path.pop(0)
    prof.export_chrome_trace(str(out))
    return out


def profile_workload(wl: Workload, out_dir: Path, **measure_kw: Any) -> tuple[Path, Measurement]:
    """Drive ``wl`` under torch.profiler (warm-up included, so the trace shows every
    phase); return the trace JSON path and the measurement taken under the profiler."""
    torch = require_torch_cuda()
    out = out_dir / "trace.json"
    rf: Callable[[str], Any] = torch.profiler.record_function
    with _profiler(torch) as prof, annotate_with(rf), _redirect(out_dir / "program.log"):
        m = measure(wl, profiled="torch", **measure_kw)
    prof.export_chrome_trace(str(out))
    return out, m
