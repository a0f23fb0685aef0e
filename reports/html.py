"""One self-contained HTML report: inline CSS, plots as base64 ``data:`` URIs, no script.

The file opens offline, can be attached to a CI run or mailed, and needs no JavaScript.
The pages are Jinja2 templates shipped with the package (``reports/templates/``); this
module prepares what they show.

Safety: kernel names are full of ``<``, ``>`` and ``&`` and NVTX text is arbitrary, so
the templates run with **autoescape on**: every ``{{ value }}`` (findings, evidence,
``where`` entries, the plan, file names, history rows) is escaped unless it is markup
the templates themselves built. The escape is :func:`html.escape` with quotes (``&quot;``,
``&#x27;``, the entities these reports have always used). A trace cannot inject markup or
script into the report.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from markupsafe import Markup

from ..errors import BadInputError
from .._util.format import fixed, fmt, pct
from ._common import by_severity, clock_s, framework_text, headline, kernel_label, plan_rows, report_kernel_labels, shown_plan, summary_rows, trace_name
from . import plots

if TYPE_CHECKING:  # pragma: no cover
    from ..diagnose.advise import AdviseResult

__all__ = ["render_html", "write_html", "render_section", "render_ranks_html", "write_ranks_html",
           "render_compare_html", "write_compare_html"]


def _escaped(v: Any) -> Markup:
    """Autoescape's last step for every ``{{ }}``: markup the templates built passes as
    it is, anything else through :func:`html.escape` (quotes included)."""
    return v if isinstance(v, Markup) else Markup(html.escape(str(v), quote=True))


def _img(png: bytes, alt: str) -> Markup:
    b64 = base64.b64encode(png).decode("ascii")
    return Markup(f'<img src="data:image/png;base64,{b64}" alt="{html.escape(alt, quote=True)}">')


def _shape(v: Any, depth: int) -> str:
    """How ``_macros.html.j2``'s ``value`` draws ``v``: a key/value table, a table of
    records, a list, a JSON string (nested deeper than 3), or a formatted scalar."""
    if isinstance(v, Mapping):
        return "empty" if not v else ("json" if depth > 3 else "mapping")
    if isinstance(v, (list, tuple)):
        if not v:
            return "empty"
        if all(isinstance(x, Mapping) for x in v) and depth <= 3:
            return "records"
        return "scalar" if all(not isinstance(x, (Mapping, list, tuple)) for x in v) else "list"
    return "scalar"


def _evidence_parts(ev: Mapping[str, Any] | None) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """(worst kernels, scalar evidence, nested evidence) of one finding."""
    ev = ev or {}
    off = ev.get("offenders")
    offenders = off if isinstance(off, list) and off and isinstance(off[0], Mapping) else []
    nested = {k: v for k, v in ev.items() if isinstance(v, (Mapping, list, tuple))}
    return offenders, {k: v for k, v in ev.items() if k not in nested}, nested


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("recsys_doctor.reports", "templates"), autoescape=True,
                             finalize=_escaped, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(fmt=fmt, pct=pct, clock_s=clock_s, kernel_label=kernel_label, img=_img, shape=_shape,
                       evidence_parts=_evidence_parts, fixed=lambda v: fixed(v, digits=3), plan_rows=plan_rows,
                       record_keys=lambda v: list(dict.fromkeys(k for x in v for k in x)),
                       other_fields=lambda o, skip: ", ".join(f"{k}={fmt(x)}" for k, x in o.items() if k != skip),
                       example_place=lambda e: ", ".join(str(e[k]) for k in ("thread", "stream") if e.get(k)))
    return env


_ENV = _environment()


def _trace_context(result: "AdviseResult", history_rows: Sequence[Mapping[str, Any]] | None,
                   options: Any) -> dict[str, Any]:
    """What ``_trace.html.j2`` shows of one trace."""
    from .terminal import window_text

    big, why = headline(result)
    v = result.verdict or {}
    if v.get("first_action"):
        why = f"{v.get('problem')}." + (f" Plan: {v['plan']}." if v.get("plan") and shown_plan(result) else "")
    info = result.trace_info or {}
    history = sorted(history_rows or [], key=lambda r: str(r.get("when_utc")), reverse=True)[:10]
    return dict(name=trace_name(result), info=info, window=window_text(info), framework=framework_text(info), big=big, why=why,
                hero_class={"high": "bad", "medium": "warn"}.get(v.get("severity") or "", ""),
                summary=summary_rows(result.summary or {}, result.analyses), findings=by_severity(result),
                labels=report_kernel_labels(result.findings),
                plots=plots.report_plots(result, options=options), plan=shown_plan(result), history=history,
                trend_png=plots.plot_history_trend(history_rows) if history_rows else None)


def _stamp() -> dict[str, str]:
    from .._util import __version__

    return {"version": __version__, "generated": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def render_html(result: "AdviseResult", history_rows: Sequence[Mapping[str, Any]] | None = None, *,
                options: Any = None) -> str:
    """The whole report as one HTML string (see the module docstring)."""
    return _ENV.get_template("report.html.j2").render(t=_trace_context(result, history_rows, options), **_stamp())


def render_section(result: "AdviseResult", *, options: Any = None) -> str:
    """One trace's report body (plots, findings, plan, summary) without the page around
    it: a rank's section of :func:`render_ranks_html`. Made where the rank was analyzed
    (a worker keeps only this string, never the trace)."""
    tpl = _ENV.from_string('{% from "_trace.html.j2" import trace_body %}{{ trace_body(t, 3) }}')
    return tpl.render(t=_trace_context(result, None, options))


def render_ranks_html(res: Any, sections: Mapping[str, str]) -> str:
    """One page for a many-rank run: the combined table (worst rank first), the
    stragglers, then one section per rank (``sections``: the rank's trace path ->
    :func:`render_section`)."""
    from .ranks import rank_rows, straggler_lines

    return _ENV.get_template("ranks.html.j2").render(
        res=res, rows=rank_rows(res), straggler_lines=straggler_lines(res), sections={k: Markup(v) for k, v in sections.items()}, **_stamp())


def write_ranks_html(res: Any, sections: Mapping[str, str], path: str | os.PathLike[str]) -> None:
    _write(render_ranks_html(res, sections), path)


def _write(text: str, path: str | os.PathLike[str]) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"cannot write report {path}: {e}") from None


def write_html(result: "AdviseResult", path: str | os.PathLike[str],
               history_rows: Sequence[Mapping[str, Any]] | None = None, *, options: Any = None) -> None:
    """Write :func:`render_html` to ``path`` (``BadInputError`` if it cannot be written)."""
    _write(render_html(result, history_rows, options=options), path)


def render_compare_html(a: "AdviseResult", b: "AdviseResult", *, a_label: str = "before",
                        b_label: str = "after", measured: Mapping[str, Any] | None = None) -> str:
    """A before/after page: the comparison plot, metric deltas, findings that changed.

    ``measured`` (from ``apply``) adds the measured tables above the plot:
    ``{"chosen": label, "rows": [{metric, before, after, ratio}],
    "candidates": [{plan, predicted, measured, p99_ms, error}], "p99_budget_ms", "kind", "evidence"}``;
    serving candidates are also drawn as queries/s against p99 with their Pareto front, and the
    evidence (:func:`.apply_evidence.evidence_view`) is written out under it.
    """
    from ..gate import compare

    front = None
    if measured and measured.get("kind") != "train":
        front = plots.plot_plan_front(measured.get("candidates") or [], measured.get("p99_budget_ms"),
                                      measured.get("chosen"))
    from .apply_evidence import evidence_view

    return _ENV.get_template("compare.html.j2").render(
        a_label=a_label, b_label=b_label, measured=measured, c=compare(a, b, a_name=a_label, b_name=b_label),
        png=plots.plot_before_after(a, b, a_label, b_label), front=front,
        ev=evidence_view((measured or {}).get("evidence")))


def write_compare_html(a: "AdviseResult", b: "AdviseResult", path: str | os.PathLike[str], *,
                       a_label: str = "before", b_label: str = "after",
                       measured: Mapping[str, Any] | None = None) -> None:
    _write(render_compare_html(a, b, a_label=a_label, b_label=b_label, measured=measured), path)
