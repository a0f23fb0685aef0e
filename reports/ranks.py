"""Renderers of the combined multi-rank view (:class:`~recsys_doctor.diagnose.ranks.MultiRankResult`):
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
from .._util.format import pct
from .markdown import md_escape
from .tables import wide_console

if TYPE_CHECKING:  # pragma: no cover
    from ..diagnose.ranks import MultiRankResult

__all__ = ["render_ranks_terminal", "render_ranks_markdown", "write_ranks_markdown", "rank_rows", "straggler_lines"]

_SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "note": "dim"}
_SEV_ORDER = {"high": 0, "medium": 1, "low": 2, "note": 3}
_LETTER = {"high": "H", "medium": "M", "low": "L", "note": "N"}


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.1f}"


def _worst(findings: list[dict[str, Any]], fid: str) -> str | None:
    sev = [f["severity"] for f in findings if f["id"] == fid]
    return min(sev, key=lambda s: _SEV_ORDER.get(s, 9)) if sev else None


_COMM_COLS = ("comm ms", "comm hidden", "comm exposed ms", "waited ms")


def _comm_cells(r: Any) -> list[str]:
    return [_ms(r.comm_ns), pct(r.overlap_share), _ms(r.exposed_ns), _ms(r.waits.get("waited_ns", 0))]


def straggler_lines(res: "MultiRankResult") -> list[str]:
    """The stragglers (the ranks the others wait for at the collectives), each with the
    others' wait in total and at its worst collectives; else one line."""
    c = res.collectives
    if not c.get("matched"):
        return ["No straggler: no collectives matched across the ranks."]
    how = (f"{c['matched']} collectives matched across ranks, aligned on their ends (a rank's extra time in a "
           "collective is its wait for the last rank to arrive)")
    if c.get("end_spread_ns"):
        how += f"; on the traces' own clocks their ends are at most {c['end_spread_ns']['max'] / 1e3:,.1f} us apart"
    out = []
    if res.stragglers:
        out.append(f"Stragglers (the other ranks wait for them; {how}):")
        for s in res.stragglers:
            worst = "; ".join(f"{x['collective']} {_ms(x['others_waited_ns'])} ms" for x in s["collectives"][:3])
            out.append(f"  rank {s['rank']}: arrives last at {s['collectives_arrived_last']} collectives; the others "
                       f"waited {_ms(s['others_waited_ns'])} ms in total ({_ms(s['mean_wait_per_rank_ns'])} ms each, "
                       f"{s['share_of_window']:.0%} of the median window): {worst}")
    else:
        out.append(f"No straggler: no rank makes the others wait {res.straggler_share:.0%} of the median window "
                   f"({how}).")
    if c.get("largest_skews"):
        out.append("  Largest arrival skews: " + "; ".join(
            f"{x['collective']} rank {x['late_rank']} late by {_ms(x['skew_ns'])} ms" for x in c["largest_skews"][:3]))
    if c.get("note"):
        out.append(f"  {c['note']}")
    return out


def render_ranks_terminal(res: "MultiRankResult", console: Console | None = None) -> None:
    """The combined view; in a pipe or a file as wide as the rank table needs (one
    column per finding), never cut at 80 columns."""
    t = res.totals
    head = Text(f"{t['ranks']} ranks ({res.engine}): GPU utilization min {pct(t['utilization_min'])}, "
                f"median {pct(t['utilization_median'])}, max {pct(t['utilization_max'])}", style="bold")
    has_comm = t.get("comm_ns", 0) > 0
    tab = Table(title="Ranks, worst first", show_lines=False)
    for c in ("rank", "GPU util", "compute ms", *(_COMM_COLS if has_comm else ()), "kernels"):
        tab.add_column(c, justify="right", no_wrap=True)
    for fid in res.finding_ids:
        tab.add_column(fid, justify="center", overflow="fold", min_width=4)
    for r in res.ranks:
        row: list[Any] = [str(r.rank), pct(r.summary.get("gpu_utilization")), _ms(r.compute_ns)]
        if has_comm:
            row += _comm_cells(r)
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
    for line in straggler_lines(res):
        console.print(Text(line, style="bold yellow" if line.startswith("Stragglers") else ""))
    if has_comm:
        console.print(Text(f"NCCL communication hidden under compute, all ranks: {pct(t.get('overlap_share'))}; "
                           f"exposed {_ms(t.get('exposed_ns', 0))} ms"))
    if res.warnings:
        console.print(Text("warning: " + "; ".join(res.warnings), style="yellow"))


def rank_rows(res: "MultiRankResult") -> dict[str, Any]:
    """The rank table of the Markdown and HTML reports: ``{"head", "rows"}``, a row per
    rank worst first with its number cells, its severity per finding id (None: not
    found) and its trace file's name."""
    has_comm = res.totals.get("comm_ns", 0) > 0
    head = ["rank", "GPU util", "compute ms", *(list(_COMM_COLS) if has_comm else []), "kernels",
            *res.finding_ids, "trace"]
    rows = []
    for r in res.ranks:
        cells = [str(r.rank), pct(r.summary.get("gpu_utilization")), _ms(r.compute_ns)]
        if has_comm:
            cells += _comm_cells(r)
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
    if res.warnings:
        out += ["warning: " + md_escape("; ".join(res.warnings)), ""]
    lines = straggler_lines(res)
    out += ([f"## {lines[0]}", ""] + [f"- {x.strip()}" for x in lines[1:]]) if res.stragglers else lines
    return "\n".join(out) + "\n"


def write_ranks_markdown(res: "MultiRankResult", path: str | os.PathLike[str]) -> None:
    """Write :func:`render_ranks_markdown` to ``path`` (``BadInputError`` when it cannot
    be written: a missing folder, ``/proc``, a directory)."""
    try:
        Path(path).write_text(render_ranks_markdown(res), encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"cannot write report {path}: {e}") from None
