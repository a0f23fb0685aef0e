"""What the scale benches share: running a command in a fresh process and timing it (wall
seconds, the child's own peak RSS), the best of several runs, and what the results were
measured on (the checkout's commit, the machine). ``scale_trace.py`` and ``kineto_scale.py``
both import it; neither imports the other for it."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def run_cmd(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> dict:
    """Run ``cmd`` to completion; wall seconds, the child's peak RSS (MB), exit status and
    the tail of its stderr."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=cwd)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        err.seek(0)
        tail = err.read()[-4000:].decode(errors="replace")
    return {"seconds": round(wall, 3), "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),
            "rc": os.waitstatus_to_exitcode(status), "stderr_tail": tail}


def best_of(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["rc"] == 0]
    if not ok:
        return {"failed": runs[-1]["stderr_tail"][-500:], "rc": runs[-1]["rc"]}
    b = min(ok, key=lambda r: r["seconds"])
    out = {"seconds": b["seconds"], "seconds_all": [r["seconds"] for r in ok],
           "seconds_median": round(statistics.median(r["seconds"] for r in ok), 3),
           "peak_rss_mb": max(r["peak_rss_mb"] for r in ok)}
    if len(ok) < len(runs):
        bad = next(r for r in runs if r["rc"] != 0)
        out["failed_runs"] = {"count": len(runs) - len(ok), "rc": bad["rc"], "stderr_tail": bad["stderr_tail"][-300:]}
    return out


def version(cwd: Path) -> str:
    r = subprocess.run(["git", "-C", str(cwd), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return r.stdout.strip()


def machine() -> dict:
    import pandas
    import recsys_doctor

    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "pandas": pandas.__version__, "recsys_doctor": recsys_doctor.__version__, "gpu": None,
            "mem_total_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            **_cpu()}


def _cpu() -> dict:
    """The CPU's model and the vector extensions engines pick code paths by (nsys-ai's DuckDB
    times moved 2-3x between two kernel builds of the dev machine)."""
    model, flags = None, []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if model is None and line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    flags = sorted(x for x in have if x.startswith(("avx", "sse4", "bmi")) or x in ("erms", "fsrm"))
                    break
    except OSError:
        pass
    return {"cpu_model": model, "cpu_flags": flags}
