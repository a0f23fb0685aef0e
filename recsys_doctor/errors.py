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
    "first_line",
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


def first_line(e: BaseException, *, with_type: bool = True) -> str:
    """One line for an exception a user will read: ``Type: first line of the message``
    (``Type`` alone when there is no message); ``with_type=False``: the first line only,
    ``(no message)`` when empty. Tracebacks and multi-line driver messages stay out."""
    lines = str(e).strip().splitlines()
    first = lines[0].strip() if lines else ""
    if not with_type:
        return first or "(no message)"
    return f"{type(e).__name__}: {first}" if first else type(e).__name__
