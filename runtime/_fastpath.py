"""The driver calls of the per-query hot path, made where the GIL costs least.

``cuda.bindings`` releases the Python interpreter lock (GIL) around every driver call.
For a wait that is right; for a 2-microsecond ``cuGraphLaunch`` it is not: with 8 client
threads every release hands the GIL to another thread, and getting it back costs more
than the call itself (on the H100 the runtime reached 0.40x of a hand-rolled graph
server this way, issue 8). So the hot path calls ``libcuda`` through :mod:`ctypes`:

* launches, event records and event queries through a :class:`ctypes.PyDLL` handle,
  which keeps the GIL for the call (microseconds, never blocking);
* the one blocking wait of a query, ``cuEventSynchronize``, through a
  :class:`ctypes.CDLL` handle, which releases the GIL while the GPU works.

That is one GIL hand-off per query, as in a hand-written ``graph.replay()`` +
``stream.synchronize()`` loop. Results are checked like every other call
(:func:`recsys_doctor.runtime._cuda.describe` names the error). Where ``libcuda`` cannot
be loaded by name (an unusual install), :func:`driver_fastpath` falls back to
``cuda.bindings`` with the same interface, so behaviour never depends on this module,
only speed.

``RECSYS_DOCTOR_LAUNCH=release-gil`` makes launches and records release the GIL too (the
wait always does): for measuring which is better on a given machine and driver
(``bench/serving/serve_anchors.py`` records the setting with its numbers).

No compiled extension is needed: the entry points used here have had the same C ABI since
CUDA 10 (``cuMemcpyHtoDAsync_v2`` is the versioned name the CUDA headers map to).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any, Callable

from ..errors import RuntimeCudaError

__all__ = ["DriverFastPath", "driver_fastpath", "LIBCUDA_NAMES", "ENV_LAUNCH"]

#: environment variable: ``keep-gil`` (default) or ``release-gil`` for launches/records
ENV_LAUNCH = "RECSYS_DOCTOR_LAUNCH"

#: names tried, in order, when loading the driver library
LIBCUDA_NAMES = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")

_NOT_READY = 600  # CUDA_ERROR_NOT_READY


def _raise(rc: int, what: str) -> None:
    from ._cuda import describe

    try:
        from cuda.bindings import driver

        err: Any = driver.CUresult(rc)
    except Exception:  # noqa: BLE001 - an unknown code still gets its number
        err = rc
    raise RuntimeCudaError(f"{what} failed: {describe(err)}")


class DriverFastPath:
    """Hot-path driver calls taking and returning plain integers (handles as ``int``).

    ``launch(graph_exec, stream)``, ``record(event, stream)``,
    ``htod(dst_ptr, src_ptr, nbytes, stream)``, ``dtoh(...)`` keep the GIL; ``wait(event)`` releases it;
    ``ready(event)`` is a non-blocking query (True when the event has completed).
    ``source`` says which path is in use: ``"ctypes"`` or ``"cuda.bindings"``.
    """

    def __init__(self, lib_name: str | None = None, release_gil_on_launch: bool = False) -> None:
        self.source = "ctypes" + (" (launch releases the GIL)" if release_gil_on_launch else "")
        self.library: str | None = None
        errors = []
        for name in ((lib_name,) if lib_name else LIBCUDA_NAMES):
            try:
                keep = ctypes.PyDLL(name)
                release = ctypes.CDLL(name)
                self.library = name
                break
            except OSError as e:
                errors.append(f"{name}: {e}")
        else:
            raise OSError("; ".join(errors) or "no driver library name to try")
        vp, i64, sz = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t
        short = release if release_gil_on_launch else keep
        self._launch = self._fn(short, "cuGraphLaunch", (vp, vp))
        self._record = self._fn(short, "cuEventRecord", (vp, vp))
        self._query = self._fn(keep, "cuEventQuery", (vp,))
        self._htod = self._fn(keep, "cuMemcpyHtoDAsync_v2", (i64, vp, sz, vp))
        self._dtoh = self._fn(keep, "cuMemcpyDtoHAsync_v2", (vp, i64, sz, vp))
        self._wait = self._fn(release, "cuEventSynchronize", (vp,))

    @staticmethod
    def _fn(lib: Any, name: str, argtypes: tuple[Any, ...]) -> Callable[..., int]:
        f = getattr(lib, name)
        f.argtypes = list(argtypes)
        f.restype = ctypes.c_int
        return f

    def launch(self, graph_exec: int, stream: int) -> None:
        rc = self._launch(graph_exec, stream)
        if rc:
            _raise(rc, "cuGraphLaunch")

    def record(self, event: int, stream: int) -> None:
        rc = self._record(event, stream)
        if rc:
            _raise(rc, "cuEventRecord")

    def htod(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        rc = self._htod(dst, src, nbytes, stream)
        if rc:
            _raise(rc, "cuMemcpyHtoDAsync")

    def dtoh(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        rc = self._dtoh(dst, src, nbytes, stream)
        if rc:
            _raise(rc, "cuMemcpyDtoHAsync")

    def wait(self, event: int) -> None:
        rc = self._wait(event)
        if rc:
            _raise(rc, "cuEventSynchronize")

    def ready(self, event: int) -> bool:
        rc = self._query(event)
        if rc == 0:
            return True
        if rc == _NOT_READY:
            return False
        _raise(rc, "cuEventQuery")
        return False  # pragma: no cover - _raise always raises


class _BindingsFastPath(DriverFastPath):
    """The same interface on ``cuda.bindings`` (releases the GIL on every call)."""

    def __init__(self) -> None:  # noqa: D107 - no library to load
        from cuda.bindings import driver as d

        self.source = "cuda.bindings"
        self.library = None

        def rc(r: Any) -> int:
            return int(r[0] if isinstance(r, tuple) else r)

        self._launch = lambda g, s: rc(d.cuGraphLaunch(d.CUgraphExec(g), d.CUstream(s)))
        self._record = lambda e, s: rc(d.cuEventRecord(d.CUevent(e), d.CUstream(s)))
        self._query = lambda e: rc(d.cuEventQuery(d.CUevent(e)))
        self._htod = lambda dst, src, n, s: rc(d.cuMemcpyHtoDAsync(dst, src, n, d.CUstream(s)))
        self._dtoh = lambda dst, src, n, s: rc(d.cuMemcpyDtoHAsync(dst, src, n, d.CUstream(s)))
        self._wait = lambda e: rc(d.cuEventSynchronize(d.CUevent(e)))


_lock = threading.Lock()
_instance: DriverFastPath | None = None


def driver_fastpath() -> DriverFastPath:
    """The process-wide hot-path driver calls: ctypes on ``libcuda`` where it loads, else
    ``cuda.bindings``."""
    global _instance
    with _lock:
        if _instance is None:
            import os

            mode = os.environ.get(ENV_LAUNCH, "keep-gil")
            if mode not in ("keep-gil", "release-gil"):
                raise RuntimeCudaError(f"{ENV_LAUNCH} must be keep-gil or release-gil, got {mode!r}")
            try:
                _instance = DriverFastPath(release_gil_on_launch=mode == "release-gil")
            except (OSError, AttributeError):
                _instance = _BindingsFastPath()
        return _instance
