"""Nsight Systems report (``.nsys-rep``, older ``.qdrep``) -> SQLite export -> Trace.

A report is a binary container only ``nsys`` itself can read, so this module runs
``nsys export --type sqlite`` once per report and caches the result; loading the cached
SQLite is what :mod:`.nsys` does anyway.

Where ``nsys`` comes from, first hit wins:

1. ``$RECSYS_DOCTOR_NSYS`` (path to the binary; an explicit choice, so a wrong value is
   an error, not a silent fallback);
2. ``nsys`` on ``PATH``;
3. the usual install folders (``/opt/nvidia/nsight-systems/*/bin``, CUDA toolkits,
   Nsight Compute's bundled copy, distribution packages), newest version first.

The cache: ``$RECSYS_DOCTOR_CACHE/exports`` if set, else the platform's user cache dir
(``~/.cache/recsys-doctor/exports`` on Linux). An export is named after the SHA-256 of
the report's bytes, so copies and renames of one report share it; a small per-path index
remembers size, mtime and hash so an unchanged report is not hashed again. A report
whose size, mtime or content changed is hashed again and exported again.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from .._util.files import file_sha256
from ..errors import BadInputError, NsysNotFoundError, TraceFormatError
from ..model import Trace
from .nsys import load_nsys_sqlite

__all__ = ["load_nsys_rep", "find_nsys", "export_to_sqlite", "cache_dir"]

#: install locations searched when ``nsys`` is not on PATH (globbed, newest first)
NSYS_GLOBS = (
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/usr/local/cuda*/bin/nsys",
    "/usr/local/cuda*/nsight-systems-*/bin/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
    "/usr/lib/nsight-systems/*/bin/nsys",
    "/opt/nvidia/hpc_sdk/*/*/profilers/Nsight_Systems/bin/nsys",
)

HOW_TO_EXPORT = (
    "export it by hand with `nsys export --type sqlite -o trace.sqlite trace.nsys-rep` and pass the "
    ".sqlite, or install Nsight Systems / set RECSYS_DOCTOR_NSYS to the nsys binary"
)


def load_nsys_rep(path: str | os.PathLike[str]) -> Trace:
    """Export an Nsight Systems report to SQLite (cached) and load it.

    Raises :class:`NsysNotFoundError` when no ``nsys`` is available (the message says how
    to export by hand) and :class:`TraceFormatError` when ``nsys export`` fails (with
    nsys's last error line)."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"{p}: no such file" if not p.exists() else f"{p}: not a regular file")
    sqlite_path, reused = export_to_sqlite(p)
    trace = load_nsys_sqlite(sqlite_path)
    trace.path = str(p)
    trace.meta["exported_from"] = str(p)
    trace.meta["export_sqlite"] = str(sqlite_path)
    trace.meta["export_reused"] = reused
    return trace


def cache_dir() -> Path:
    """Folder for cached exports (created on demand)."""
    root = os.environ.get("RECSYS_DOCTOR_CACHE")
    if root:
        base = Path(root).expanduser()
    else:
        import platformdirs

        base = Path(platformdirs.user_cache_dir("recsys-doctor"))
    return base / "exports"


def find_nsys() -> Path:
    """The ``nsys`` binary to use, or :class:`NsysNotFoundError`."""
    env = os.environ.get("RECSYS_DOCTOR_NSYS")
    if env:
        cand = Path(env).expanduser()
        if cand.is_dir():
            cand = cand / "nsys"
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
        raise NsysNotFoundError(f"RECSYS_DOCTOR_NSYS={env} is not an executable nsys binary; {HOW_TO_EXPORT}")
    which = shutil.which("nsys")
    if which:
        return Path(which)
    found = [Path(f) for g in NSYS_GLOBS for f in glob.glob(g)]
    found = [f for f in found if f.is_file() and os.access(f, os.X_OK)]
    if found:
        return max(found, key=_version_key)
    raise NsysNotFoundError(f"nsys (Nsight Systems) not found, needed to read a .nsys-rep; {HOW_TO_EXPORT}")


def export_to_sqlite(report: Path) -> tuple[Path, bool]:
    """Return ``(sqlite path, reused)``: the cached export of ``report``, made now if
    there is none for its current content."""
    report = report.resolve()
    st = report.stat()
    cdir = cache_dir()
    try:
        cdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInputError(f"cannot create the export cache {cdir} ({e.strerror or e}); set RECSYS_DOCTOR_CACHE") from None
    sha = _report_sha(report, st, cdir)
    out = cdir / f"{sha}.sqlite"
    side = cdir / f"{sha}.json"
    if out.is_file() and _sidecar_matches(side, sha, st.st_size):
        return out, True
    nsys = find_nsys()
    tmp = cdir / f"{sha}.partial-{os.getpid()}.sqlite"
    cmd = [str(nsys), "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(tmp), str(report)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    except OSError as e:
        raise NsysNotFoundError(f"cannot run {nsys} ({e.strerror or e}); {HOW_TO_EXPORT}") from None
    try:
        if proc.returncode != 0:
            raise TraceFormatError(
                f"{report}: nsys export failed (exit {proc.returncode}): {_last_line(proc.stderr, proc.stdout)}"
            )
        if not tmp.is_file() or tmp.stat().st_size == 0:
            raise TraceFormatError(
                f"{report}: nsys export wrote no SQLite file ({_last_line(proc.stderr, proc.stdout)})"
            )
        os.replace(tmp, out)  # atomic: a crash never leaves a half-written cached export
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    side.write_text(json.dumps({
        "sha256": sha, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "report": str(report),
        "nsys": str(nsys), "exported_at": time.time(),
    }))
    return out, False


# --------------------------------------------------------------------------------------
def _report_sha(report: Path, st: os.stat_result, cdir: Path) -> str:
    """SHA-256 of the report, from the per-path index when size and mtime still match."""
    index = cdir / "by-path" / (hashlib.sha256(str(report).encode()).hexdigest() + ".json")
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        rec = json.loads(index.read_text())
        if rec["size"] == st.st_size and rec["mtime_ns"] == st.st_mtime_ns and rec["path"] == str(report):
            return str(rec["sha256"])
    try:
        sha = file_sha256(report)
    except OSError as e:
        raise BadInputError(f"{report}: cannot read ({e.strerror or e})") from None
    with contextlib.suppress(OSError):
        index.parent.mkdir(parents=True, exist_ok=True)
        index.write_text(json.dumps({"path": str(report), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}))
    return sha


def _sidecar_matches(side: Path, sha: str, size: int) -> bool:
    try:
        rec = json.loads(side.read_text())
        return rec.get("sha256") == sha and rec.get("size") == size
    except (OSError, ValueError):
        return False


def _last_line(*texts: str | None) -> str:
    for t in texts:
        lines = [ln.strip() for ln in (t or "").splitlines() if ln.strip()]
        if lines:
            return lines[-1]
    return "no message"


def _version_key(p: Path) -> tuple[tuple[int, ...], str]:
    nums = re.findall(r"\d+(?:\.\d+)+|\d+", str(p))
    best = max((tuple(int(x) for x in n.split(".")) for n in nums), default=())
    return best, str(p)
