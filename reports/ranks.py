"""Renderers of the combined multi-rank view (:class:`~recsys_doctor.ranks.MultiRankResult`):
a terminal table and Markdown. JSON is ``result.to_dict()``.

One row per rank, worst first; one column per finding id holding that rank's severity,
so a finding that only some ranks have stands out. Trace-derived strings (paths, finding
titles) are rich ``Text`` / escaped Markdown, never markup.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import BadInputError
from .._format import pct
from .markdown import md_escape
from .tables import wide_console

if TYPE_CHECKING:  # pragma: no cover
    from ..ranks import MultiRankResult

__all__ = ["render_ranks_terminal", "render_ranks_markdown", "write_ranks_markdown", "rank_rows"]

_SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "note": "dim"}
_SEV_ORDER = {"high": 0, "medium": 1, "low": 2, "note": 3}
_LETTER = {"high": "H", "medium": "M", "low": "L", "note": "N"}


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.1f}"


def _worst(findings: list[dict[str, Any]], fid: str) -> str | None:
    sev = [f["severity"] for f in findings if f["id"] == fid]
    return min(sev, key=lambda s: _SEV_ORDER.get(s, 9)) if sev else None


def render_ranks_terminal(res: "MultiRankResult", console: Console | None = None) -> None:
    """The combined view; in a pipe or a file as wide as the rank table needs (one
    column per finding), never cut at 80 columns."""
    t = res.totals
    head = Text(f"{t['ranks']} ranks ({res.engine}): GPU utilization min {pct(t['utilization_min'])}, "
                f"median {pct(t['utilization_median'])}, max {pct(t['utilization_max'])}", style="bold")
    has_comm = t.get("comm_ns", 0) > 0
    tab = Table(title="Ranks, worst first", show_lines=False)
    for c in ("rank", "GPU util", "compute ms", *(("comm ms", "comm hidden") if has_comm else ()), "kernels"):
        tab.add_column(c, justify="right", no_wrap=True)
    for fid in res.finding_ids:
        tab.add_column(fid, justify="center", overflow="fold", min_width=4)
    for r in res.ranks:
        row: list[Any] = [str(r.rank), pct(r.summary.get("gpu_utilization")), _ms(r.compute_ns)]
        if has_comm:
            row += [_ms(r.comm_ns), pct(r.overlap_share)]
        row.append(f"{r.summary.get('kernels', 0):,}")
        for fid in res.finding_ids:
            s = _worst(r.findings, fid)
            row.append(Text(_LETTER.get(s or "", "-"), style=_SEV_STYLE.get(s or "", "dim")))
        tab.add_row(*row)
    console = wide_console(tab, console=console)
    console.print(head)
    console.print(tab)
    console.print(Text("H high, M medium, L low, N note, - not found; `--json` or `--md` name each rank's trace file",
                       style="dim"))
    if res.stragglers:
        console.print(Text(f"Stragglers (compute time more than {res.straggler_share:.0%} above the median rank):",
                           style="bold yellow"))
        for s in res.stragglers:
            console.print(Text(f"  rank {s['rank']}: {_ms(s['compute_ns'])} ms of compute, "
                               f"{s['excess_share']:.0%} above the median {_ms(s['median_compute_ns'])} ms"))
    else:
        console.print(Text(f"No straggler: every rank's compute time is within {res.straggler_share:.0%} "
                           "of the median rank's.", style="dim"))
    if has_comm:
        console.print(Text(f"NCCL communication hidden under compute, all ranks: {pct(t.get('overlap_share'))}"))


def rank_rows(res: "MultiRankResult") -> dict[str, Any]:
    """The rank table of the Markdown and HTML reports: ``{"head", "rows"}``, a row per
    rank worst first with its number cells, its severity per finding id (None: not
    found) and its trace file's name."""
    has_comm = res.totals.get("comm_ns", 0) > 0
    head = ["rank", "GPU util", "compute ms", *(["comm ms", "comm hidden"] if has_comm else []), "kernels",
            *res.finding_ids, "trace"]
    rows = []
    for r in res.ranks:
        cells = [str(r.rank), pct(r.summary.get("gpu_utilization")), _ms(r.compute_ns)]
        if has_comm:
            cells += [_ms(r.comm_ns), pct(r.overlap_share)]
        cells.append(f"{r.summary.get('kernels', 0):,}")
        rows.append({"cells": cells, "severities": [_worst(r.findings, fid) for fid in res.finding_ids],
                     "trace": Path(r.path).name})
    return {"head": head, "rows": rows}


def render_ranks_markdown(res: "MultiRankResult") -> str:
    t = res.totals
    out = [f"# {t['ranks']} ranks", "",
           f"GPU utilization min {pct(t['utilization_min'])}, median {pct(t['utilization_median'])}, "
           f"max {pct(t['utilization_max'])} (analyzed with {md_escape(res.engine)}).", ""]
    table = rank_rows(res)
    out += ["| " + " | ".join(md_escape(h) for h in table["head"]) + " |", "|" + "---|" * len(table["head"])]
    for r in table["rows"]:
        row = [*r["cells"], *[s or "-" for s in r["severities"]], md_escape(r["trace"])]
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    if res.stragglers:
        out.append(f"## Stragglers (compute more than {res.straggler_share:.0%} above the median rank)")
        out.append("")
        out += [f"- rank {s['rank']}: {_ms(s['compute_ns'])} ms, {s['excess_share']:.0%} above the median "
                f"{_ms(s['median_compute_ns'])} ms" for s in res.stragglers]
    else:
        out.append("No straggler.")
    return "\n".join(out) + "\n"


def write_ranks_markdown(res: "MultiRankResult", path: str | os.PathLike[str]) -> None:
    """Write :func:`render_ranks_markdown` to ``path`` (``BadInputError`` when it cannot
    be written: a missing folder, ``/proc``, a directory)."""
    try:
        Path(path).write_text(render_ranks_markdown(res), encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"cannot write report {path}: {e}") from None
