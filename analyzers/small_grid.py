"""Small grids: kernels with fewer thread blocks than the GPU has SMs.

A kernel whose grid (``grid_x * grid_y * grid_z``) has fewer blocks than the device's SM
count leaves SMs empty while it runs alone; such kernels gain from running concurrently
on several streams. The SM count comes from the trace's ``devices`` table; where it is
unknown the device is skipped (listed in ``data["skipped_devices"]``) rather than guessed.

Communication kernels (``Options.comm_kernel_pattern``: NCCL SendRecv/AllReduce/...,
expert-parallel dispatch/combine) are not judged: they use few blocks by design and run
beside compute. Reported when the share of judged kernel time spent in small grids reaches
``Options.report_min_share``. Recoverable time: the **unused-SM time** of the steady
state - per small-grid kernel, only the time it runs while no kernel (or graph) of
another stream of its device runs (concurrent work already fills the SMs then), times
the share of SMs it leaves empty (``1 - blocks / SMs``): what concurrent work on other
streams could fill at best, never more. Severity follows from it (docs/findings.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._comm import comm_mask
from ._ops import cached, op_table, what_is
from ._recoverable import examples, finish, report, steady_starts, steady_window
from ._util import pair_codes, per_key, per_value, r, stream_label_codes, take_str
from ._attribution import where_shares

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "small-grid": {
        "communication_kernels_excluded": "number", "communication_time_excluded_us": "us", "count": "number",
        "count_share": "share", "kernels_judged": "number", "median_blocks": "number", "sm_count": "number",
        "small_grid_alone_time_us": "us", "small_grid_kernels": "number",
        "small_grid_overlapped_time_us": "us", "small_grid_time_us": "us", "time_share": "share",
        "total_us": "us", "unused_sm_time_ns": "ns",
    },
}


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    k = trace.kernels
    if not len(k):
        return AnalysisResult(name="small-grid", data={"kernels": 0})
    res = AnalysisResult(name="small-grid")
    sms = _sm_counts(trace)
    kdev = k["device"].to_numpy(np.int64)
    g = (k["grid_x"] * k["grid_y"].fillna(1) * k["grid_z"].fillna(1))
    blocks = g.fillna(0).to_numpy(np.int64)
    sm_of = per_key(kdev, sms, 0).astype(np.int64) if sms else np.zeros(len(k), np.int64)
    ok = (np.isin(kdev, list(sms)) if sms else np.zeros(len(k), bool)) & g.notna().to_numpy()
    dur = (k["end"] - k["start"]).to_numpy(np.int64)
    comm = comm_mask(trace, options.comm_kernel_pattern)
    smallm = ok & ~comm & (blocks < sm_of)
    data = res.data = _evidence(k, kdev, sms, ok & ~comm, smallm, blocks, dur, options)
    data["communication_kernels_excluded"] = int((ok & comm).sum())
    data["communication_time_excluded_us"] = r(int(dur[ok & comm].sum()) / 1000, 3)
    if data["time_share"] is None or data["_tshare"] < options.report_min_share:
        data.pop("_tshare")
        return res
    tshare = data.pop("_tshare")
    st = steady_starts(trace, options)
    sel = smallm & (k["start"].to_numpy(np.int64) >= per_key(kdev, st, 0))
    alone = alone_time(trace)
    rec = float((alone[sel] * (1.0 - blocks[sel] / np.maximum(sm_of[sel], 1))).sum())
    data["unused_sm_time_ns"] = int(rec)
    data["small_grid_alone_time_us"] = r(int(alone[sel].sum()) / 1000, 3)
    data["small_grid_overlapped_time_us"] = r(int((dur[sel] - alone[sel]).sum()) / 1000, 3)
    f = report(
        res, "small-grid",
        title=(f"{tshare:.0%} of kernel time is in kernels with fewer blocks than SMs "
               f"(median grid {data['median_blocks']} blocks)"),
        evidence=data,
        where=where_shares(stream_label_codes(k["pid"][smallm], k["device"][smallm], k["stream"][smallm]),
                           dur[smallm], key="stream", top=options.top_n),
        recommendation=(
            "These kernels leave most SMs idle: run independent work concurrently on several stream "
            "groups (one per client thread or per independent branch) so small grids share the GPU, "
            "or batch more requests per kernel."),
        action="run independent requests concurrently on several stream groups so small grids share the GPU")
    if sel.any():
        ks = k[sel]  # the heaviest by unused-SM time
        w = alone[sel] * (1.0 - blocks[sel] / np.maximum(sm_of[sel], 1))
        f.examples = examples(trace, start=ks["start"], end=ks["end"], pid=ks["pid"], device=ks["device"],
                              stream=ks["stream"], what=per_value(ks["name"], "kernel {}".format),
                              weight=w, n=options.examples_per_finding)
    finish(f, rec, steady_window(trace, options), options)
    return res


def alone_time(trace: Trace) -> np.ndarray:
    """Per kernel (row of ``trace.kernels``), the ns of its run during which no kernel or
    graph execution of another stream of its device runs (its SMs are not shared then).
    One sweep per device over the per-stream unions of busy time: the running count of
    busy streams, and the cumulative time at which exactly one is busy."""
    return cached(trace, "kernel_alone_time", lambda: _alone_time(trace))


def _alone_time(trace: Trace) -> np.ndarray:
    k = trace.kernels
    out = np.zeros(len(k), dtype=np.int64)
    ops = op_table(trace)
    busy = what_is(ops, "kernel", "graph")
    dev, strm = ops["device"].to_numpy(np.int64)[busy], ops["stream"].to_numpy(np.int64)[busy]
    pid = ops["pid"].to_numpy(np.int64)[busy]
    s, e = ops["start"].to_numpy(np.int64)[busy], ops["end"].to_numpy(np.int64)[busy]
    kdev, ks, ke = k["device"].to_numpy(np.int64), k["start"].to_numpy(np.int64), k["end"].to_numpy(np.int64)
    for d in np.unique(dev):
        m = dev == d
        us, ue = _stream_unions(pair_codes(pid[m], strm[m])[0], s[m], e[m])
        times = np.concatenate([us, ue])
        delta = np.concatenate([np.ones(us.size, np.int64), -np.ones(ue.size, np.int64)])
        o = np.lexsort((delta, times))  # ends before starts at equal times
        times, count = times[o], np.cumsum(delta[o])
        solo = count == 1  # state from each event to the next
        acc = np.zeros(times.size, dtype=np.int64)
        acc[1:] = np.cumsum(np.diff(times) * solo[:-1])
        at = np.flatnonzero(kdev == d)
        out[at] = _cum_at(times, acc, solo, ke[at]) - _cum_at(times, acc, solo, ks[at])
    return np.maximum(out, 0)


def _stream_unions(code: np.ndarray, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the intervals of each group code (disjoint within a group), all
    groups' unions together: one sort and a grouped running maximum, no loop per group."""
    o = np.lexsort((s, code))
    cs, ss, es = code[o], s[o], np.maximum(e[o], s[o])
    reach = pd.Series(es).groupby(cs).cummax().to_numpy()
    new = np.ones(cs.size, dtype=bool)
    new[1:] = (cs[1:] != cs[:-1]) | (ss[1:] > reach[:-1])
    idx = np.flatnonzero(new)
    return ss[idx], np.maximum.reduceat(es, idx)


def _cum_at(times: np.ndarray, acc: np.ndarray, solo: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The cumulative one-stream-busy time of a sweep at times ``t``."""
    i = np.searchsorted(times, t, side="right") - 1
    ok = i >= 0
    j = np.maximum(i, 0)
    return np.where(ok, acc[j] + (t - times[j]) * solo[j], 0)


def _sm_counts(trace: Trace) -> dict[int, int]:
    """SM count of each device whose count the trace knows."""
    dv = trace.devices.dropna(subset=["sm_count"]) if len(trace.devices) else trace.devices
    return {int(d): int(s) for d, s in zip(dv["device"], dv["sm_count"]) if int(s) > 0}


def _evidence(k: pd.DataFrame, kdev: np.ndarray, sms: dict[int, int], ok: np.ndarray, smallm: np.ndarray,
              blocks: np.ndarray, dur: np.ndarray, options: Options) -> dict[str, Any]:
    """Kernels judged, small-grid count and time, the worst offenders by name."""
    skipped = sorted({int(d) for d in np.unique(kdev[~np.isin(kdev, list(sms))])}) if sms else \
        sorted({int(d) for d in np.unique(kdev)})
    total, small_t = int(dur[ok].sum()), int(dur[smallm].sum())
    tshare = small_t / total if total else None
    data: dict[str, Any] = {
        "sm_count": {str(d): s for d, s in sms.items()}, "skipped_devices": skipped,
        "kernels_judged": int(ok.sum()), "small_grid_kernels": int(smallm.sum()),
        "small_grid_time_us": r(small_t / 1000, 3), "time_share": r(tshare),
        "count_share": r(smallm.sum() / ok.sum()) if ok.any() else None,
        "median_blocks": int(np.median(blocks[ok])) if ok.any() else None,
    }
    if skipped:
        data["note"] = (f"SM count unknown for device(s) {skipped}: their kernels were not judged "
                        "(the trace has no device properties for them)")
    offenders = []
    if smallm.any():
        df = pd.DataFrame({"name": take_str(k["name"], np.flatnonzero(smallm)), "dur": dur[smallm],
                           "blocks": blocks[smallm]})
        agg = df.groupby("name").agg(count=("dur", "size"), total=("dur", "sum"), blocks=("blocks", "median")) \
            .sort_values("total", ascending=False)
        offenders = [{"name": str(n), "count": int(a["count"]), "total_us": r(a["total"] / 1000, 3),
                      "median_blocks": int(a["blocks"])} for n, a in agg.head(options.top_n).iterrows()]
    data["offenders"] = offenders
    data["_tshare"] = tshare
    return data
