"""One exception hierarchy for the whole package.

Library code raises these; the CLI translates them once, at its boundary, into a
one-line message and an exit code (2 for bad input, 1 for a failed ``check``).
"""

from __future__ import annotations

__all__ = [
    "RecsysDoctorError",
    "BadInputError",
    "TraceFormatError",
    "NsysNotFoundError",
    "RuntimeCudaError",
    "WorkloadError",
]


class RecsysDoctorError(Exception):
    """Base class of every error this package raises on purpose."""

    exit_code = 2


class BadInputError(RecsysDoctorError):
    """The user gave us something we cannot use: a missing file, a directory, bad options."""


class TraceFormatError(BadInputError):
    """The file exists but is not a trace we can read (corrupt, truncated, wrong kind)."""


class NsysNotFoundError(BadInputError):
    """A ``.nsys-rep`` needs ``nsys export`` and no Nsight Systems binary was found."""


class RuntimeCudaError(RecsysDoctorError):
    """A CUDA call made by the stream-group runtime failed; the message names the call."""

    exit_code = 1


class WorkloadError(RecsysDoctorError):
    """The user's workload raised while the tool drove it (exit code 1: the tool worked,
    the profiled program did not)."""

    exit_code = 1
