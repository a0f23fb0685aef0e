"""recsys-doctor: why your recommender model leaves the GPU idle, and how to fix it.

Library entry points (the CLI is a thin skin over these):

* :func:`recsys_doctor.loaders.load` - any supported trace file -> :class:`Trace`
* :func:`recsys_doctor.advise.advise` - load + analyze + plan -> :class:`AdviseResult`
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import BadInputError, NsysNotFoundError, RecsysDoctorError, TraceFormatError, WorkloadError
from .model import Trace
from .options import Options
from .workload import Workload

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
