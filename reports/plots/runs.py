"""Plots across runs: before/after of two runs, and the utilization trend of the history."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._base import BUSY, GREY, H2D, IDLE, _edges_s, _fig, _render, _short, _util_data

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from ...diagnose.advise import AdviseResult

__all__ = ['plot_before_after', 'plot_history_trend', 'plot_plan_front', 'pareto_front']


# --- before / after -------------------------------------------------------------------------

_COMPARE_METRICS = (
    ("gpu_utilization", "GPU utilization"),
    ("short_kernel_fraction", "short kernels (<10 us)"),
)


def _mean_timeline(result: "AdviseResult") -> tuple[np.ndarray, np.ndarray] | None:
    tl = _util_data(result)
    if tl is None:
        return None
    arr = np.array([list(v) for v in tl["devices"].values()], dtype=float)
    if arr.size == 0:
        return None
    e = _edges_s(tl)
    x = (e[:-1] + e[1:]) / 2
    # the share of the run: from the first edge, not from the clock's zero (a trace's
    # clock rarely starts at its first event: 4.6 s in, the runs drew at 85-100%)
    return (x - e[0]) / max(e[-1] - e[0], 1e-12), arr.mean(axis=0)


def _draw_before_after(a: "AdviseResult", b: "AdviseResult", a_label: str, b_label: str) -> "Figure":
    fig = _fig(11, 4.2)
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.6])
    sa, sb = a.summary or {}, b.summary or {}
    xs = np.arange(len(_COMPARE_METRICS))
    va = [float(sa.get(k) or 0) * 100 for k, _ in _COMPARE_METRICS]
    vb = [float(sb.get(k) or 0) * 100 for k, _ in _COMPARE_METRICS]
    ax1.bar(xs - 0.2, va, width=0.4, color=GREY, label=_short(a_label, 30))
    ax1.bar(xs + 0.2, vb, width=0.4, color=H2D, label=_short(b_label, 30))
    for x, v in zip(xs - 0.2, va):
        ax1.text(x, v + 1, f"{v:.0f}%", ha="center", fontsize=9)
    for x, v in zip(xs + 0.2, vb):
        ax1.text(x, v + 1, f"{v:.0f}%", ha="center", fontsize=9, fontweight="bold")
    ax1.set_xticks(xs, [lab for _, lab in _COMPARE_METRICS])
    ax1.set_ylim(0, 110)
    ax1.set_ylabel("%")
    ua, ub = sa.get("gpu_utilization"), sb.get("gpu_utilization")
    if ua is not None and ub is not None:
        ax1.set_title(f"Utilization {ua * 100:.0f}% \u2192 {ub * 100:.0f}% ({(ub - ua) * 100:+.0f} points)", loc="left")
    drawn = 0
    for res, lab, color in ((a, a_label, GREY), (b, b_label, H2D)):
        mt = _mean_timeline(res)
        if mt is not None:
            ax2.plot(mt[0] * 100, mt[1] * 100, color=color, lw=1.6, label=_short(lab, 40))
            drawn += 1
    ax2.set_ylim(0, 100)
    ax2.set_xlim(0, 100)
    ax2.set_xlabel("% of the run")
    ax2.set_ylabel("% busy")
    ax2.set_title("Utilization over each run", loc="left")
    if not drawn:
        ax2.text(50, 50, "no utilization timeline in these runs", ha="center", va="center", color=GREY)
    # one legend for both panels (same colours), below them: inside an axes it covered
    # the bar labels near 100%
    fig.legend(handles=ax1.containers[:2], labels=[_short(a_label, 40), _short(b_label, 40)],
               loc="outside lower center", ncols=2, fontsize=9, frameon=False)
    return fig


def plot_before_after(before: "AdviseResult", after: "AdviseResult", before_label: str = "before",
                      after_label: str = "after") -> bytes:
    """Key metrics side by side and both utilization timelines on a common 0-100% axis."""
    out = _render(_draw_before_after, before, after, before_label, after_label)
    assert out is not None
    return out


# --- plan search: throughput against p99 ------------------------------------------------

def pareto_front(points: Sequence[tuple[str, float, float]]) -> list[str]:
    """The labels of the throughput/latency Pareto front of ``(label, qps, p99_ms)``: the
    points that no other beats on both counts (more q/s at no more p99), by rising p99."""
    front: list[tuple[str, float, float]] = []
    for lab, q, p in sorted(points, key=lambda t: (t[2], -t[1])):
        if not front or q > front[-1][1]:
            front.append((lab, q, p))
    return [lab for lab, _, _ in front]


def _draw_plan_front(cands: Sequence[Mapping[str, Any]], budget_ms: float | None, chosen: str | None) -> "Figure | None":
    pts = [(str(c["plan"]), float(c["measured"]), float(c["p99_ms"])) for c in cands
           if c.get("measured") is not None and c.get("p99_ms") is not None]
    if len(pts) < 2:
        return None
    front = pareto_front(pts)
    fig = _fig(7.5, 4.2)
    ax = fig.add_subplot()
    on = [t for t in pts if t[0] in front]
    off = [t for t in pts if t[0] not in front]
    if off:
        ax.scatter([t[2] for t in off], [t[1] for t in off], color=GREY, label="measured plan", zorder=2)
    ax.plot([t[2] for t in on], [t[1] for t in on], "o-", color=BUSY, label="Pareto front", zorder=3)
    for lab, q, p in pts:
        ax.annotate(_short(lab, 34), (p, q), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if budget_ms:
        ax.axvline(budget_ms, color=H2D, linestyle="--", label=f"p99 budget {budget_ms:g} ms")
    for lab, q, p in pts:
        if lab == chosen:
            ax.scatter([p], [q], s=220, facecolors="none", edgecolors="black", linewidths=1.5, label="kept", zorder=4)
    from matplotlib.ticker import FormatStrFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.set_xlabel("measured p99 latency (ms, log)")
    ax.set_ylabel("measured queries/s")
    ax.set_title("Plan search: throughput against tail latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def plot_plan_front(cands: Sequence[Mapping[str, Any]], budget_ms: float | None = None,
                    chosen: str | None = None) -> bytes | None:
    """Each measured candidate plan as a point (p99 ms, queries/s), the Pareto front joined,
    the p99 budget as a vertical line, the kept plan circled. None with fewer than two
    measured plans."""
    return _render(_draw_plan_front, cands, budget_ms, chosen)


# --- history trend --------------------------------------------------------------------------

def _draw_trend(rows: Sequence[Mapping[str, Any]]) -> "Figure | None":
    pts = [(r.get("when_utc"), u, r.get("git_commit")) for r in rows
           if (u := r.get("gpu_utilization")) is not None]
    if len(pts) < 2:
        return None
    pts.sort(key=lambda p: str(p[0]))
    ys = np.array([float(p[1]) * 100 for p in pts])
    xs = np.arange(len(pts))
    fig = _fig(11, 2.8)
    ax = fig.add_subplot()
    ax.plot(xs, ys, "-o", color=H2D, ms=4)
    ax.plot(xs[-1:], ys[-1:], "o", color=IDLE if ys[-1] < ys[:-1].max() else BUSY, ms=9, label="this run")
    ax.set_ylim(0, max(100, ys.max() + 5))
    ax.set_ylabel("GPU utilization %")
    step = max(1, len(pts) // 8)
    ax.set_xticks(xs[::step], [f"{str(p[0])[:10]}\n{(p[2] or '')[:7]}" for p in pts[::step]], fontsize=8)
    ax.set_title(f"Utilization trend over the last {len(pts)} runs of this workload", loc="left")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def plot_history_trend(rows: Sequence[Mapping[str, Any]]) -> bytes | None:
    """``gpu_utilization`` of history rows (:func:`recsys_doctor.history.db.list_runs`) in
    time order, the newest point (this run) highlighted; ``None`` under two runs."""
    return _render(_draw_trend, rows)
