"""What every plot of the report shares: style, colours, the figure and PNG plumbing, the
utilization timeline data and the trace clock."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType

    from ...diagnose.advise import AdviseResult

__all__ = ['BUSY', 'IDLE', 'GREY', 'H2D', 'D2H', 'OTHER', 'CLOCK_LABEL']


_RC: dict[RcKeyType, Any] = {
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
    from ...analyzers._util import covered_in_bins, merge_intervals, op_table, stream_label

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
