"""Step variance: one training step or serving iteration far slower than the others.

Steps are the ``ProfilerStep#N`` annotations of a PyTorch profiler trace or, where there
are none, the most repeated top-level NVTX range of one thread (``depth`` 0, at least
three instances) whose name is that of a step, iteration, batch, query or request
(``Options.step_range_pattern``). A step at least ``Options.step_variance_ratio``
times the median step (the first step excepted: a slow first step is warm-up) is an
outlier; the finding says which, how long against the median, and what it has that the
other steps lack: the CUDA API calls whose time in it exceeds their median time in the
steps that are not outliers (``cudaMalloc``/``cudaFree`` on TorchRec rank 54105).

Recoverable time: per outlier, the steady-state GPU idle inside it (the parts of idle
gaps that lie in it), at most its excess
over the median (the GPU time a step like the others would not have lost). Where the
extra time is allocator gaps, ``allocator-churn`` names the cause and takes that time
(see ``_shared_causes.settle_shared_causes``). Severity follows from it (docs/findings.md).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._recoverable import examples, finish, idle_gaps, report, steady_window
from ._util import coverage_at, merge_intervals, norm_name, per_value, r, str_contains, take_str

__all__ = ["analyze", "steps"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "step-variance": {
        "extra_ms": "ms", "idle_inside_ms": "ms", "max_step_ms": "ms", "median_step_ms": "ms", "ms": "number",
        "p90_step_ms": "ms", "ratio": "number", "share": "share", "step_ms": "ms", "steps": "number",
        "x_median": "number",
    },
}

_NVTX = ("nvtx", "nvtx_pushpop", "nvtx_startend")
#: up to this many steps, the evidence lists each step's time
_LIST_STEPS = 50


def steps(trace: Trace, options: Options) -> pd.DataFrame:
    """The steps: ``name, start, end, pid, tid`` in time order (empty when the trace has
    no ``ProfilerStep#N`` and no repeated top-level NVTX range named like a step,
    ``Options.step_range_pattern``)."""
    rg = trace.ranges
    cols = ["name", "start", "end", "pid", "tid"]
    if not len(rg):
        return pd.DataFrame({c: [] for c in cols})
    norm = per_value(rg["name"], norm_name)
    ps = norm == "ProfilerStep#*"
    if not ps.any():
        src = rg["source"].astype(object).to_numpy()
        top = (np.isin(src, _NVTX) & (rg["depth"].fillna(-1).to_numpy(np.int64) == 0)
               & str_contains(rg["name"], re.compile(options.step_range_pattern)).to_numpy(bool))
        if not top.any():
            return pd.DataFrame({c: [] for c in cols})
        key = pd.Series(norm[top].astype(str)) + "|" + pd.Series(rg["tid"].to_numpy(np.int64)[top]).astype(str)
        best = key.value_counts()
        if best.iloc[0] < 3:
            return pd.DataFrame({c: [] for c in cols})
        ps = np.zeros(len(rg), bool)
        ps[np.flatnonzero(top)[(key == best.index[0]).to_numpy()]] = True
    out = pd.DataFrame({"name": take_str(rg["name"], np.flatnonzero(ps)),
                        **{c: rg[c].to_numpy(np.int64)[ps] for c in cols[1:]}})
    return out.sort_values("start", kind="stable").reset_index(drop=True)


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="step-variance")
    st = steps(trace, options)
    if len(st) < 3:
        res.data = {"steps": int(len(st))}
        return res
    dur = (st["end"] - st["start"]).to_numpy(np.int64)
    med = float(np.median(dur))
    slow = dur >= options.step_variance_ratio * med
    slow[0] = False  # the first step is warm-up
    res.data = data = {"steps": int(len(st)), "median_step_ms": r(med / 1e6, 3),
                       "p90_step_ms": r(float(np.percentile(dur, 90)) / 1e6, 3), "max_step_ms": r(dur.max() / 1e6, 3),
                       "ratio": options.step_variance_ratio}
    if len(st) <= _LIST_STEPS:
        data["step_ms"] = {str(n): r(d / 1e6, 3) for n, d in zip(st["name"], dur)}
    if not slow.any():
        return res
    gaps = idle_gaps(trace, options)
    inside, idle_in = _gaps_inside(gaps, st, slow)
    rec = int(sum(min(i, max(0.0, d - med)) for i, d in zip(idle_in, dur[slow])))
    extra = _extra_calls(trace, st, slow, dur - med)
    data["outliers"] = [{"step": str(n), "ms": r(d / 1e6, 3), "x_median": r(d / med, 2),
                         "idle_inside_ms": r(i / 1e6, 3), "extra_api": e}
                        for n, d, i, e in zip(st["name"][slow], dur[slow], idle_in, extra)]
    data["outliers"] = sorted(data["outliers"], key=lambda o: -o["ms"])[:_LIST_STEPS]  # the slowest
    worst = int(np.flatnonzero(slow)[np.argmax(dur[slow])])
    lack = extra[int(np.argmax(dur[slow]))]
    lack_txt = "; in it and not the others: " + ", ".join(
        f"{e['api']} {_ms(e['extra_ms'])}" for e in lack[:3]) if lack else ""
    f = report(
        res, "step-variance",
        title=(f"{st['name'][worst]} takes {_ms(dur[worst] / 1e6)} against a median step of {_ms(med / 1e6)} "
               f"({dur[worst] / med:.1f}x; {int(slow.sum())} of {len(st)} steps at least "
               f"{options.step_variance_ratio:g}x){lack_txt}"),
        evidence=data, where=[{"nvtx": norm_name(str(st['name'][worst])), "share": 1.0}],
        recommendation=(
            "Find what the slow step does that the others do not (the calls listed; often cudaMalloc/"
            "cudaFree after a cache miss or empty_cache, a checkpoint, a data-loader stall, a recompile) "
            "and move it out of the loop or warm it up before the steady state."),
        action=f"remove what makes {st['name'][worst]} slow ({lack[0]['api'] if lack else 'see the trace'})")
    gi = gaps[inside > 0].assign(claim_ns=inside[inside > 0])
    if len(gi):
        f.examples = examples(trace, start=gi["start"], end=gi["end"], pid=gi["pid"], device=gi["device"],
                              stream=gi["stream"], what="GPU idle inside a slow step", n=options.examples_per_finding)
    finish(f, rec, steady_window(trace, options), options, claims=gi)
    return res


def _ms(ms: float) -> str:
    return f"{ms:.1f} ms" if ms >= 1 else f"{ms * 1000:.0f} us"


def _gaps_inside(gaps: pd.DataFrame, st: pd.DataFrame, slow: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """The steady-state idle time (of the steps' processes) inside the slow steps: per gap,
    the ns of it inside a slow step (0: none), and per slow step its idle ns (one interval
    sweep per device, no loop over steps or gaps)."""
    inside = np.zeros(len(gaps), np.int64)
    idle = np.zeros(int(slow.sum()), np.int64)
    if not len(gaps):
        return inside, idle.astype(float).tolist()
    a, b = st["start"].to_numpy(np.int64)[slow], st["end"].to_numpy(np.int64)[slow]
    us, ue = merge_intervals(a, b)
    gs, ge = gaps["start"].to_numpy(np.int64), gaps["end"].to_numpy(np.int64)
    ok = gaps["steady"].to_numpy(bool) & np.isin(gaps["pid"].to_numpy(np.int64), st["pid"].to_numpy(np.int64))
    inside[ok] = coverage_at(us, ue, ge[ok]) - coverage_at(us, ue, gs[ok])
    dev = gaps["device"].to_numpy(np.int64)
    for d in np.unique(dev[ok]):
        m = ok & (dev == d)  # (one device's gaps are disjoint and sorted)
        o = np.argsort(gs[m], kind="stable")
        ds, de = gs[m][o], ge[m][o]
        idle += coverage_at(ds, de, b) - coverage_at(ds, de, a)
    return inside, idle.astype(float).tolist()


def _extra_calls(trace: Trace, st: pd.DataFrame, slow: np.ndarray, excess: np.ndarray) -> list[list[dict[str, Any]]]:
    """Per slow step, the API calls (of the steps' processes) whose time in it exceeds
    their median time over the other steps by at least 5% of the step's excess over the
    median step (``excess``, per step), the largest first (top 3)."""
    api = trace.api
    if not len(api):
        return [[] for _ in range(int(slow.sum()))]
    s = api["start"].to_numpy(np.int64)  # (arrays, not a filtered copy of a large table)
    i = np.searchsorted(st["start"].to_numpy(np.int64), s, side="right") - 1
    ok = (i >= 0) & (s < st["end"].to_numpy(np.int64)[np.maximum(i, 0)])
    ok &= np.isin(api["pid"].to_numpy(np.int64), st["pid"].to_numpy(np.int64))
    names = api["name"].cat  # (categorical: one code per distinct name)
    code = names.codes.to_numpy(np.int64)
    ok &= code >= 0
    ns = len(st)
    cells = np.bincount(code[ok] * ns + i[ok], weights=(api["end"].to_numpy(np.int64) - s)[ok],
                        minlength=len(names.categories) * ns)
    t = pd.DataFrame(cells.reshape(len(names.categories), ns), index=names.categories)
    normal = np.flatnonzero(~slow)
    cell = t.to_numpy()
    base = np.median(cell[:, normal], axis=1) if normal.size else np.zeros(len(t))
    out = []
    for k in np.flatnonzero(slow):
        ex = cell[:, k] - base
        top = np.argsort(-ex, kind="stable")[:3]
        floor = 0.05 * max(0.0, float(excess[k]))  # (what explains less than 5% of the excess is noise)
        out.append([{"api": str(t.index[j]), "extra_ms": r(float(ex[j]) / 1e6, 3)} for j in top
                    if ex[j] > 0 and ex[j] >= floor])
    return out
