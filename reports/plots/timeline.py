"""Plots over the trace clock: utilization per device and stream, copy traffic by direction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._util.format import pct
from ._base import BUSY, CLOCK_LABEL, D2H, H2D, IDLE, OTHER, _edges_s, _fig, _render, _short, _stream_rows, _util_data

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from ...diagnose.advise import AdviseResult

__all__ = ['plot_utilization_timeline', 'plot_copy_traffic', 'stream_cmap']


# --- utilization timeline -----------------------------------------------------------------

def _draw_utilization(result: "AdviseResult") -> "Figure | None":
    tl = _util_data(result)
    if tl is None:
        return None
    edges = _edges_s(tl)
    devs = tl["devices"]
    labels, rows = _stream_rows(tl.get("streams") or {})
    n_dev = len(devs)
    h_top = 1.9 * n_dev
    h_heat = 0.32 * max(len(labels), 1) + 0.9
    fig = _fig(11, h_top + h_heat + 0.9)
    gs = fig.add_gridspec(n_dev + 1, 1, height_ratios=[1.9] * n_dev + [0.32 * max(len(labels), 1) + 0.5])
    overall = (result.summary or {}).get("gpu_utilization")
    from ...diagnose.advise import idle_share

    idle = idle_share(result.summary or {}, result.analyses or {})  # the one idle figure
    fig.suptitle(f"GPU busy {pct(overall, 0)} of the time, idle {pct(idle, 0)}"
                 " (green = computing, red = idle; the rest: copies only)", fontsize=13, fontweight="bold",
                 color=IDLE if (overall is not None and overall < 0.5) else "black")
    w = np.diff(edges)
    ax0 = None
    for i, (dev, frac) in enumerate(sorted(devs.items(), key=lambda kv: int(kv[0]))):
        ax = fig.add_subplot(gs[i, 0], sharex=ax0)
        ax0 = ax0 or ax
        f = np.clip(np.asarray(frac, dtype=float), 0, 1)
        ax.bar(edges[:-1], f * 100, width=w, align="edge", color=BUSY, label="busy (kernels)")
        ax.bar(edges[:-1], (1 - f) * 100, bottom=f * 100, width=w, align="edge", color=IDLE, alpha=0.28,
               label="idle")
        mean = float(np.mean(f)) if f.size else 0.0
        ax.axhline(mean * 100, color="black", ls="--", lw=1)
        ax.text(edges[-1], mean * 100, f" mean {mean * 100:.0f}%", va="center", ha="left", fontsize=9)
        ax.set_ylim(0, 100)
        ax.set_ylabel("% busy")
        dv = (result.analyses or {}).get("utilization", {}).get("devices", {}).get(str(dev), {})
        st = dv.get("steady_utilization") if isinstance(dv, Mapping) else None
        extra = f", steady state {pct(st, 0)}" if st is not None else ""
        ax.set_title(f"Device {dev}: utilization over time{extra}", loc="left")
        if i == 0:
            ax.legend(loc="upper right", fontsize=8, ncols=2, framealpha=0.9)
    axh = fig.add_subplot(gs[n_dev, 0], sharex=ax0)
    if len(labels):
        im = axh.imshow(rows, aspect="auto", cmap=stream_cmap(), vmin=_BUSY_MIN, vmax=1, interpolation="nearest",
                        extent=(edges[0], edges[-1], len(labels) - 0.5, -0.5))
        axh.set_yticks(range(len(labels)), [_short(s, 40) for s in labels])
        cb = fig.colorbar(im, ax=axh, fraction=0.03, pad=0.01, extend="min")  # the grey triangle: idle
        cb.set_label("busy")
        cb.set_ticks([0, 0.5, 1], labels=["0%", "50%", "100%"])
    else:
        axh.text(0.5, 0.5, "no kernels", ha="center", va="center", transform=axh.transAxes)
        axh.set_yticks([])
    axh.set_title("Per stream (each row: one CUDA stream; grey idle, orange barely busy, darker green busier)",
                  loc="left")
    axh.set_xlabel(CLOCK_LABEL)
    return fig


#: a time bin busier than this is drawn in the colour map; below it, grey (idle)
_BUSY_MIN = 1e-6


def stream_cmap() -> Any:
    """The per-stream strip's colours: idle bins grey, any busy share in colour from a
    saturated orange (a stream busy 2% of a bin must stand out from an idle one and from
    the white page) through yellow-green to the report's busy green and darker."""
    from matplotlib.colors import LinearSegmentedColormap

    cmap = LinearSegmentedColormap.from_list("busy", ["#e8872a", "#e3b23c", "#8fbf4d", BUSY, "#17613a"])
    return cmap.with_extremes(under="#e6e6e6")


def plot_utilization_timeline(result: "AdviseResult") -> bytes | None:
    """Busy share per time bin for each device (green busy / red idle bars, dashed mean)
    and a heat strip with one row per stream."""
    return _render(_draw_utilization, result)


# --- copy traffic ---------------------------------------------------------------------------

def _draw_copies(result: "AdviseResult", bins: int) -> "Figure | None":
    tr = result.trace
    if tr is None or len(tr.memcpys) == 0:
        return None
    m = tr.memcpys
    act = tr.gpu_activity()
    lo, hi = int(act["start"].min()), int(act["end"].max())
    if hi <= lo:
        hi = lo + 1
    edges = np.linspace(lo, hi, bins + 1)
    mid = m["start"].to_numpy(dtype=float)
    kinds = m["kind"].astype(str).to_numpy()
    groups = {"H2D": kinds == "h2d", "D2H": kinds == "d2h"}
    groups["other"] = ~(groups["H2D"] | groups["D2H"])
    e_s = edges / 1e9
    w = np.diff(e_s)
    bw_ms = (hi - lo) / bins / 1e6
    fig = _fig(11, 4.6)
    ax_n, ax_b = fig.subplots(2, 1, sharex=True)
    nbytes = m["bytes"].to_numpy(dtype=float)
    for name, sign, color in (("H2D", 1, H2D), ("D2H", -1, D2H), ("other", 1, OTHER)):
        sel = groups[name]
        if not sel.any():
            continue
        c, _ = np.histogram(mid[sel], bins=edges)
        b, _ = np.histogram(mid[sel], bins=edges, weights=nbytes[sel])
        bottom_n = 0
        ax_n.bar(e_s[:-1], sign * c / bw_ms, width=w, align="edge", color=color, alpha=0.9,
                 label=f"{name} ({int(sel.sum()):,} copies)", bottom=bottom_n)
        ax_b.bar(e_s[:-1], sign * b / 1e6 / (bw_ms / 1000), width=w, align="edge", color=color, alpha=0.9)
    for ax in (ax_n, ax_b):
        ax.axhline(0, color="black", lw=0.8)
    sw = (result.summary or {}).get("memcpy", {}) or {}
    switches = sw.get("direction_switches")
    ax_n.set_title("Copy traffic over time (H2D up, D2H down)"
                   + (f": {switches:,} direction switches" if isinstance(switches, int) else ""), loc="left")
    ax_n.set_ylabel("copies / ms")
    ax_b.set_ylabel("MB / s")
    ax_b.set_xlabel(CLOCK_LABEL)
    ax_n.legend(loc="upper right", fontsize=8, ncols=3)
    return fig


def plot_copy_traffic(result: "AdviseResult", bins: int = 100) -> bytes | None:
    """Copies per ms and MB/s per time bin, H2D above the axis and D2H below."""
    return _render(_draw_copies, result, int(bins))
