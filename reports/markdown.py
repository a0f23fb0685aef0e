"""A Markdown report with its plots as PNG files beside it (for PR comments, wikis, repos).

``write_markdown(result, "out/report.md")`` writes ``out/report.md`` and the images in
``out/report_files/*.png``, linked relatively.

Safety: every string from a trace goes through :func:`md_escape`: Markdown punctuation is
backslash-escaped so a name cannot open a link, an image, emphasis or break a table, then
HTML special characters become entities (Markdown renderers pass raw HTML through, so
``<script>`` in a kernel name would otherwise be live markup).
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInputError
from .._util.format import fmt, pct
from ._common import by_severity, clock_s, framework_text, headline, plan_rows, shown_plan, summary_rows, trace_name
from . import plots

if TYPE_CHECKING:  # pragma: no cover
    from ..diagnose.advise import AdviseResult

__all__ = ["md_escape", "render_markdown", "write_markdown"]

# Punctuation with a Markdown meaning inline (our strings never start a line, so '.', '-', '+'
# are harmless); '&' '<' '>' '"' "'" become HTML entities.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#!|~])")


def md_escape(v: Any) -> str:
    """Escape a value for Markdown text or a table cell: backslashes before Markdown
    punctuation, then HTML entities; newlines become spaces."""
    s = _MD_SPECIAL.sub(r"\\\1", str(v))
    s = html.escape(s, quote=True)  # after: its entities contain '#', which must stay bare
    return s.replace("\r", " ").replace("\n", " ")


def _kv_lines(d: Mapping[str, Any], indent: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.append(f"{indent}- **{md_escape(k)}**:")
            out.extend(_kv_lines(v, indent + "  "))
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, Mapping) for x in v):
            out.append(f"{indent}- **{md_escape(k)}**:")
            for x in v[:20]:
                out.append(f"{indent}  - " + "; ".join(f"{md_escape(a)}: {md_escape(fmt(b))}" for a, b in x.items()))
        else:
            out.append(f"{indent}- **{md_escape(k)}**: {md_escape(fmt(v))}")
    return out


def render_markdown(result: "AdviseResult", image_links: Sequence[tuple[str, str, str]] = ()) -> str:
    """The report as Markdown; ``image_links`` are ``(title, caption, relative path)``."""
    s = result.summary or {}
    big, why = headline(result)
    from .terminal import window_text

    fw = framework_text(result.trace_info or {})
    lines = [f"# recsys-doctor report: {md_escape(trace_name(result))}", "",
             f"**{md_escape(big)}**", "", f"**Why:** {md_escape(why)}", "",
             md_escape(window_text(result.trace_info or {})), "",
             *([md_escape(fw), ""] if fw else []),
             "| metric | value |", "|---|---:|"]
    lines += [f"| {md_escape(k)} | {md_escape(v)} |" for k, v in summary_rows(s, result.analyses)]
    lines.append("")
    for title, cap, rel in image_links:
        lines += [f"## {md_escape(title)}", "", f"![{md_escape(title)}]({rel})", "", f"*{md_escape(cap)}*", ""]
    lines += ["## Findings", ""]
    groups = by_severity(result)
    if not groups:
        lines += ["No findings.", ""]
    for sev, fs in groups:
        lines += [f"### {md_escape(sev.capitalize())} ({len(fs)})", ""]
        for f in fs:
            lines += [f"#### {md_escape(f.title)}", "", f"`{f.id.replace('`', '')}` · severity **{md_escape(sev)}**", "",
                      f"**What to do:** {md_escape(f.recommendation)}", ""]
            if getattr(f, "recoverable_ns", None) is not None:
                lines += [f"**To win:** up to {f.recoverable_ns / 1e6:.3f} ms of GPU time "
                          f"({md_escape(pct(f.recoverable_share))} of the steady state)", ""]
            if getattr(f, "examples", None):
                lines.append("**Look at** (trace clock):")
                for e in f.examples[:3]:
                    who = ", ".join(str(e[k]) for k in ("thread", "stream") if e.get(k))
                    lines.append(f"- at {clock_s(e.get('start_ns'))} for {(e.get('duration_ns') or 0) / 1000:.2f} us: "
                                 f"{md_escape(e.get('what', ''))}" + (f" ({md_escape(who)})" if who else ""))
                lines.append("")
            if f.where:
                lines.append("**Where:**")
                for w in f.where:
                    parts = "; ".join(f"{md_escape(k)}: {md_escape(fmt(v))}" for k, v in w.items() if k != "share")
                    share = f" ({md_escape(pct(w['share']))} of it)" if w.get("share") is not None else ""
                    lines.append(f"- {parts}{share}")
                lines.append("")
            if f.evidence:
                lines.append("**Evidence:**")
                lines += _kv_lines(f.evidence)
                lines.append("")
    lines += ["## Plan", ""] + _plan_lines(shown_plan(result))
    lines.append("")
    return "\n".join(lines)


def _plan_lines(plan: Mapping[str, Any]) -> list[str]:
    """The plan's decisions and their reasons, as the terminal and HTML show them."""
    if not plan:
        return ["No plan: nothing to change."]
    out = [f"Proposed multi-stream plan ({md_escape(plan.get('kind', '?'))}):", "",
           "| choice | value | because |", "|---|---|---|"]
    for r in plan_rows(plan):
        out.append(f"| {md_escape(r['choice'])} | {md_escape(r['value'])} | {md_escape(r['because'])} |")
        out += [f"|  | {md_escape(a)} |  |" for a in r["assignments"][:20]]
    notes = plan.get("notes") or []
    out += [""] + [f"- {md_escape(n)}" for n in notes] if notes else []
    return out


def write_markdown(result: "AdviseResult", path: str | os.PathLike[str], *, options: Any = None) -> list[Path]:
    """Write the Markdown report to ``path`` and its PNGs to ``<stem>_files/`` beside it.
    Returns every file written (the ``.md`` first)."""
    p = Path(path)
    img_dir = p.parent / f"{p.stem}_files"
    written: list[Path] = []
    links = []
    try:
        specs = plots.report_plots(result, options=options)
        if specs:
            img_dir.mkdir(parents=True, exist_ok=True)
        for key, title, cap, png in specs:
            f = img_dir / f"{key}.png"
            f.write_bytes(png)
            written.append(f)
            links.append((title, cap, f"{img_dir.name}/{f.name}"))
        p.write_text(render_markdown(result, links), encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"cannot write report {p}: {e}") from None
    return [p, *written]
