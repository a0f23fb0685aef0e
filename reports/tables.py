"""Terminal tables of ``compare`` and ``history`` (rich): the library side of
``recsys_doctor/cli/gate.py``. Strings from traces and the database go in as plain text,
never as rich markup."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from .._format import fmt, pct

if TYPE_CHECKING:  # pragma: no cover
    from ..gate import CompareResult

__all__ = ["compare_view", "history_table", "print_wide"]


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
    """One row per recorded run (:func:`recsys_doctor.history.list_runs`), newest first."""
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



def print_wide(renderable: RenderableType) -> None:
    """Print to stdout: fitted to a terminal, and in a pipe or CI log as wide as the
    table needs (rich would otherwise cut every line at 80 columns)."""
    console = Console()
    if not console.is_terminal:
        need = console.measure(renderable, options=console.options.update_width(1000)).maximum
        console.width = max(console.width, need)
    console.print(renderable)
