"""Memcpy ping-pong: many small host<->device copies, alternating directions, often synchronous.

Recommender serving typically copies each input tensor separately (dozens of tiny H2D
copies per query) and reads results back with a blocking D2H: every copy is a launch,
a DMA setup and often a sync. Evidence:

* H2D/D2H counts and **direction switches** (adjacent copies of one process, by start);
* **small copies** (``bytes <= Options.small_copy_bytes``) and how many there are per unit
  of work: per NVTX range instance of the region that issues most of them, or per step
  (``ProfilerStep#N``), else overall;
* **pageable** host memory (``src_mem``/``dst_mem == "pageable"``): the driver stages
  these through its own pinned buffer and the copy is synchronous to the host;
* **synchronous copies**: launch calls named ``cudaMemcpy``/``cuMemcpy*`` without ``Async``;
* which code region (innermost NVTX / ``record_function`` range) issues them.

Reported when the largest of the switch share (switches / (h2d+d2h-1)), the share of
synchronous or pageable copies, and the small-copy share (when there are at least
``Options.many_copies_per_unit`` small copies per unit of work) reaches
``Options.report_min_share``. Recoverable time: the steady-state GPU idle gaps that start
when a D2H copy ends (the GPU waits for the host to read the result and send the next
work: the round trip), plus, with many small copies per unit, the copy time saved by
merging them into one copy per unit ((small copies - units) x median small-copy time).
Severity follows from it (docs/findings.md).
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
from ._recoverable import examples, finish, idle_gaps, report, steady_window
from ._util import BLOCKING_COPY_RE, launches, norm_name, r, str_contains, thread_label_codes
from .summary import direction_switches

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "memcpy-ping-pong": {
        "copy_time_us": "us", "d2h": "number", "direction_switches": "number", "h2d": "number",
        "launches_joined": "number", "median_copy_bytes": "bytes", "merge_copies_saving_ns": "ns",
        "pageable_copies": "number", "pageable_share": "share", "round_trip_idle_ns": "ns",
        "small_copies": "number", "small_copies_per_unit": "number", "small_copy_bytes": "bytes",
        "small_share": "share", "switch_share": "share", "sync_copies": "number", "sync_share": "share",
        "units": "number",
    },
}


def _units(trace: Trace, region_names: np.ndarray) -> tuple[str | None, int]:
    """The unit of work: the region issuing most copies (count of its instances), else the
    step annotation; ``(None, 1)`` when there are no ranges."""
    rg = trace.ranges
    if len(rg) == 0:
        return None, 1
    names = rg["name"].map(norm_name)
    labelled = [x for x in region_names if x is not None]
    if labelled:
        top = pd.Series(labelled).value_counts().index[0]
        n = int((names == top).sum())
        if n:
            return str(top), n
    steps = names == "ProfilerStep#*"
    if steps.any():
        return "ProfilerStep#*", int(steps.sum())
    return None, 1


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="memcpy-ping-pong")
    mc = trace.memcpys
    is_hd = mc["kind"].isin(["h2d", "d2h"]).to_numpy()
    hd = mc.loc[is_hd, ["start", "end", "pid", "device", "stream", "bytes", "kind", "src_mem", "dst_mem"]]
    n = len(hd)
    if n == 0:
        res.data = {"h2d": 0, "d2h": 0, "direction_switches": 0}
        return res
    j = launches(trace, ("memcpy",))
    keep = is_hd[j["row"].to_numpy(np.int64)] if len(j) else np.zeros(0, bool)
    j = j if keep.all() else j[keep]
    reg = attribute(trace, j["pid"], j["tid"], j["api_start"]) if len(j) else np.empty(0, object)
    data, scores = _evidence(trace, hd, j, reg, options)
    res.data = data
    if n < 2 or max(scores.values()) < options.report_min_share:
        return res
    rt = _round_trips(trace, hd, options)
    small = hd["bytes"].to_numpy(np.int64) <= options.small_copy_bytes
    merge = 0.0
    if scores["small"]:
        sd = (hd["end"] - hd["start"]).to_numpy(np.int64)[small]
        merge = max(0.0, float(small.sum() - data["units"])) * float(np.median(sd))
    data["round_trip_idle_ns"] = int(rt["ns"].sum()) if len(rt) else 0
    data["merge_copies_saving_ns"] = int(merge)
    f = report(res, "memcpy-ping-pong", title=f"{n} host<->device copies: " + ", ".join(_parts(data)),
               evidence=data, recommendation=_sentence("; ".join(_advice(data, scores, idiom(trace, "host_read_examples")))),
               where=_where(trace, j, reg, options),
               action="stage each request's inputs in one pinned buffer and read results back asynchronously")
    if len(rt):
        f.examples = examples(trace, start=rt["start"], end=rt["end"], pid=rt["pid"], device=rt["device"],
                              stream=rt["stream"], what="GPU idle after a D2H copy (host round trip)",
                              n=options.examples_per_finding)
    else:
        f.examples = examples(trace, start=hd["start"], end=hd["end"], pid=hd["pid"], device=hd["device"],
                              stream=hd["stream"], what=[f"{k.upper()} copy" for k in hd["kind"]],
                              n=options.examples_per_finding)
    finish(f, data["round_trip_idle_ns"] + merge, steady_window(trace, options), options, claims=rt)
    return res


def _evidence(trace: Trace, hd: pd.DataFrame, j: pd.DataFrame, reg: np.ndarray,
              options: Options) -> tuple[dict[str, Any], dict[str, float]]:
    """Counts, switches, small/pageable/synchronous copies; and the score of each."""
    n = len(hd)
    switches = direction_switches(trace.memcpys)
    small = hd["bytes"].to_numpy(np.int64) <= options.small_copy_bytes
    pageable = (hd["src_mem"] == "pageable").to_numpy() | (hd["dst_mem"] == "pageable").to_numpy()
    n_sync = int(str_contains(j["api_name"], BLOCKING_COPY_RE).sum()) if len(j) else 0
    jsmall = trace.memcpys["bytes"].to_numpy(np.int64)[j["row"].to_numpy(np.int64)] <= options.small_copy_bytes
    unit, n_units = _units(trace, reg[jsmall] if len(j) else reg)
    per_unit = small.sum() / max(1, n_units)
    switch_share = switches / (n - 1) if n > 1 else 0.0
    data = {
        "h2d": int((hd["kind"] == "h2d").sum()), "d2h": int((hd["kind"] == "d2h").sum()),
        "direction_switches": int(switches), "switch_share": r(switch_share),
        "small_copies": int(small.sum()), "small_copy_bytes": options.small_copy_bytes,
        "small_share": r(float(small.mean())), "unit": unit, "units": int(n_units),
        "small_copies_per_unit": r(per_unit, 2),
        "pageable_copies": int(pageable.sum()), "pageable_share": r(float(pageable.mean())),
        "sync_copies": n_sync, "sync_share": r(n_sync / n),
        "copy_time_us": r(int((hd["end"] - hd["start"]).sum()) / 1000, 3),
        "median_copy_bytes": int(np.median(hd["bytes"])),
        "launches_joined": int(len(j)),
    }
    scores = {"switch": switch_share, "sync": n_sync / n, "pageable": float(pageable.mean()),
              "small": float(small.mean()) if per_unit >= options.many_copies_per_unit else 0.0}
    return data, scores


def _round_trips(trace: Trace, hd: pd.DataFrame, options: Options) -> pd.DataFrame:
    """Steady-state idle gaps that start when a D2H copy ends (the host round trip)."""
    gaps = idle_gaps(trace, options)
    if not len(gaps):
        return gaps.iloc[:0]
    d2h = (hd["kind"] == "d2h").to_numpy(bool)
    ddev, dend = hd["device"].to_numpy(np.int64)[d2h], hd["end"].to_numpy(np.int64)[d2h]
    gdev, gstart = gaps["device"].to_numpy(np.int64), gaps["start"].to_numpy(np.int64)
    m = np.zeros(len(gaps), dtype=bool)  # (device, gap start) is some (device, D2H end)
    for d in np.unique(gdev):
        at = gdev == d
        m[at] = np.isin(gstart[at], dend[ddev == d])
    return gaps[m & gaps["steady"].to_numpy(bool)]


def _where(trace: Trace, j: pd.DataFrame, reg: np.ndarray, options: Options) -> list[dict]:
    """Regions issuing the copies (weighted by count), then threads."""
    if not len(j):
        return []
    where = where_shares(reg, key="nvtx", top=options.top_n) if any_region(reg) else []
    return where + where_shares(thread_label_codes(trace, j["pid"], j["tid"]), key="thread", top=options.top_n)


def _parts(data: dict[str, Any]) -> list[str]:
    parts = []
    if data["direction_switches"]:
        parts.append(f"{data['direction_switches']} H2D/D2H direction switches")
    unit = data["unit"]
    parts.append(f"{data['small_copies']} small copies"
                 + (f" ({data['small_copies'] / max(1, data['units']):.1f} per {unit})" if unit else ""))
    if data["sync_copies"]:
        parts.append(f"{data['sync_copies']} synchronous cudaMemcpy")
    if data["pageable_copies"]:
        parts.append(f"{data['pageable_copies']} from/to pageable memory")
    return parts


def _advice(data: dict[str, Any], scores: dict[str, float], reads: str) -> list[str]:
    rec = []
    if scores["small"] or data["pageable_copies"]:
        rec.append("gather the per-tensor inputs into one pinned staging buffer and issue a single "
                   "cudaMemcpyAsync per query/step")
    if data["sync_copies"] or data["direction_switches"]:
        rec.append(f"replace blocking cudaMemcpy{reads} with async copies into pinned memory and "
                   "one event wait at the end of the request")
    rec.append("put the copies on the group's own stream (or merge copy and compute streams when the "
               "copies are this small and latency-bound)")
    return rec


def _sentence(text: str) -> str:
    """First letter upper-cased, the rest as written (API names keep their case)."""
    return (text[:1].upper() + text[1:] + ".") if text else text
