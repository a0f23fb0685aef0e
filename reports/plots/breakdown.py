"""Where the time goes: kernel durations against the short-kernel line, the idle time by
cause, and the CPU threads launching into each stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._base import BUSY, GREY, IDLE, _fig, _MAX_STREAM_ROWS, _render

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from ...diagnose.advise import AdviseResult

__all__ = ['plot_kernel_durations', 'plot_idle_breakdown', 'plot_threads_per_stream']


# --- kernel durations ---------------------------------------------------------------------

def _draw_kernel_durations(result: "AdviseResult", short_kernel_us: float) -> "Figure | None":
    tr = result.trace
    if tr is None or len(tr.kernels) == 0:
        return None
    d_us = (tr.kernels["end"] - tr.kernels["start"]).to_numpy(dtype=float) / 1000.0
    d_us = np.maximum(d_us, 0.01)
    lo, hi = max(d_us.min(), 0.01), max(d_us.max(), short_kernel_us * 2)
    bins = np.logspace(np.log10(lo) - 0.01, np.log10(hi) + 0.01, 60).tolist()
    fig = _fig(11, 3.6)
    ax = fig.add_subplot()
    short = d_us < short_kernel_us
    ax.hist(d_us[short], bins=bins, color=IDLE, alpha=0.85, label=f"shorter than {short_kernel_us:g} us")
    ax.hist(d_us[~short], bins=bins, color=BUSY, alpha=0.85, label=f"{short_kernel_us:g} us or longer")
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g} us"))
    if hi / lo < 100:  # two decades or less: the minor ticks are labelled, plainly (not 2x10^0)
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
    ax.axvline(short_kernel_us, color="black", ls="--", lw=1.2)
    frac = float(short.mean())
    ax.text(short_kernel_us, ax.get_ylim()[1] * 0.97, f"  \u2190 {frac * 100:.0f}% of {len(d_us):,} kernels "
            f"are shorter than {short_kernel_us:g} us", va="top", ha="left", fontsize=10, fontweight="bold")
    ax.set_title(_durations_title(float(np.median(d_us)), (result.analyses or {}).get("short-kernels") or {}),
                 loc="left")
    ax.set_xlabel("kernel duration (us, log scale)")
    ax.set_ylabel("kernels")
    ax.legend(loc="upper left", fontsize=8)
    return fig


def _durations_title(med_us: float, sk: dict) -> str:
    """What the histogram says, from the data: the median kernel against the measured
    launch cost (the ``short-kernels`` analysis' median launch call). Only a median kernel
    shorter than its launch call means the launches cannot hide behind the kernels."""
    head = f"Kernel durations (median {med_us:.1f} us)"
    launch = sk.get("median_launch_us")
    if launch is None:
        return head
    if med_us < launch:
        return f"{head}: shorter than a launch call ({launch:.1f} us), so launches cannot hide behind them"
    return f"{head}: longer than a launch call ({launch:.1f} us), so launches can hide behind them"


def plot_kernel_durations(result: "AdviseResult", short_kernel_us: float | None = None) -> bytes | None:
    """Histogram of kernel durations on a log x-axis with the short-kernel line (10 us)."""
    if short_kernel_us is None:
        from ...options import Options

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
            # (allocator gaps - cudaMalloc/cudaFree - are not a launch wait: shown as other)
            "other": float(d.get("other_ns") or 0) + float(d.get("allocator_ns") or 0),
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
    from ...analyzers._util import launches

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
        from ...options import Options

        contention_min_threads = Options.contention_min_threads
    return _render(_draw_threads, result, int(contention_min_threads))
