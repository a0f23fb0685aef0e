"""What a later stage changes in the program while capture runs it.

The "after" run of ``profile --apply`` captures the program with a plan applied. Capture
does not know what applying means (the runtime, the script hook): the apply stage hands
it a :class:`Treatment`, a few callables and a child command, and capture calls them at
the right moment. So the stages import one way: apply imports capture, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import BadInputError
from .workload import Workload

__all__ = ["Treatment", "Prepared", "TARGET_KINDS"]

#: a prepared workload: ``(run, close, info, workload)`` - pass ``run`` and the returned
#: workload to :func:`~recsys_doctor.capture.workload.measure`, call ``close()`` after, keep ``info``
Prepared = tuple[Callable[..., Any] | None, Callable[[], None] | None, dict[str, Any] | None, Workload]
#: what a treatment applies to
TARGET_KINDS = ("workload", "script")


@dataclass(frozen=True)
class Treatment:
    """How to run the program changed.

    For a workload module (``target_kind="workload"``): ``prepare(wl)`` makes the changed
    workload in this process (the torch backend), and ``child_module`` + ``child_args``
    name the child process that drives it changed (the nsys backend; the module's
    ``main`` takes the arguments of :mod:`recsys_doctor.capture._child` plus
    ``child_args``).
    For a plain script (``target_kind="script"``): ``script_env(env, folder)`` returns the
    environment the script runs in under nsys (``folder``: a place for generated files in
    the capture's output), and ``activate()`` starts the change in this process (the
    torch backend runs the script here) and returns the function that stops it.
    """

    target_kind: str
    prepare: Callable[[Workload], Prepared] | None = None
    child_module: str | None = None
    child_args: tuple[str, ...] = ()
    script_env: Callable[[dict[str, str], Path], dict[str, str]] | None = None
    activate: Callable[[], Callable[[], None]] | None = None

    def __post_init__(self) -> None:
        if self.target_kind not in TARGET_KINDS:
            raise BadInputError(f"Treatment.target_kind must be one of {TARGET_KINDS}, got {self.target_kind!r}")
        hooks = (self.prepare, self.child_module) if self.target_kind == "workload" else \
            (self.script_env, self.activate)
        if any(h is None for h in hooks):
            raise BadInputError(f"a {self.target_kind} Treatment needs every hook of its kind")
