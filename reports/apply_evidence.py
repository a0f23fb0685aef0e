"""The evidence part of ``profile --apply``'s report, one view for the terminal and the HTML
page: syncs per query and GPU busy before -> after in plain lines, what the script hook did, and
the lines of the script whose calls it handled (taken over, or left to PyTorch and why).

It reads the ``evidence`` object of ``apply.json`` (``recsys_doctor.applying.evidence``); every
string from the script (file names, reasons) stays plain text, never rich markup.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table
from rich.text import Text

from .._util.format import fmt, shorten

__all__ = ["evidence_view", "sites_table", "render_evidence", "KIND_WORDS", "MAX_SITES"]

#: what each kind of call site is, in words
KIND_WORDS = {"model": "model call", "h2d": "copy to GPU", "d2h": "read back"}
#: call sites shown (most calls first); the JSON keeps them all
MAX_SITES = 15
_PLURAL = {"query": "queries", "step": "steps"}


def _before_after(d: Mapping[str, Any], f: Any = fmt) -> str:
    b, a = d.get("before"), d.get("after")
    return f"{f(b)} before -> {f(a)} after" if a is not None else f"{f(b)} before, none after"


def _sync_line(ev: Mapping[str, Any]) -> str | None:
    per, syncs, units, unit = ev.get("syncs_per_unit") or {}, ev.get("syncs") or {}, ev.get("units") or {}, ev["unit"]
    if per.get("before") is None and per.get("after") is None:
        if syncs.get("before") is None:
            return None
        return (f"Synchronizing CUDA calls: {_before_after(syncs)} (the script reported no count of "
                f"{_PLURAL.get(unit, unit)} to divide by)")
    counts = "; ".join(f"{side}: {fmt(syncs.get(side))} in {fmt(units.get(side))} {_PLURAL.get(unit, unit)}"
                       for side in ("before", "after") if per.get(side) is not None)
    return f"Synchronizing CUDA calls per {unit}: {_before_after(per)} ({counts})"


def _hook_line(st: Mapping[str, Any] | None, run: str) -> str:
    if st is None:
        return f"Hook ({run}): the run wrote no stats (it ended through os._exit or a signal)"
    if st.get("not_applied"):
        return f"Hook ({run}): the plan was not applied: {st['not_applied']}"
    parts = [f"{fmt(st.get('threads', 0))} threads in {fmt(st.get('groups'))} stream groups"]
    if st.get("late_threads"):  # (threads the hook placed at their first model call: the main thread...)
        parts[0] += f", {fmt(st['late_threads'])} placed at their first model call (a group each)"
    if (st.get("processes") or 1) > 1:  # (worker processes of the program: their threads and calls added)
        parts[0] += f" (over {fmt(st['processes'])} processes)"
    if st.get("graphs"):
        parts.append(f"{fmt(st.get('captured', 0))} graphs captured, replayed {fmt(st.get('replays', 0))} times")
        if st.get("thread_graphs"):
            parts.append(f"{fmt(st['thread_graphs'])} graphs of a thread's copies and model, replayed "
                         f"{fmt(st.get('thread_replays', 0))} times")
    else:
        parts.append("no CUDA graphs in this plan")
    if st.get("batching"):
        parts.append(f"batching up to {fmt(st.get('max_batch'))}: {fmt(st.get('batched_calls', 0))} calls in "
                     f"{fmt(st.get('batches', 0))} batches ({_sizes(st.get('batch_sizes'))})")
        served = st.get("served_batch_sizes") or {}
        if st.get("served_calls"):  # (the hook's route to the runtime's batching: its batches are the runtime's)
            parts.append(f"{fmt(st['served_calls'])} calls served by the runtime's batching, in "
                         f"{fmt(sum(int(v) for v in served.values()))} batches ({_sizes(served)})")
    n = len(st.get("fallbacks") or [])
    first = f" ({shorten(str(st['fallbacks'][0]), 80)}{', ...' if n > 1 else ''})" if n else ""
    parts.append(f"{n} fallback{'s' if n != 1 else ''}{first}")
    return f"Hook ({run}): " + "; ".join(parts)


def _sizes(hist: Mapping[Any, Any] | None) -> str:
    """A batch-size histogram (size -> batches; sizes as JSON keys are strings) in words,
    largest size first: ``8 x 120, 4 x 3``."""
    items = sorted(((int(k), int(v)) for k, v in (hist or {}).items()), reverse=True)
    return ", ".join(f"{k} x {fmt(v)}" for k, v in items) if items else "none"


def _site_rows(st: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    rows = []
    for s in (st or {}).get("sites") or []:
        reasons = s.get("reasons") or {}
        top = max(reasons.items(), key=lambda kv: (kv[1], kv[0]))[0] if reasons else ""
        rows.append({"site": s.get("site", "?"), "kind": KIND_WORDS.get(s.get("kind"), str(s.get("kind"))),
                     "taken_over": int(s.get("taken_over", 0)), "fallback": int(s.get("fallback", 0)), "reason": top,
                     "batched": int(s.get("batched", 0)), "batch_sizes": _sizes(s.get("batch_sizes"))})
    return rows


def evidence_view(ev: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What both reports show of ``apply.json``'s ``evidence``: ``lines`` (plain sentences),
    ``sites`` (the call-site rows, at most :data:`MAX_SITES`), ``more`` (rows left out),
    ``sites_of`` (which run the rows are from), ``batching`` (whether any row's calls ran in
    batches: the table then shows them, ``batched`` and ``batch_sizes`` of each row); None
    when there is no evidence."""
    if not ev:
        return None
    lines = [x for x in (_sync_line(ev),) if x]
    busy = ev.get("gpu_busy_pct") or {}
    if busy.get("before") is not None:
        lines.append("GPU busy (kernels and graphs, first to last GPU operation of the trace): "
                     + _before_after(busy, lambda v: "n/a" if v is None else f"{v:.1f}%"))
    hook = ev.get("hook")
    view: dict[str, Any] = {"lines": lines, "sites": [], "more": 0, "sites_of": None}
    if hook is None:  # a workload: applied by the runtime, not the script hook
        return view
    run = "the kept plan's measured run" if hook.get("measured") is not None else "the after profile"
    st = hook.get("measured") if hook.get("measured") is not None else hook.get("profiled")
    lines.append(_hook_line(st, run))
    if hook.get("measured") is not None and hook.get("profiled") is not None:
        lines.append(_hook_line(hook["profiled"], "the after profile"))
    rows = _site_rows(st)
    if st is not None and st.get("active") and not rows:
        lines.append("The hook counted no model call, copy or read-back at any line of the script.")
    view.update(sites=rows[:MAX_SITES], more=max(0, len(rows) - MAX_SITES), sites_of=run,
                batching=any(r["batched"] for r in rows))
    return view


def sites_table(view: Mapping[str, Any]) -> Table:
    """The call-site rows of :func:`evidence_view` as a rich table."""
    t = Table(title=f"Script lines the hook handled ({view['sites_of']})", title_justify="left")
    batching = bool(view.get("batching"))
    cols = [("line", "left"), ("call", "left"), ("taken over", "right"), ("left to PyTorch", "right"),
            ("main reason left", "left")]
    if batching:  # where the plan batched: calls run in a batch, and the batches by size
        cols[4:4] = [("batched", "right"), ("batch sizes (size x batches)", "left")]
    for c, just in cols:
        t.add_column(c, justify=just)  # type: ignore[arg-type]
    for r in view["sites"]:
        extra = [fmt(r.get("batched", 0)), r.get("batch_sizes", "")] if batching else []
        t.add_row(Text(r["site"]), r["kind"], fmt(r["taken_over"]), fmt(r["fallback"]), *extra, Text(r["reason"]))
    if view["more"]:
        t.caption = f"and {view['more']} more lines (all of them in apply.json, evidence.hook)"
    return t


def render_evidence(ev: Mapping[str, Any] | None, console: Any) -> None:
    """The evidence lines, then the call-site table (terminal)."""
    view = evidence_view(ev)
    if view is None:
        return
    for line in view["lines"]:
        console.print(Text(line))
    if view["sites"]:
        console.print(sites_table(view))
