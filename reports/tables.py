"""Terminal tables of ``compare`` and ``history`` (rich): the library side of
``recsys_doctor/cli/gate.py``. Strings from traces and the database go in as plain text,
never as rich markup."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .._util.format import fmt, pct

if TYPE_CHECKING:  # pragma: no cover
    from ..gate import CompareResult

__all__ = ["compare_view", "history_table", "print_wide", "wide_console"]


def _signed(d: float | None) -> str:
    return "n/a" if d is None else ("+" if d > 0 else "") + fmt(d)


def compare_view(c: "CompareResult") -> RenderableType:
    """Metric deltas (B - A), then the findings that appeared, disappeared or changed severity."""
    tab = Table(box=None, pad_edge=False)
    tab.add_column("metric")
    for head in ("A", "B", "B - A"):
        tab.add_column(head, justify="right")
    for m in c.metrics:
        tab.add_row(Text(m["metric"]), fmt(m["a"]), fmt(m["b"]), _signed(m["delta"]))
    parts: list[RenderableType] = [Text(f"A: {c.a}\nB: {c.b}\n"), tab]
    for label, fs in (("appeared in B", c.appeared), ("disappeared from A", c.disappeared)):
        parts.append(Text(f"\nfindings {label}: {len(fs)}"))
        parts += [Text(f"  [{f['severity']}] {f['id']}: {f['title']}") for f in fs]
    if c.changed:
        parts.append(Text(f"\nseverity changed: {len(c.changed)}"))
        parts += [Text(f"  {f['id']}: {f['a']} -> {f['b']}") for f in c.changed]
    return Group(*parts)


def _check(r: Mapping[str, Any]) -> str:
    return "" if r.get("passed") is None else ("pass" if r["passed"] else "FAIL")


def history_table(runs: Sequence[Mapping[str, Any]]) -> Table:
    """One row per recorded run (:func:`recsys_doctor.history.db.list_runs`), newest first."""
    tab = Table(box=None, pad_edge=False)
    for head, just in (("id", "right"), ("when (UTC)", "left"), ("cmd", "left"), ("util", "right"),
                       ("kernels", "right"), ("commit", "left"), ("branch", "left"), ("check", "left"),
                       ("workload", "left")):
        tab.add_column(head, justify=just, no_wrap=head != "workload")  # type: ignore[arg-type]
    for r in runs:
        tab.add_row(str(r["id"]), r["when_utc"], r["command"], pct(r.get("gpu_utilization")), fmt(r.get("kernels")),
                    Text((r.get("git_commit") or "")[:8]), Text((r.get("git_branch") or "")[:16]), _check(r),
                    Text(r.get("workload") or ""))
    return tab



def wide_console(*renderables: RenderableType, console: Console | None = None, wrap: bool = False) -> Console:
    """A console for ``renderables``: fitted to a terminal, and in a pipe, a file or a CI
    log as wide as they need, so that nothing is cut or folded at rich's default of 80
    columns (``advise DIR | less`` showed the header "launch-bound" as "laun / ch-b /
    ound"). ``wrap``: text may wrap, only what cannot wrap (a long kernel name in a table
    cell) sets the width; else every table gets its full width."""
    console = console or Console()
    if not console.is_terminal and renderables:
        opts = console.options.update_width(1000)
        need = max(_least_width(console, r, opts) if wrap else console.measure(r, options=opts).maximum
                   for r in renderables)
        console.width = max(console.width, need)
    return console


def _least_width(console: Console, r: RenderableType, opts: Any) -> int:
    """The narrowest width at which ``r`` wraps but crops nothing. A panel measures as
    wide as its widest line, so its body is measured instead (plus border and padding)."""
    if isinstance(r, Panel):
        return _least_width(console, r.renderable, opts) + 4
    if isinstance(r, Group):
        return max((_least_width(console, x, opts) for x in r.renderables), default=0)
    return console.measure(r, options=opts).minimum


def print_wide(renderable: RenderableType) -> None:
    """Print to stdout through :func:`wide_console`."""
    wide_console(renderable).print(renderable)
