"""One self-contained HTML report: inline CSS, plots as base64 ``data:`` URIs, no script.

The file opens offline, can be attached to a CI run or mailed, and needs no JavaScript.

Safety: kernel names are full of ``<``, ``>`` and ``&`` and NVTX text is arbitrary, so
**every** value that is not a literal of this module goes through :func:`_e`
(``html.escape`` with quotes): findings, evidence, ``where`` entries, the plan, file
names, history rows. A trace cannot inject markup or script into the report.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInputError
from ._common import by_severity, clock_s, fmt, headline, kernel_label, pct, summary_rows, trace_name
from . import plots

if TYPE_CHECKING:  # pragma: no cover
    from ..advise import AdviseResult

__all__ = ["render_html", "write_html", "render_compare_html", "write_compare_html"]

_CSS = """
*{box-sizing:border-box}
body{font-family:-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif;margin:0;background:#f4f5f7;color:#1f2328;line-height:1.45}
main{max-width:1240px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:18px;margin:28px 0 10px;border-bottom:2px solid #d0d7de;padding-bottom:4px}
h3{font-size:15px;margin:0 0 6px}
.sub{color:#57606a;font-size:13px;word-break:break-all}
.hero{border-radius:10px;padding:18px 22px;margin:16px 0;color:#fff;background:#2e9e5b}
.hero.bad{background:#c9302c}.hero.warn{background:#d9822b}
.hero .big{font-size:22px;font-weight:700;line-height:1.3}
.hero .why{font-size:15px;margin-top:6px}
.card{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:14px 16px;margin:10px 0}
.sev{display:inline-block;border-radius:4px;padding:1px 8px;font-size:12px;font-weight:700;color:#fff;margin-right:8px;text-transform:uppercase}
.sev-high{background:#c9302c}.sev-medium{background:#d9822b}.sev-low{background:#3c7dd9}.sev-note{background:#6e7781}
.card.high{border-left:6px solid #c9302c}.card.medium{border-left:6px solid #d9822b}.card.low{border-left:6px solid #3c7dd9}.card.note{border-left:6px solid #6e7781}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.kv td:first-child{color:#57606a}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px;word-break:break-all}
img{max-width:100%;height:auto;display:block;background:#fff;border:1px solid #d0d7de;border-radius:6px}
figure{margin:12px 0}
figcaption{font-size:13px;color:#57606a;margin-top:4px}
details summary{cursor:pointer;color:#0969da;font-size:13px}
.rec{background:#f6f8fa;border-radius:6px;padding:8px 10px;margin:8px 0;font-size:14px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:10px}
.metric{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:10px}
.metric .v{font-size:22px;font-weight:700}.metric .l{font-size:12px;color:#57606a}
footer{color:#57606a;font-size:12px;margin:30px 0 10px}
"""


def _e(v: Any) -> str:
    """Escape anything for HTML text and attribute context."""
    return html.escape(str(v), quote=True)


def _img(png: bytes, alt: str) -> str:
    b64 = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{b64}" alt="{_e(alt)}">'


def _value(v: Any, depth: int = 0) -> str:
    """Render a JSON-like value (evidence, plan) as escaped HTML: dicts as key/value
    tables, lists of dicts as tables, scalars formatted."""
    if isinstance(v, Mapping):
        if not v:
            return "<em>none</em>"
        if depth > 3:
            return f"<code>{_e(fmt(dict(v)))}</code>"
        rows = "".join(f"<tr><td>{_e(k)}</td><td>{_value(x, depth + 1)}</td></tr>" for k, x in v.items())
        return f'<table class="kv">{rows}</table>'
    if isinstance(v, (list, tuple)):
        if not v:
            return "<em>none</em>"
        if all(isinstance(x, Mapping) for x in v) and depth <= 3:
            keys = list(dict.fromkeys(k for x in v for k in x))
            head = "".join(f"<th>{_e(k)}</th>" for k in keys)
            body = "".join("<tr>" + "".join(f"<td>{_cell(x.get(k), depth)}</td>" for k in keys) + "</tr>"
                           for x in v[:50])
            more = f"<tr><td colspan='{len(keys)}'>... {len(v) - 50} more</td></tr>" if len(v) > 50 else ""
            return f"<table><tr>{head}</tr>{body}{more}</table>"
        if all(not isinstance(x, (Mapping, list, tuple)) for x in v):
            return _e(fmt(list(v)))
        return "<ul>" + "".join(f"<li>{_value(x, depth + 1)}</li>" for x in v) + "</ul>"
    return _e(fmt(v))


def _cell(v: Any, depth: int) -> str:
    if isinstance(v, float) and 0 <= v <= 1:
        return _e(fmt(v))
    return _value(v, depth + 1)


def _where(where: Sequence[Mapping[str, Any]]) -> str:
    if not where:
        return ""
    items = []
    for w in where:
        share = w.get("share")
        parts = [f"<b>{_e(k)}</b> <span class='mono'>{_e(fmt(v))}</span>" for k, v in w.items() if k != "share"]
        s = f" <span class='sub'>({_e(pct(share))} of it)</span>" if share is not None else ""
        items.append(f"<li>{'; '.join(parts)}{s}</li>")
    return f"<div><b>Where</b><ul>{''.join(items)}</ul></div>"


def _finding(f: Any) -> str:
    sev = f.severity if f.severity in ("high", "medium", "low", "note") else "note"
    ev = f.evidence or {}
    scalars = {k: v for k, v in ev.items() if not isinstance(v, (Mapping, list, tuple))}
    nested = {k: v for k, v in ev.items() if isinstance(v, (Mapping, list, tuple))}
    ev_html = _value(scalars) if scalars else ""
    for key in ("offenders",):
        if isinstance(ev.get(key), list) and ev[key] and isinstance(ev[key][0], Mapping):
            items = "".join(f"<li><span class='mono' title='{_e(o.get('name'))}'>{_e(kernel_label(o.get('name')))}</span>"
                            f" <span class='sub'>{_e(', '.join(f'{k}={fmt(v)}' for k, v in o.items() if k != 'name'))}"
                            "</span></li>" for o in ev[key][:5])
            ev_html = f"<div><b>Worst kernels</b><ul>{items}</ul></div>" + ev_html
    if nested:
        ev_html += f"<details><summary>more evidence</summary>{_value(nested)}</details>"
    return (f'<div class="card {sev}"><h3><span class="sev sev-{sev}">{_e(sev)}</span>{_e(f.title)}'
            f' <span class="sub mono">{_e(f.id)}</span></h3>'
            f'{_gain(f)}'
            f'<div class="rec"><b>What to do:</b> {_e(f.recommendation)}</div>'
            f'{_where(f.where or [])}{_examples(getattr(f, "examples", None) or [])}'
            f'<details open><summary>evidence</summary>{ev_html}</details></div>')


def _gain(f: Any) -> str:
    rec = getattr(f, "recoverable_ns", None)
    if rec is None:
        return ""
    return (f"<div><b>To win:</b> up to {_e(f'{rec / 1e6:.3f}')} ms of GPU time "
            f"({_e(pct(getattr(f, 'recoverable_share', None)))} of the steady state)</div>")


def _examples(ex: Sequence[Mapping[str, Any]]) -> str:
    if not ex:
        return ""
    items = "".join(
        f"<li><span class='mono'>at {_e(clock_s(e.get('start_ns')))} for {_e(fmt((e.get('duration_ns') or 0) / 1000))} us"
        f"</span>: {_e(e.get('what', ''))} <span class='sub'>{_e(', '.join(str(e[k]) for k in ('thread', 'stream') if e.get(k)))}"
        "</span></li>" for e in ex[:3])
    return f"<div><b>Look at</b> (trace clock; open in Nsight Systems or Perfetto)<ul>{items}</ul></div>"


def _trend(history_rows: Sequence[Mapping[str, Any]] | None) -> str:
    if not history_rows:
        return ""
    png = plots.plot_history_trend(history_rows)
    rows = sorted(history_rows, key=lambda r: str(r.get("when_utc")), reverse=True)[:10]
    body = "".join(
        f"<tr><td>{_e(r.get('when_utc'))}</td><td class='num'>{_e(pct(r.get('gpu_utilization')))}</td>"
        f"<td class='mono'>{_e((r.get('git_commit') or '')[:10])}</td><td>{_e(r.get('git_branch') or '')}</td>"
        f"<td>{_e(r.get('command') or '')}</td></tr>" for r in rows)
    table = ("<table><tr><th>when (UTC)</th><th>GPU utilization</th><th>commit</th><th>branch</th>"
             f"<th>command</th></tr>{body}</table>")
    fig = f"<figure>{_img(png, 'utilization trend')}</figure>" if png else ""
    return f"<h2>Utilization trend (run history)</h2>{fig}{table}"


def _plan(plan: Mapping[str, Any] | None) -> str:
    if not plan:
        return "<p>No plan: nothing to change.</p>"
    return f'<div class="card">{_value(plan)}</div>'


def render_html(result: "AdviseResult", history_rows: Sequence[Mapping[str, Any]] | None = None, *,
                options: Any = None) -> str:
    """The whole report as one HTML string (see the module docstring)."""
    s = result.summary or {}
    big, why = headline(result)
    v = result.verdict or {}
    sev = v.get("severity")
    cls = {"high": "bad", "medium": "warn"}.get(sev or "", "")
    if v.get("first_action"):
        why = f"{v.get('problem')}." + (f" Plan: {v['plan']}." if v.get("plan") else "")
    name = trace_name(result)
    info = result.trace_info or {}
    tiles = "".join(
        f'<div class="metric"><div class="v">{_e(v)}</div><div class="l">{_e(label)}</div></div>'
        for label, v in summary_rows(s, result.analyses)[:8])
    summary_tbl = "".join(f"<tr><td>{_e(k)}</td><td class='num'>{_e(v)}</td></tr>" for k, v in summary_rows(s, result.analyses))
    sections = []
    for sev, fs in by_severity(result):
        sections.append(f"<h3>{_e(sev.capitalize())} ({len(fs)})</h3>" + "".join(_finding(f) for f in fs))
    findings_html = "".join(sections) or "<p>No findings.</p>"
    figs = "".join(
        f"<figure>{_img(png, title)}<figcaption><b>{_e(title)}.</b> {_e(cap)}</figcaption></figure>"
        for _key, title, cap, png in plots.report_plots(result, options=options))
    counts = info.get("counts") or {}
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    from .. import __version__
    from .terminal import window_text

    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>recsys-doctor: {_e(name)}</title>
<style>{_CSS}</style></head>
<body><main>
<h1>recsys-doctor report: {_e(name)}</h1>
<div class="sub">{_e(info.get('path', ''))} &middot; {_e(info.get('format', ''))} &middot; {_e(window_text(info))}</div>
<div class="hero {cls}"><div class="big">{_e(big)}</div><div class="why"><b>Why:</b> {_e(why)}</div></div>
<div class="grid">{tiles}</div>
<h2>What the GPU did</h2>
{figs or '<p>No GPU activity to plot.</p>'}
<h2>Findings</h2>
{findings_html}
<h2>Plan</h2>
{_plan(result.plan)}
{_trend(history_rows)}
<h2>Summary</h2>
<table class="kv">{summary_tbl}</table>
<details><summary>trace contents</summary>{_value(counts)}</details>
<footer>recsys-doctor {_e(__version__)} &middot; generated {_e(when)} &middot; self-contained: no scripts, no network</footer>
</main></body></html>
"""


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
                        b_label: str = "after") -> str:
    """A before/after page: the comparison plot, metric deltas, findings that changed."""
    from ..gate import compare

    c = compare(a, b, a_name=a_label, b_name=b_label)
    png = plots.plot_before_after(a, b, a_label, b_label)
    rows = "".join(
        f"<tr><td>{_e(m['metric'])}</td><td class='num'>{_e(fmt(m['a']))}</td><td class='num'>{_e(fmt(m['b']))}</td>"
        f"<td class='num'>{_e(fmt(m['delta']))}</td></tr>" for m in c.metrics)

    def flist(fs: Sequence[Mapping[str, Any]]) -> str:
        return ("<ul>" + "".join(f"<li><span class='sev sev-{_e(f['severity'])}'>{_e(f['severity'])}</span>"
                                 f"{_e(f['title'])} <span class='mono'>{_e(f['id'])}</span></li>" for f in fs)
                + "</ul>") if fs else "<p>none</p>"

    changed = ("<ul>" + "".join(
        f"<li><span class='mono'>{_e(x['id'])}</span>: <span class='sev sev-{_e(x['a'])}'>{_e(x['a'])}</span> &rarr; "
        f"<span class='sev sev-{_e(x['b'])}'>{_e(x['b'])}</span> {_e(x['title'])}</li>" for x in c.changed)
        + "</ul>") if c.changed else "<p>none</p>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>recsys-doctor: {_e(a_label)} vs {_e(b_label)}</title>
<style>{_CSS}</style></head><body><main>
<h1>Before / after: {_e(a_label)} &rarr; {_e(b_label)}</h1>
<figure>{_img(png, 'before/after comparison')}</figure>
<h2>Metrics</h2><table><tr><th>metric</th><th>{_e(a_label)}</th><th>{_e(b_label)}</th><th>change</th></tr>{rows}</table>
<h2>Findings that appeared</h2>{flist(c.appeared)}
<h2>Findings that disappeared</h2>{flist(c.disappeared)}
<h2>Findings whose severity changed</h2>{changed}
</main></body></html>
"""


def write_compare_html(a: "AdviseResult", b: "AdviseResult", path: str | os.PathLike[str], *,
                       a_label: str = "before", b_label: str = "after") -> None:
    _write(render_compare_html(a, b, a_label=a_label, b_label=b_label), path)
