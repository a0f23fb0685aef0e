"""The one place where CUDA results are checked.

Every call the runtime makes into ``cuda.bindings`` goes through :func:`check` (directly or
via :func:`call`). A failure raises :class:`~recsys_doctor.errors.RuntimeCudaError` whose
message names the call, the error's enum name and number, and what it means. The meaning
comes from the enum member's docstring that ``cuda.bindings`` ships, so formatting works on
a machine with no driver at all (the CPU CI box), and from ``cuGetErrorString`` where a
driver is loaded and the docstring is missing.

``cuda.core`` objects raise their own exceptions; :func:`translating` turns those into the
same error class, naming the operation.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

from ..errors import RuntimeCudaError

__all__ = ["check", "call", "describe", "translating", "ensure_context", "torch_module"]


def _success_values() -> tuple[Any, ...]:
    from cuda.bindings import driver, runtime

    return (driver.CUresult.CUDA_SUCCESS, runtime.cudaError_t.cudaSuccess)


def describe(err: Any) -> str:
    """``NAME (number): meaning`` for a ``CUresult`` / ``cudaError_t`` / ``nvrtcResult``."""
    name = getattr(err, "name", None) or str(err)
    try:
        num = int(err)
    except (TypeError, ValueError):
        num = None
    meaning = " ".join((getattr(err, "__doc__", None) or "").split())
    # An enum *class* docstring (not a member's) is generic; ignore it.
    generic = type(err).__doc__
    if meaning and generic and meaning == " ".join(generic.split()):
        meaning = ""
    if not meaning:
        try:  # needs a loaded driver; the CPU box has none
            from cuda.bindings import driver

            res, s = driver.cuGetErrorString(err)
            if res == driver.CUresult.CUDA_SUCCESS and s:
                meaning = s.decode() if isinstance(s, bytes) else str(s)
        except Exception:  # noqa: BLE001 - only the wording is lost: the name and number stay
            meaning = ""
    head = f"{name} ({num})" if num is not None else name
    return f"{head}: {meaning}" if meaning else head


def check(result: Any, call_name: str) -> Any:
    """Check the result of one ``cuda.bindings`` call and return its payload.

    ``cuda.bindings`` functions return either a bare error enum or a tuple
    ``(error, value, ...)``. Returns ``None``, the single value, or the tuple of values.
    Raises :class:`RuntimeCudaError` naming ``call_name`` when the error is not success.
    """
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err not in _SUCCESS:
        raise RuntimeCudaError(f"{call_name} failed: {describe(err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``check(fn(*args), fn.__name__)``: run one ``cuda.bindings`` function, checked."""
    return check(fn(*args), getattr(fn, "__name__", repr(fn)))


@contextlib.contextmanager
def translating(what: str) -> Iterator[None]:
    """Turn an exception raised inside ``cuda.core`` into :class:`RuntimeCudaError`."""
    try:
        yield
    except RuntimeCudaError:
        raise
    except Exception as e:  # noqa: BLE001 - cuda.core raises CUDAError / RuntimeError subclasses: re-raised typed
        raise RuntimeCudaError(f"{what} failed: {e}") from e


_tls = threading.local()


def torch_module() -> Any:
    """``torch``, imported on first use (the runtime package imports without it)."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        from ..errors import BadInputError

        raise BadInputError("the PyTorch adapter needs torch (pip install 'recsys-doctor[torch]')") from e
    return torch


def ensure_context(ctx: Any) -> None:
    """Make ``ctx`` (a ``CUcontext``) current on the calling thread, once per thread.

    Driver-API calls (``cuGraphLaunch``, ``cuEventRecord``...) need a current context;
    client threads of a served model are arbitrary threads that may never have touched
    CUDA. One attribute lookup on the hot path after the first call.
    """
    cur = getattr(_tls, "ctx", None)
    if cur is ctx:
        return
    from cuda.bindings import driver

    check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    _tls.ctx = ctx


try:
    _SUCCESS = _success_values()
except Exception:  # noqa: BLE001  # pragma: no cover - cuda-python is a hard dependency
    _SUCCESS = (0,)
