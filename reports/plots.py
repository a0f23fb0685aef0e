"""The report's pictures: each function takes an :class:`AdviseResult` and returns PNG bytes.

Why these plots: a person opening the report should see in a second *that* the GPU is
idle (utilization timeline), *why* (where the idle time goes, kernel durations against the
10 us line, threads piling into one stream, copy ping-pong) and, with two runs, *whether
a change helped* (before/after).

Rendering uses matplotlib's object API on the Agg canvas (no pyplot, no global backend
switch, safe in threads). Every string that comes from a trace or a file name goes
through :func:`_short`, which escapes ``$`` so matplotlib's math text cannot misparse it.

Numbers come from the analyzers' ``analyses`` data where they exist (``utilization``
timeline, ``launch-bound`` idle split) and otherwise from the trace tables
(``result.trace``). A function returns ``None`` when the run has nothing to show for it
(no kernels, no copies, no launch join), and the report simply leaves that plot out.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._format import pct

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from ..advise import AdviseResult

__all__ = [
    "plot_utilization_timeline",
    "plot_kernel_durations",
    "plot_idle_breakdown",
    "plot_threads_per_stream",
    "plot_copy_traffic",
    "plot_before_after",
    "plot_history_trend",
    "report_plots",
    "PlotSpec",
]

_RC = {
    "font.size": 10,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.dpi": 100,
}
BUSY = "#2e9e5b"
IDLE = "#d9534f"
GREY = "#9aa0a6"
H2D = "#2f6fd6"
D2H = "#e08a1e"
OTHER = "#8e6bbf"
_DPI = 110
_MAX_STREAM_ROWS = 16


def _fig(w: float, h: float, **kw: Any) -> "Figure":
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), layout="constrained", **kw)


def _png(fig: "Figure") -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    return buf.getvalue()


def _render(draw: Any, *args: Any, **kw: Any) -> bytes | None:
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig = draw(*args, **kw)
        if fig is None:
            return None
        return _png(fig)


def _short(s: str, n: int = 48) -> str:
    """Truncate a label and escape ``$`` (matplotlib math text)."""
    s = str(s)
    s = s if len(s) <= n else s[: n - 1] + "\u2026"
    return s.replace("$", r"\$")


def _util_data(result: "AdviseResult") -> dict[str, Any] | None:
    u = (result.analyses or {}).get("utilization") or {}
    tl = u.get("timeline") if isinstance(u, Mapping) else None
    if tl and tl.get("devices"):
        return dict(tl)
    tr = result.trace
    if tr is None or (len(tr.kernels) == 0 and len(tr.graphs) == 0):
        return None
    # fallback: compute the same binned busy fractions from the trace
    from ..analyzers._util import covered_in_bins, merge_intervals, op_table, stream_label

    ops = op_table(tr)
    lo, hi = int(ops["start"].min()), int(ops["end"].max())
    edges = np.linspace(lo, hi, 101).round().astype(np.int64)
    widths = np.maximum(np.diff(edges), 1).astype(float)
    busy = ops[ops["what"].isin(["kernel", "graph"])]
    devs, streams = {}, {}
    for dev, g in busy.groupby("device", sort=True):
        ms, me = merge_intervals(g["start"].to_numpy(), g["end"].to_numpy())
        devs[str(int(dev))] = list(covered_in_bins(ms, me, edges) / widths)
    for (pid, dev, st), g in busy.groupby(["pid", "device", "stream"], sort=True):
        ms, me = merge_intervals(g["start"].to_numpy(), g["end"].to_numpy())
        streams[stream_label(pid, dev, st)] = list(covered_in_bins(ms, me, edges) / widths)
    return {"start_ns": lo, "end_ns": hi, "bins": 100, "edges_ns": [int(x) for x in edges],
            "devices": devs, "streams": streams}


#: one clock everywhere: plots, the report header, --start/--end and example moments
CLOCK_LABEL = "time on the trace clock (s; what --start/--end take)"


def _edges_s(tl: Mapping[str, Any]) -> np.ndarray:
    if tl.get("edges_ns"):
        e = np.asarray(tl["edges_ns"], dtype=float)
    else:
        e = np.linspace(float(tl["start_ns"]), float(tl["end_ns"]), int(tl["bins"]) + 1)
    return e / 1e9  # the trace's own clock: the one --start/--end take


def _stream_rows(streams: Mapping[str, Sequence[float]]) -> tuple[list[str], np.ndarray]:
    """Stream rows, busiest first, at most ``_MAX_STREAM_ROWS``; labels drop the pid when
    there is only one process."""
    items = sorted(streams.items(), key=lambda kv: -float(np.sum(kv[1])))
    extra = len(items) - _MAX_STREAM_ROWS
    items = items[:_MAX_STREAM_ROWS]
    pids = {k.split(" dev ")[0] for k, _ in items}
    labels = [(k.split(" ", 2)[2] if len(pids) == 1 and k.startswith("pid ") else k) for k, _ in items]
    if extra > 0:
        labels[-1] += f"  (+{extra} more streams)"
    return labels, np.array([list(v) for _, v in items], dtype=float)


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
    from ..advise import idle_share

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
        from matplotlib.colors import LinearSegmentedColormap

        cmap = LinearSegmentedColormap.from_list("idlebusy", ["#fbe3e2", "#f2c14e", BUSY])
        im = axh.imshow(rows, aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest",
                        extent=(edges[0], edges[-1], len(labels) - 0.5, -0.5))
        axh.set_yticks(range(len(labels)), [_short(s, 40) for s in labels])
        cb = fig.colorbar(im, ax=axh, fraction=0.03, pad=0.01)
        cb.set_label("busy")
        cb.set_ticks([0, 0.5, 1], labels=["0%", "50%", "100%"])
    else:
        axh.text(0.5, 0.5, "no kernels", ha="center", va="center", transform=axh.transAxes)
        axh.set_yticks([])
    axh.set_title("Per stream (each row: one CUDA stream, darker green = busier)", loc="left")
    axh.set_xlabel(CLOCK_LABEL)
    return fig


def plot_utilization_timeline(result: "AdviseResult") -> bytes | None:
    """Busy share per time bin for each device (green busy / red idle bars, dashed mean)
    and a heat strip with one row per stream."""
    return _render(_draw_utilization, result)


# --- kernel durations ---------------------------------------------------------------------

def _draw_kernel_durations(result: "AdviseResult", short_kernel_us: float) -> "Figure | None":
    tr = result.trace
    if tr is None or len(tr.kernels) == 0:
        return None
    d_us = (tr.kernels["end"] - tr.kernels["start"]).to_numpy(dtype=float) / 1000.0
    d_us = np.maximum(d_us, 0.01)
    lo, hi = max(d_us.min(), 0.01), max(d_us.max(), short_kernel_us * 2)
    bins = np.logspace(np.log10(lo) - 0.01, np.log10(hi) + 0.01, 60)
    fig = _fig(11, 3.6)
    ax = fig.add_subplot()
    short = d_us < short_kernel_us
    ax.hist(d_us[short], bins=bins, color=IDLE, alpha=0.85, label=f"shorter than {short_kernel_us:g} us")
    ax.hist(d_us[~short], bins=bins, color=BUSY, alpha=0.85, label=f"{short_kernel_us:g} us or longer")
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g} us"))
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
    ax.axvline(short_kernel_us, color="black", ls="--", lw=1.2)
    frac = float(short.mean())
    ax.text(short_kernel_us, ax.get_ylim()[1] * 0.97, f"  \u2190 {frac * 100:.0f}% of {len(d_us):,} kernels "
            f"are shorter than {short_kernel_us:g} us", va="top", ha="left", fontsize=10, fontweight="bold")
    med = float(np.median(d_us))
    ax.set_title(f"Kernel durations (median {med:.1f} us): short kernels cannot hide the launch cost",
                 loc="left")
    ax.set_xlabel("kernel duration (us, log scale)")
    ax.set_ylabel("kernels")
    ax.legend(loc="upper left", fontsize=8)
    return fig


def plot_kernel_durations(result: "AdviseResult", short_kernel_us: float | None = None) -> bytes | None:
    """Histogram of kernel durations on a log x-axis with the short-kernel line (10 us)."""
    if short_kernel_us is None:
        from ..options import Options

        short_kernel_us = Options.short_kernel_us
    return _render(_draw_kernel_durations, result, float(short_kernel_us))


# --- where the time goes --------------------------------------------------------------------

_PARTS = (
    ("compute", "kernels running", BUSY),
    ("copy_only", "only copies/memsets", "#7fb3d5"),
    ("host_wait", "idle: waiting for the CPU to launch (host wait)", IDLE),
    ("short_gap", "idle: gaps between kernels (launch latency)", "#f0ad4e"),
    ("other", "idle: other (syncs, dependencies)", GREY),
)


def _time_split(result: "AdviseResult") -> dict[str, dict[str, float]] | None:
    an = result.analyses or {}
    lb = an.get("launch-bound") or {}
    ut = (an.get("utilization") or {}).get("devices") or {}
    out: dict[str, dict[str, float]] = {}
    for dev, d in (lb.get("devices") or {}).items():
        win = float(d.get("window_ns") or 0)
        if win <= 0:
            continue
        busy = ut.get(str(dev), {}).get("busy_ns")
        idle = float(d.get("idle_ns") or 0)
        compute = float(busy) if busy is not None else max(win - idle, 0.0)
        out[str(dev)] = {
            "window": win,
            "compute": compute,
            "copy_only": max(win - idle - compute, 0.0),
            "host_wait": float(d.get("host_wait_ns") or 0),
            "short_gap": float(d.get("short_gap_ns") or 0),
            "other": float(d.get("other_ns") or 0),
        }
    return out or None


def _draw_idle(result: "AdviseResult") -> "Figure | None":
    split = _time_split(result)
    if split is None:
        return None
    devs = sorted(split, key=int)
    fig = _fig(11, 1.6 + 0.7 * len(devs))
    ax = fig.add_subplot()
    for i, dev in enumerate(devs):
        s = split[dev]
        left = 0.0
        for key, label, color in _PARTS:
            v = s[key] / s["window"] * 100
            ax.barh(i, v, left=left, color=color, label=label if i == 0 else None, height=0.6)
            if v >= 4:
                ax.text(left + v / 2, i, f"{v:.0f}%", ha="center", va="center", fontsize=10,
                        color="white" if key in ("compute", "host_wait") else "black", fontweight="bold")
            left += v
    ax.set_yticks(range(len(devs)), [f"device {d}" for d in devs])
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.set_xlabel("% of the device's window")
    tot = {k: sum(split[d][k] for d in devs) for k, _, _ in _PARTS}
    W = sum(split[d]["window"] for d in devs)
    idle_parts = {k: tot[k] for k in ("host_wait", "short_gap", "other")}
    worst = max(idle_parts, key=lambda k: idle_parts[k])
    names = {"host_wait": "waiting for the CPU to launch work", "short_gap": "gaps between back-to-back kernels",
             "other": "syncs and dependencies"}
    idle = sum(idle_parts.values())
    ax.set_title(f"Where the time goes: idle {idle / W * 100:.0f}%, mostly {names[worst]} "
                 f"({idle_parts[worst] / W * 100:.0f}% of the time)" if idle > 0 else "Where the time goes",
                 loc="left")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(devs) == 1 else -0.2), ncols=3,
              fontsize=8, frameon=False)
    return fig


def plot_idle_breakdown(result: "AdviseResult") -> bytes | None:
    """One stacked bar per device: kernels, copies only, and the idle time split into
    host wait / kernel gaps / other (from the ``launch-bound`` analyzer)."""
    return _render(_draw_idle, result)


# --- threads per stream ---------------------------------------------------------------------

def _draw_threads(result: "AdviseResult", contention_min_threads: int) -> "Figure | None":
    tr = result.trace
    if tr is None:
        return None
    from ..analyzers._util import launches

    j = launches(tr, ("kernel", "memcpy", "memset", "graph"))
    if len(j) == 0:
        return None
    cnt = j.groupby(["pid", "device", "stream", "tid"]).size().rename("n").reset_index()
    streams = (cnt.groupby(["pid", "device", "stream"])["n"].sum().sort_values(ascending=False))
    keys = list(streams.index[:_MAX_STREAM_ROWS])
    one_pid = cnt["pid"].nunique() == 1
    fig = _fig(11, 1.3 + 0.45 * len(keys))
    ax = fig.add_subplot()
    palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]
    labels = []
    worst = 0
    for i, (pid, dev, st) in enumerate(keys):
        sub = cnt[(cnt["pid"] == pid) & (cnt["device"] == dev) & (cnt["stream"] == st)].sort_values("n", ascending=False)
        tot = float(sub["n"].sum())
        left = 0.0
        for k, n in enumerate(sub["n"].to_numpy()):
            v = n / tot * 100
            ax.barh(i, v, left=left, color=palette[k % len(palette)], height=0.6, edgecolor="white")
            left += v
        nthr = len(sub)
        worst = max(worst, nthr)
        lab = (f"dev {dev} stream {st}" if one_pid else f"pid {pid} dev {dev} stream {st}")
        labels.append(f"{lab}: {nthr} thread{'s' if nthr != 1 else ''}")
        if nthr >= contention_min_threads:
            ax.text(101, i, "contended", va="center", ha="left", color=IDLE, fontweight="bold", fontsize=9)
    ax.set_yticks(range(len(keys)), labels)
    ax.set_xlim(0, 112)
    ax.set_xticks([0, 25, 50, 75, 100])
    ax.invert_yaxis()
    ax.set_xlabel("% of the stream's launches (one colour per CPU thread)")
    title = "CPU threads launching into each stream"
    if worst >= contention_min_threads:
        title = f"CPU threads per stream: up to {worst} threads share one stream"
    ax.set_title(title, loc="left")
    return fig


def plot_threads_per_stream(result: "AdviseResult", contention_min_threads: int | None = None) -> bytes | None:
    """One bar per stream split by the CPU threads that launched into it."""
    if contention_min_threads is None:
        from ..options import Options

        contention_min_threads = Options.contention_min_threads
    return _render(_draw_threads, result, int(contention_min_threads))


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
    return x / max(e[-1], 1e-12), arr.mean(axis=0)


def _draw_before_after(a: "AdviseResult", b: "AdviseResult", a_label: str, b_label: str) -> "Figure":
    fig = _fig(11, 3.8)
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
    ax1.legend(fontsize=8, loc="upper right")
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
    if drawn:
        ax2.legend(fontsize=8, loc="upper right")
    else:
        ax2.text(50, 50, "no utilization timeline in these runs", ha="center", va="center", color=GREY)
    return fig


def plot_before_after(before: "AdviseResult", after: "AdviseResult", before_label: str = "before",
                      after_label: str = "after") -> bytes:
    """Key metrics side by side and both utilization timelines on a common 0-100% axis."""
    out = _render(_draw_before_after, before, after, before_label, after_label)
    assert out is not None
    return out


# --- history trend --------------------------------------------------------------------------

def _draw_trend(rows: Sequence[Mapping[str, Any]]) -> "Figure | None":
    pts = [(r.get("when_utc"), r.get("gpu_utilization"), r.get("git_commit")) for r in rows
           if r.get("gpu_utilization") is not None]
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
    """``gpu_utilization`` of history rows (:func:`recsys_doctor.history.list_runs`) in
    time order, the newest point (this run) highlighted; ``None`` under two runs."""
    return _render(_draw_trend, rows)


# --- all of them ----------------------------------------------------------------------------

PlotSpec = tuple[str, str, str, bytes]  # (key, title, caption, png)


def report_plots(result: "AdviseResult", *, options: Any = None) -> list[PlotSpec]:
    """Every plot that has something to show for ``result``, in reading order."""
    sk = getattr(options, "short_kernel_us", None)
    cm = getattr(options, "contention_min_threads", None)
    specs = [
        ("utilization", "Utilization over time",
         "Top: share of each time bin the device spent running kernels (green) or idle (red); dashed: "
         "mean. Bottom: one row per stream.", lambda: plot_utilization_timeline(result)),
        ("idle", "Where the time goes",
         "Each device's window split into kernels, copies only, and idle time by cause.",
         lambda: plot_idle_breakdown(result)),
        ("kernels", "Kernel durations",
         "Kernels left of the dashed line are too short to hide their launch cost.",
         lambda: plot_kernel_durations(result, sk)),
        ("threads", "Threads per stream",
         "Several CPU threads launching into one stream serialize on it.",
         lambda: plot_threads_per_stream(result, cm)),
        ("copies", "Copy traffic",
         "Host-to-device copies above the axis, device-to-host below.",
         lambda: plot_copy_traffic(result)),
    ]
    out: list[PlotSpec] = []
    for key, title, cap, fn in specs:
        png = fn()
        if png:
            out.append((key, title, cap, png))
    return out
