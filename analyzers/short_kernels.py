"""Short kernels: GPU work too small to hide the CPU cost of launching it.

A kernel shorter than ``Options.short_kernel_us`` finishes before the next eager launch
call can return, so the GPU waits for the CPU. Evidence: share of kernels (by count and
by time) that are short, the worst offenders by name, and the median launch-call
duration against the median kernel duration (joined on ``(pid, correlation)``).
Reported when the count share reaches ``Options.report_min_share``. Recoverable time:
the steady-state GPU idle gaps that end with a short kernel - the launch cost the GPU
waited for before each one (0 when short kernels run back to back, hidden behind each
other). Severity follows from it (docs/findings.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._attribution import any_region, attribute, where_shares
from ._framework import idiom
from ._recoverable import allocator_gap, examples, finish, idle_gaps, report, steady_window
from ._util import launches, r, stream_label_codes, take_str

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "short-kernels": {
        "count": "number", "count_share": "share", "idle_before_short_kernels_ns": "ns",
        "kernel_time_us": "us", "kernels": "number", "launch_to_kernel_ratio": "number",
        "launches_joined": "number", "median_kernel_us": "us", "median_launch_us": "us", "median_us": "us",
        "short": "number", "short_time_us": "us", "threshold_us": "us", "time_share": "share",
        "total_us": "us",
    },
}


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="short-kernels")
    k = trace.kernels
    if len(k) == 0:
        res.data = {"kernels": 0}
        return res
    dur = (k["end"] - k["start"]).to_numpy(np.int64)
    short = dur < int(round(options.short_kernel_us * 1000))
    j = launches(trace, ("kernel",))
    data = res.data = _evidence(k, dur, short, j, options)
    if not data["short"] or short.sum() / len(k) < options.report_min_share:
        return res
    gaps = idle_gaps(trace, options)
    gk = gaps[(gaps["what"] == "kernel") & gaps["steady"].astype(bool) & ~allocator_gap(trace, options)]
    gk = gk[short[gk["row"].to_numpy(np.int64)]] if len(gk) else gk
    rec = int(gk["ns"].sum()) if len(gk) else 0
    data["idle_before_short_kernels_ns"] = rec
    launch_med = float(np.median(j["api_end"] - j["api_start"])) if len(j) else None
    kern_med = float(np.median(dur))
    launch_txt = "" if launch_med is None else (f"; a launch call takes {launch_med / 1000:.1f} us (median) "
                                                f"against {kern_med / 1000:.1f} us of kernel")
    hides = launch_med is not None and kern_med >= 2 * launch_med  # the median kernel outlasts its launch
    if hides:
        launch_txt += ": most kernels hide their launch cost, only the short ones do not"
    f = report(
        res, "short-kernels",
        title=f"{short.sum() / len(k):.0%} of kernels run under {options.short_kernel_us:g} us{launch_txt}",
        evidence=data, where=_where(trace, k, short, j, options),
        recommendation=(
            ("Most kernels are long enough to hide their launch; the short ones still cost a launch "
             "each. " if hides else "") +
            "Amortize the launch cost: capture the repeated per-query/per-step sequence in a CUDA graph "
            f"(one cudaGraphLaunch replaces dozens of cudaLaunchKernel), fuse elementwise tails "
            f"({idiom(trace, 'fuse')}), and batch several requests per launch; launching from several threads "
            "only helps once each thread has its own stream group."),
        action=f"capture the repeated per-query/step kernel sequence in a CUDA graph ({idiom(trace, 'fuse_action')})")
    if len(gk):
        f.examples = examples(trace, start=gk["start"], end=gk["end"], pid=gk["pid"],
                              device=gk["device"], stream=gk["stream"],
                              what="GPU idle before a short kernel", n=options.examples_per_finding)
    finish(f, rec, steady_window(trace, options), options, claims=gk)
    return res


def _evidence(k: pd.DataFrame, dur: np.ndarray, short: np.ndarray, j: pd.DataFrame,
              options: Options) -> dict[str, Any]:
    """Counts and times of short kernels, the worst by name, launch against kernel time."""
    n_short = int(short.sum())
    time_total, time_short = int(dur.sum()), int(dur[short].sum())
    offenders = []
    if n_short:
        ks = pd.DataFrame({"name": take_str(k["name"], np.flatnonzero(short)), "dur": dur[short]})
        g = ks.groupby("name", dropna=False)["dur"].agg(["count", "sum", "median"]).sort_values(
            ["count", "sum"], ascending=False)
        offenders = [{"name": None if pd.isna(name) else str(name), "count": int(row["count"]),
                      "total_us": r(row["sum"] / 1000, 3), "median_us": r(row["median"] / 1000, 3)}
                     for name, row in g.head(options.top_n).iterrows()]
    launch_med = float(np.median(j["api_end"] - j["api_start"])) if len(j) else None
    kern_med = float(np.median(dur))
    ratio = (launch_med / kern_med) if (launch_med is not None and kern_med > 0) else None
    data = {
        "kernels": int(len(k)), "short": n_short, "threshold_us": options.short_kernel_us,
        "count_share": r(n_short / len(k)), "time_share": r((time_short / time_total) if time_total else None),
        "short_time_us": r(time_short / 1000, 3), "kernel_time_us": r(time_total / 1000, 3),
        "median_kernel_us": r(kern_med / 1000, 3),
        "median_launch_us": r(launch_med / 1000, 3) if launch_med is not None else None,
        "launch_to_kernel_ratio": r(ratio), "launches_joined": int(len(j)),
        "offenders": offenders,
    }
    return data


def _where(trace: Trace, k: pd.DataFrame, short: np.ndarray, j: pd.DataFrame, options: Options) -> list[dict]:
    """Code regions (or streams) of the short kernels' launches."""
    cut = int(round(options.short_kernel_us * 1000))
    if len(j):
        js = j[(j["end"] - j["start"]).to_numpy(np.int64) < cut]
        if len(js):
            reg = attribute(trace, js["pid"], js["tid"], js["api_start"])
            if any_region(reg):
                where = where_shares(reg, key="nvtx", top=options.top_n)
                if where:
                    return where
            return where_shares(stream_label_codes(js["pid"], js["device"], js["stream"]), key="stream",
                                top=options.top_n)
    return where_shares(stream_label_codes(k["pid"][short], k["device"][short], k["stream"][short]),
                        key="stream", top=options.top_n)
