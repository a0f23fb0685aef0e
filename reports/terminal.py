"""The rich terminal report of ``advise``: summary, findings by severity, plan.

Every string that comes from a trace (kernel names, NVTX text, thread names) is put into
:class:`rich.text.Text` objects or escaped, never interpreted as rich markup: kernel names
such as ``void at::native::foo<float>[abc]`` must print as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .._util.format import NAME_WIDTH, duration_ns, fmt_evidence, fmt_unit, shorten
from ..analyzers import evidence_units
from ._common import clock_s, evidence_label, framework_text, kernel_label, plan_rows, report_kernel_labels, shown_plan

if TYPE_CHECKING:  # pragma: no cover
    from ..diagnose.advise import AdviseResult

__all__ = ["render_terminal", "NAME_WIDTH"]

_SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "note": "dim"}


def _where_text(where: list[dict[str, Any]], limit: int = 3) -> Text:
    t = Text()
    for i, w in enumerate(where[:limit]):
        if i:
            t.append("; ")
        parts = [f"{k}={shorten(str(w[k]))}" for k in ("nvtx", "cpu_op", "process", "thread", "api", "callsite", "stream",
                                                             "device", "kernel")
                 if w.get(k) is not None]
        t.append(", ".join(parts) or "?")
        if w.get("share") is not None:
            t.append(f" ({w['share'] * 100:.0f}%)", style="dim")
    if len(where) > limit:
        t.append(f"; +{len(where) - limit} more", style="dim")
    return t


def _summary_table(res: "AdviseResult") -> Table:
    s = res.summary
    tab = Table(title="Summary", show_header=False, title_justify="left", box=None, pad_edge=False)
    tab.add_column("metric", style="bold")
    tab.add_column("value")
    util = res.analyses.get("utilization", {})
    rows = [
        ("kernels", fmt_unit(None, s.get("kernels"))),
        ("GPU utilization (kernel busy / window)", fmt_unit("share", s.get("gpu_utilization"))),
    ]
    steady = util.get("steady_state_utilization")
    if steady is not None:
        rows.append(("  steady state (start-up excluded)", fmt_unit("share", steady)))
    from ..diagnose.advise import idle_share

    idle = idle_share(s, res.analyses)
    if idle is not None:
        rows.append(("GPU idle (no kernel, copy or memset running)", fmt_unit("share", idle)))
    sk = res.analyses.get("short-kernels") or {}
    if sk.get("threshold_us") is not None and sk.get("count_share") is not None:
        short_row = (f"kernels shorter than {sk['threshold_us']:g} us", fmt_unit("share", sk["count_share"]))
    else:
        short_row = ("kernels shorter than 10 us", fmt_unit("share", s.get("short_kernel_fraction")))
    rows += [
        short_row,
        ("most CPU threads launching into one stream", fmt_unit(None, s.get("launch_threads_per_stream_max"))),
    ]
    m = s.get("memcpy") or {}
    rows.append(("copies H2D / D2H / direction switches",
                 f"{m.get('h2d', 0):,} / {m.get('d2h', 0):,} / {m.get('direction_switches', 0):,}"))
    rows.append(("synchronize calls", fmt_unit(None, s.get("sync_calls"))))
    for k, v in rows:
        tab.add_row(k, v)
    return tab


def _rows_text(rows: list[dict[str, Any]], limit: int = 5, labels: dict[str, str] | None = None,
               units: dict[str, str] | None = None) -> Text:
    """Evidence rows (worst kernels, streams, regions), one per line: the name first,
    shortened, then its numbers. Lines wrap cleanly at any terminal width."""
    t = Text()
    for i, r in enumerate(rows[:limit]):
        if i:
            t.append("\n")
        parts = []
        for k, v in r.items():
            if isinstance(v, (dict, list)):
                continue
            if k in ("name", "kernel"):
                t.append((labels or {}).get(v) or kernel_label(v, 70), style="bold")
                t.append("  ")
            elif k in ("nvtx", "stream", "thread", "region", "sequence"):
                t.append(shorten(str(v), 70) + "  ", style="bold")
            else:
                parts.append(f"{evidence_label(k)}={fmt_evidence(units or {}, k, v)}")
        t.append(", ".join(parts))
    if len(rows) > limit:
        t.append(f"\n+{len(rows) - limit} more", style="dim")
    return t


def _finding_panel(f: Any, labels: dict[str, str] | None = None) -> Panel:
    style = _SEV_STYLE.get(f.severity, "")
    body = Table.grid(padding=(0, 1))
    body.add_column(style="dim", no_wrap=True)
    body.add_column()
    body.add_row("", Text(f.title, style="bold"))
    if getattr(f, "recoverable_ns", None) is not None and (f.recoverable_ns or f.severity != "note"):
        body.add_row("to win", Text(f"up to {duration_ns(f.recoverable_ns)} of GPU time "
                                    f"({(f.recoverable_share or 0) * 100:.1f}% of the steady state)"))
    units = evidence_units(f.id)
    ev = ", ".join(f"{evidence_label(k)}={fmt_evidence(units, k, v)}" for k, v in f.evidence.items()
                   if (not isinstance(v, (list, dict)) or k in ("top",)) and k != "sequence_head")
    body.add_row("evidence", Text(ev))
    for k, v in f.evidence.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            body.add_row(k.replace("_", " "), _rows_text(v, labels=labels, units=units))
    if f.where:
        body.add_row("where", _where_text(f.where))
    if getattr(f, "examples", None):
        body.add_row("look at", _examples_text(f.examples))
    body.add_row("fix", Text(f.recommendation))
    title = Text.assemble((f"{f.severity.upper()}", style), " ", (f.id, "bold"))
    return Panel(body, title=title, title_align="left", border_style=style or "white")


def _examples_text(examples: list[dict[str, Any]]) -> Text:
    """``at 4.385484 s for 77.63 us: what (thread, stream)`` - moments to open in Nsight
    Systems or Perfetto, on the trace's own clock."""
    t = Text()
    for i, e in enumerate(examples[:3]):
        if i:
            t.append("\n")
        t.append(f"at {clock_s(e.get('start_ns'))} for {duration_ns(e.get('duration_ns') or 0)}", style="bold")
        where = ", ".join(str(e[k]) for k in ("thread", "stream") if e.get(k))
        t.append(f": {e.get('what', '')}" + (f" ({where})" if where else ""))
    return t


def window_text(info: dict[str, Any]) -> str:
    """The trace's span and the analysis window, on the trace's own clock."""
    span = info.get("span_ns")
    out = f"trace spans {clock_s(span[0])} - {clock_s(span[1])} (trace clock)" if span else "empty trace"
    w = info.get("window_ns")
    if info.get("nvtx"):
        out += f"; analysis window: NVTX range {info['nvtx']!r}"
        if w:
            out += f" = {clock_s(w[0]) if w[0] is not None else 'start'} - {clock_s(w[1]) if w[1] is not None else 'end'}"
    elif w and (w[0] is not None or w[1] is not None):
        out += (f"; analysis window {clock_s(w[0]) if w[0] is not None else 'start'} - "
                f"{clock_s(w[1]) if w[1] is not None else 'end'}")
    else:
        out += "; analysis window: the whole trace"
    return out


def _plan_table(plan: dict[str, Any]) -> Table:
    """One row per choice of the plan (:func:`~recsys_doctor.reports._common.plan_rows`)."""
    tab = Table(title=f"Proposed multi-stream plan ({plan.get('kind', '?')})", title_justify="left", expand=True)
    tab.add_column("choice", style="bold", no_wrap=True)
    tab.add_column("value", ratio=1)
    tab.add_column("because", ratio=3)
    for row in plan_rows(plan):
        tab.add_row(row["choice"], Text(row["value"]), Text(row["because"]))
        for a in row["assignments"][:8]:
            tab.add_row("", Text(a, style="dim"), "")
    return tab


def render_terminal(res: "AdviseResult", console: Console | None = None) -> None:
    """Print the report of one trace: fitted to a terminal; in a pipe or a file, text
    wraps but nothing is cut (see :func:`~recsys_doctor.reports.tables.wide_console`)."""
    from .tables import wide_console

    parts = _report_parts(res)
    console = wide_console(*parts, console=console, wrap=True)
    for part in parts:
        console.print(part)


def _report_parts(res: "AdviseResult") -> list[Any]:
    """The report's blocks in reading order."""
    info = res.trace_info
    meta = info.get("meta", {})
    head = Text.assemble(("recsys-doctor advise  ", "bold"), str(info.get("path", "")))
    sub = [info.get("format", "")]
    for k in ("nsys_version", "export_schema_version", "device_names"):
        if meta.get(k):
            sub.append(f"{k.replace('_', ' ')} {meta[k]}")
    out: list[Any] = [head]
    v = res.verdict or {}
    if v.get("line"):
        out.append(Text(v["line"], style=_SEV_STYLE.get(v.get("severity") or "", "bold") or "bold"))
        if v.get("plan") and shown_plan(res):
            out.append(Text(f"Plan: {v['plan']} (details below)", style="bold"))
    out.append(Text(" | ".join(str(x) for x in sub if x), style="dim"))
    out.append(Text(window_text(info), style="dim"))
    if fw := framework_text(info):
        out.append(Text(fw, style="dim"))
    if info.get("attribution"):
        out.append(Text(info["attribution"], style="dim"))
    out += [_summary_table(res), Text("")]
    if not res.findings:
        out.append(Text("No problems found.", style="green"))
    else:
        counts = {s: sum(1 for f in res.findings if f.severity == s) for s in ("high", "medium", "low", "note")}
        out.append(Text("Findings: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n), style="bold"))
        labels = report_kernel_labels(res.findings)
        out.append(Group(*[_finding_panel(f, labels) for f in res.findings]))
    plan = shown_plan(res)
    if plan:
        out.append(_plan_table(plan))
        out += [Text(f"  - {note}", style="dim") for note in plan.get("notes", []) or []]
    out.append(Text(""))
    return out
