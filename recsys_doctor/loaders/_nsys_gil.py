"""Who gave the GIL up, from the call stacks of an nsys export's OS-runtime waits.

CPython's GIL is a mutex plus a condition variable: a thread that wants it back waits in
``pthread_cond_timedwait`` under ``PyEval_RestoreThread`` (or ``PyGILState_Ensure``, a
thread of a C library taking it). With OS-runtime backtraces (``nsys profile -t osrt
--osrt-backtrace-threshold=NS``, frames in ``OSRT_CALLCHAINS``), the frame above that one
is the native call that had given the GIL up and is now taking it back: a PyTorch binding
(every op through pybind11's ``gil_scoped_release``), a tensor's deallocation
(``THPVariable_clear``), a numpy loop, a CUDA synchronization. :func:`releasers` names it
per call stack; :mod:`recsys_doctor.analyzers.gil_handoffs` adds them up.

Both taker symbols are part of CPython's C API, so they are resolved in any build; the
frames of a stripped Python binary that are not (``take_gil`` itself) are skipped."""

from __future__ import annotations

import itertools
import operator
import re
from typing import Iterable

__all__ = ["GIL_TAKERS", "PYTHON_FRAMES", "releasers", "short_symbol"]

#: the frames through which a thread takes the GIL back
GIL_TAKERS = frozenset({"PyEval_RestoreThread", "PyGILState_Ensure", "PyEval_AcquireThread"})
#: what a releaser is called when every frame above the taker is Python's own (a lock's
#: acquire, ``time.sleep``, I/O: the interpreter released the GIL itself)
PYTHON_FRAMES = "Python's own calls (locks, sleep, I/O)"
#: modules that are the interpreter itself
_PYTHON_MODULE = re.compile(r"^(lib)?python\d[\d.]*(d|m|t)?(\.so[\d.]*)?$")
#: PyTorch's interpreter hooks: C++ code inside an op taking the GIL for a Python object
_HOOK = re.compile(r"PyInterpreterVTable::")
#: frames that are no one's call: thread entry points, pybind11's GIL guards
_NOT_A_CALLER = re.compile(r"^(__libc_start_main|_start|start_thread|clone3?|__clone\w*)$|gil_scoped")


def short_symbol(sym: str) -> str:
    """A native symbol without its parameter list and, outside templates, its namespaces:
    ``torch::autograd::THPVariable_clone(_object*, _object*, _object*)`` ->
    ``THPVariable_clone``."""
    s = re.sub(r"(\s+(const|volatile|&&|&|noexcept))+$", "", sym.strip())
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i].rstrip()
                break
    if "<" not in s:
        s = s.rsplit("::", 1)[-1]
    return s if len(s) <= 100 else s[:97] + "..."


def _label(frames: list[tuple[str, str]]) -> str:
    """The releaser of one call stack's frames above the taker, innermost first. A taker
    reached from PyTorch's interpreter hooks (``PyInterpreterVTable::incref``: a Python
    object's reference count changed inside an op) is named by the binding that runs the op
    (the next frame of that library), with the hook in brackets."""
    inside = None
    for sym, mod in frames:
        base = mod.rsplit("/", 1)[-1]
        if sym.startswith("0x") or _PYTHON_MODULE.match(base) or _NOT_A_CALLER.search(sym):
            continue
        if inside is None and _HOOK.search(sym):
            inside = (base, short_symbol(sym.split("::")[-1]))
            continue
        if inside is not None:
            if base != inside[0]:
                continue
            return f"{short_symbol(sym)} [{base}] (inside the op: {inside[1]})"
        return f"{short_symbol(sym)} [{base}]"
    return PYTHON_FRAMES if inside is None else f"{inside[1]} [{inside[0]}]"


def releasers(rows: Iterable[tuple[int, str, str]]) -> dict[int, str]:
    """``{call stack id: who gave the GIL up}`` from ``(id, symbol, module)`` rows in call
    stack order (innermost frame first), for the stacks that take the GIL back; the others
    are left out."""
    out: dict[int, str] = {}
    for cid, group in itertools.groupby(rows, key=operator.itemgetter(0)):
        frames = [(sym or "", mod or "") for _, sym, mod in group]
        at = next((i for i, (sym, _) in enumerate(frames) if sym in GIL_TAKERS), None)
        if at is not None:
            out[int(cid)] = _label(frames[at + 1:])
    return out
