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

import numpy as np
import pandas as pd

from ..findings import AnalysisResult, Finding
from ..model import Trace
from ..options import Options
from ._attribution import any_region, attribute, where_shares
from ._recoverable import steady_window, examples, finish, idle_gaps
from ._util import launches, r, stream_label_codes

__all__ = ["analyze"]


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="short-kernels")
    k = trace.kernels
    if len(k) == 0:
        res.data = {"kernels": 0}
        return res
    dur = (k["end"] - k["start"]).to_numpy(np.int64)
    cut = int(round(options.short_kernel_us * 1000))
    short = dur < cut
    n_short = int(short.sum())
    count_share = n_short / len(k)
    time_total = int(dur.sum())
    time_short = int(dur[short].sum())
    time_share = (time_short / time_total) if time_total else None

    ks = pd.DataFrame({"name": k["name"].to_numpy(object)[short], "dur": dur[short]})
    offenders = []
    if n_short:
        g = ks.groupby("name", dropna=False)["dur"].agg(["count", "sum", "median"]).sort_values(
            ["count", "sum"], ascending=False)
        for name, row in g.head(options.top_n).iterrows():
            offenders.append({"name": None if pd.isna(name) else str(name), "count": int(row["count"]),
                              "total_us": r(row["sum"] / 1000, 3), "median_us": r(row["median"] / 1000, 3)})

    j = launches(trace, ("kernel",))
    launch_med = float(np.median(j["api_end"] - j["api_start"])) if len(j) else None
    kern_med = float(np.median(dur))
    ratio = (launch_med / kern_med) if (launch_med is not None and kern_med > 0) else None

    data = {
        "kernels": int(len(k)), "short": n_short, "threshold_us": options.short_kernel_us,
        "count_share": r(count_share), "time_share": r(time_share),
        "short_time_us": r(time_short / 1000, 3), "kernel_time_us": r(time_total / 1000, 3),
        "median_kernel_us": r(kern_med / 1000, 3),
        "median_launch_us": r(launch_med / 1000, 3) if launch_med is not None else None,
        "launch_to_kernel_ratio": r(ratio), "launches_joined": int(len(j)),
        "offenders": offenders,
    }
    res.data = data
    if n_short == 0 or count_share < options.report_min_share:
        return res

    sev = "note"
    gaps = idle_gaps(trace, options)
    gk = gaps[(gaps["what"] == "kernel") & gaps["steady"].astype(bool)]
    gk = gk[short[gk["row"].to_numpy(np.int64)]] if len(gk) else gk
    rec = int(gk["ns"].sum()) if len(gk) else 0
    data["idle_before_short_kernels_ns"] = rec

    # where: code regions (or streams) of the short kernels' launches
    where: list[dict] = []
    if len(j):
        jd = (j["end"] - j["start"]).to_numpy(np.int64)
        js = j[jd < cut]
        if len(js):
            reg = attribute(trace, js["pid"], js["tid"], js["api_start"])
            if any_region(reg):
                where = where_shares(reg, key="nvtx", top=options.top_n)
            if not where:
                labels = stream_label_codes(js["pid"], js["device"], js["stream"])
                where = where_shares(labels, key="stream", top=options.top_n)
    if not where:
        labels = stream_label_codes(k["pid"][short], k["device"][short], k["stream"][short])
        where = where_shares(labels, key="stream", top=options.top_n)

    launch_txt = ""
    if launch_med is not None:
        launch_txt = (f"; a launch call takes {launch_med / 1000:.1f} us (median) against "
                      f"{kern_med / 1000:.1f} us of kernel")
    res.findings.append(Finding(
        id="short-kernels", severity=sev,
        title=f"{count_share:.0%} of kernels run under {options.short_kernel_us:g} us{launch_txt}",
        evidence=data,
        recommendation=(
            "Amortize the launch cost: capture the repeated per-query/per-step sequence in a CUDA graph "
            "(one cudaGraphLaunch replaces dozens of cudaLaunchKernel), fuse elementwise tails "
            "(torch.compile), and batch several requests per launch; launching from several threads "
            "only helps once each thread has its own stream group."),
        where=where))
    f = res.findings[-1]
    f.action = "capture the repeated per-query/step kernel sequence in a CUDA graph (or fuse it with torch.compile)"
    if len(gk):
        f.examples = examples(trace, start=gk["start"], end=gk["end"], pid=gk["pid"],
                              device=gk["device"], stream=gk["stream"],
                              what="GPU idle before a short kernel", n=options.examples_per_finding)
    finish(f, rec, steady_window(trace, options), options)
    return res
