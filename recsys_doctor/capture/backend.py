"""Where and how a capture runs: the backend, the GPU check, the output folder, and the
versions recorded beside every trace."""

from __future__ import annotations

import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import BadInputError, NsysNotFoundError
from .nvml import gpu_environment

__all__ = ["BACKENDS", "choose_backend", "default_out_dir", "require_gpu", "has_gpu", "versions", "nsys_version"]

BACKENDS = ("auto", "nsys", "torch")


def choose_backend(backend: str = "auto") -> str:
    """``nsys`` or ``torch``. ``auto`` takes nsys when :func:`find_nsys` finds it;
    ``nsys`` without one raises :class:`NsysNotFoundError`."""
    from .nsys import find_nsys

    if backend not in BACKENDS:
        raise BadInputError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "torch":
        return "torch"
    try:
        find_nsys()
    except NsysNotFoundError as e:
        if backend == "nsys":
            why = str(e).split(";")[0].replace(", needed to read a .nsys-rep", "")
            raise NsysNotFoundError(f"--backend nsys: {why}; install Nsight Systems or set RECSYS_DOCTOR_NSYS "
                                    "to the nsys binary, or use --backend torch") from None
        return "torch"
    return "nsys"


def default_out_dir() -> Path:
    """``./recsys-doctor-runs/<YYYYmmdd-HHMMSS>`` (a suffix is added if it exists)."""
    base = Path("recsys-doctor-runs") / time.strftime("%Y%m%d-%H%M%S")
    p, i = base, 1
    while p.exists():
        i += 1
        p = base.with_name(f"{base.name}-{i}")
    return p


def has_gpu(device_index: int = 0) -> bool:
    """Whether NVML sees GPU ``device_index``."""
    return int(gpu_environment(device_index).get("gpu_count", 0)) > device_index


def require_gpu(device_index: int = 0) -> dict[str, Any]:
    """The GPU environment (name, driver) or :class:`BadInputError` when NVML sees no GPU."""
    env = gpu_environment(device_index)
    if int(env.get("gpu_count", 0)) > device_index:
        return env
    why = env.get("nvml") or f"{env.get('gpu_count', 0)} GPUs"
    raise BadInputError(f"no NVIDIA GPU found ({why}): profile runs the model on a GPU; "
                        "to diagnose an existing trace use `recsys-doctor advise TRACE`")


def versions() -> dict[str, Any]:
    """Python, torch, nvtx and recsys-doctor versions (None for a package not installed)."""
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    for pkg in ("torch", "nvtx"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    from .._util import __version__

    out["recsys_doctor"] = __version__
    return out


def nsys_version(nsys: Path) -> str | None:
    """The last line of ``nsys --version``, or None when it cannot be run."""
    try:
        p = subprocess.run([str(nsys), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip().splitlines()[-1] if p.stdout.strip() else None
