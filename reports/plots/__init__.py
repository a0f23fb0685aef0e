"""The report's pictures: each function takes an :class:`AdviseResult` and returns PNG bytes.

Why these plots: a person opening the report should see in a second *that* the GPU is
idle (utilization timeline), *why* (where the idle time goes, kernel durations against the
10 us line, threads piling into one stream, copy ping-pong) and, with two runs, *whether
a change helped* (before/after).

One module a kind of plot: ``timeline.py`` (over the trace clock), ``breakdown.py``
(where the time goes), ``runs.py`` (across runs), ``_base.py`` (what they share).

Rendering uses matplotlib's object API on the Agg canvas (no pyplot, no global backend
switch, safe in threads). Every string that comes from a trace or a file name goes
through :func:`_short`, which escapes ``$`` so matplotlib's math text cannot misparse it.

Numbers come from the analyzers' ``analyses`` data where they exist (``utilization``
timeline, ``launch-bound`` idle split) and otherwise from the trace tables
(``result.trace``). A function returns ``None`` when the run has nothing to show for it
(no kernels, no copies, no launch join), and the report simply leaves that plot out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import CLOCK_LABEL
from .breakdown import plot_idle_breakdown, plot_kernel_durations, plot_threads_per_stream
from .runs import pareto_front, plot_before_after, plot_history_trend, plot_plan_front
from .timeline import plot_copy_traffic, plot_utilization_timeline

if TYPE_CHECKING:  # pragma: no cover
    from ...diagnose.advise import AdviseResult

__all__ = [
    "plot_utilization_timeline",
    "plot_kernel_durations",
    "plot_idle_breakdown",
    "plot_threads_per_stream",
    "plot_copy_traffic",
    "plot_before_after",
    "plot_history_trend",
    "plot_plan_front",
    "pareto_front",
    "report_plots",
    "PlotSpec",
    "CLOCK_LABEL",
]

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
