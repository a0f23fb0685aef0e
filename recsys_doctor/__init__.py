"""recsys-doctor: why your recommender model leaves the GPU idle, and how to fix it.

Library entry points (the CLI is a thin skin over these):

* :func:`recsys_doctor.loaders.load` - any supported trace file -> :class:`Trace`
* :func:`recsys_doctor.diagnose.advise.advise` - load + analyze + plan -> :class:`AdviseResult`
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._util import __version__
from .errors import BadInputError, NsysNotFoundError, RecsysDoctorError, TraceFormatError, WorkloadError

if TYPE_CHECKING:
    from .model import Trace
    from .options import Options
    from .capture.workload import Workload

# Trace, Options and Workload are imported when first used: the command line starts
# without pandas, so that ``advise`` can set a large trace's decoding going first
_LAZY = {"Trace": "model", "Options": "options", "Workload": "capture.workload"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "__version__",
    "Trace",
    "Options",
    "Workload",
    "WorkloadError",
    "RecsysDoctorError",
    "BadInputError",
    "TraceFormatError",
    "NsysNotFoundError",
]
