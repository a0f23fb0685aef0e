"""Small grids: kernels with fewer thread blocks than the GPU has SMs.

A kernel whose grid (``grid_x * grid_y * grid_z``) has fewer blocks than the device's SM
count leaves SMs empty for its whole duration; on one stream nothing else can use them.
Such kernels are exactly the ones that gain from running concurrently on several streams.
The SM count comes from the trace's ``devices`` table; where it is unknown the device is
skipped (listed in ``data["skipped_devices"]``) rather than guessed. Reported when the
share of kernel time (on devices with a known SM count) spent in small grids reaches
``Options.report_min_share``. Recoverable time: the steady-state small-grid kernel time
times the share of SMs each leaves empty (``1 - blocks / SMs``) - what concurrent work on
other streams could fill at best. Severity follows from it (docs/findings.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..findings import AnalysisResult, Finding
from ..model import Trace
from ..options import Options
from ._recoverable import examples, finish, report, steady_starts, steady_window
from ._util import per_key, per_value, r, stream_label_codes, take_str
from ._attribution import where_shares

__all__ = ["analyze"]


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
    smallm = ok & (blocks < sm_of)
    data = res.data = _evidence(k, kdev, sms, ok, smallm, blocks, dur, options)
    if data["time_share"] is None or data["_tshare"] < options.report_min_share:
        data.pop("_tshare")
        return res
    tshare = data.pop("_tshare")
    st = steady_starts(trace, options)
    sel = smallm & (k["start"].to_numpy(np.int64) >= per_key(kdev, st, 0))
    rec = float((dur[sel] * (1.0 - blocks[sel] / np.maximum(sm_of[sel], 1))).sum())
    data["unused_sm_time_ns"] = int(rec)
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
        ks = k[sel]
        f.examples = examples(trace, start=ks["start"], end=ks["end"], pid=ks["pid"], device=ks["device"],
                              stream=ks["stream"], what=per_value(ks["name"], "kernel {}".format),
                              n=options.examples_per_finding)
    finish(f, rec, steady_window(trace, options), options)
    return res


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
