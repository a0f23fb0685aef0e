"""Shared pieces of the HTML and Markdown renderers: headline wording, summary rows, kernel labels.

Numbers are formatted by :mod:`recsys_doctor._util.format`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._util.format import fmt, pct

if TYPE_CHECKING:  # pragma: no cover
    from ..diagnose.advise import AdviseResult

__all__ = ["SEV_ORDER", "headline", "by_severity", "summary_rows", "trace_name", "kernel_label", "kernel_labels",
           "report_kernel_labels", "evidence_label", "clock_s", "plan_rows", "shown_plan"]

SEV_ORDER = ("high", "medium", "low", "note")


#: namespace and lambda markers that carry no name (nsys spells them ``<unnamed>`` and
#: ``[lambda() (instance 1)]``, Kineto ``(anonymous namespace)`` and ``{lambda()#1}``)
_ANON = re.compile(r"\(anonymous namespace\)::|<unnamed>::")
#: wrappers that say how an elementwise op is applied, not which op it is
_GENERIC = re.compile(r"^(?:A|B)?(?:Unary|Binary|Ternary|Pointwise)\w*Functor$|^func_wrapper")
#: what tells two instantiations of one templated kernel apart, most specific first: the
#: op a functor is named after (``CUDAFunctor_add``, ``sigmoid_kernel_cuda``,
#: ``addcdiv_cuda_kernel``, ``launch_clamp_scalar``, ``std::multiplies``), then a named
#: functor (``MulFunctor``, ``sum_functor``), then an ``...Op`` (``ReduceOp``)
_DISTINGUISH = (re.compile(r"CUDAFunctor(?:OnSelf|OnOther)?_(\w+)"),
                re.compile(r"([A-Za-z]\w*?)_(?:kernel_cuda|cuda_kernel)\b"),
                re.compile(r"\blaunch_([A-Za-z]\w*?)(?:_kernel)?(?:_scalar)?\b"),
                re.compile(r"\bstd::(plus|minus|multiplies|divides|modulus|negate|logical_\w+|bit_\w+|equal_to|"
                           r"not_equal_to|greater\w*|less\w*|max|min)<"),
                re.compile(r"([A-Za-z_]\w*(?:Functor|functor))\b"),
                re.compile(r"([A-Za-z_]\w*Op)\b"))
_TYPES = re.compile(r"\b(float|double|half|Half|BFloat16|bfloat16|__half|__nv_bfloat16|bool|long|int|short|"
                    r"int64_t|int32_t|int8_t|uint8_t)\b")
#: template arguments that are not element types: ``(int)4``-style casts, pointer arrays
_NOT_TYPES = re.compile(r"\((?:unsigned )?\w+\)-?\w+|std::array<[^>]*>|char ?\*|true|false")
#: wrappers whose first template argument is the real kernel (``cutlass::Kernel2<
#: cutlass_80_simt_sgemm_64x64_8x5_nt_align1>``)
_WRAPPERS = ("Kernel", "Kernel2", "kernel", "device_kernel")


def _split_name(name: str) -> tuple[str, str]:
    """(qualified kernel name, its template arguments) of a demangled signature, without
    return type and parameter list."""
    s = _ANON.sub("", name.strip())
    depth = 0
    tok: list[str] = []
    toks: list[str] = []
    for ch in s:
        if ch in "<([":
            if ch == "(" and depth == 0:
                break
            depth += 1
        elif ch in ">)]":
            depth = max(0, depth - 1)
        if ch == " " and depth == 0:
            toks.append("".join(tok))
            tok = []
            continue
        tok.append(ch)
    toks.append("".join(tok))
    full = next((t for t in reversed(toks) if t), s)
    lt = full.find("<")
    return (full, "") if lt < 0 else (full[:lt], full[lt:])


def kernel_label(name: Any, width: int = 70) -> str:
    """The distinguishing part of a kernel name: its own name plus the op it is
    instantiated with, without the return type, namespaces, template prefix and argument
    list (``void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<
    float, float, float, at::native::MulFunctor<float>>, ...>(int, ...)`` ->
    ``vectorized_elementwise_kernel<MulFunctor>``; ``void at::native::<unnamed>::
    EmbeddingBag_updateOutputKernel_sum_mean<float, long>(...)`` ->
    ``EmbeddingBag_updateOutputKernel_sum_mean``). Names without templates are kept,
    shortened to ``width``. Two names can share a label: :func:`kernel_labels` makes
    the labels of a report unique."""
    if not isinstance(name, str) or not name:
        return str(name)
    base, templ = _split_name(name)
    parts = [p for p in base.split("::") if p]
    base = "::".join(parts[-2:]) if len(parts) > 1 and parts[-1] in ("kernel", "Kernel", "main", "run") else (
        parts[-1] if parts else base)
    inner = re.match(r"<\s*(?:\w+::)*([A-Za-z_]\w*)\s*[,>]", templ)
    if base in _WRAPPERS and inner:
        base, templ = inner.group(1), ""
    fun: list[str] = []
    for rx in _DISTINGUISH:
        fun = [m for m in rx.findall(templ) if m != base and not _GENERIC.search(m)]
        if fun:
            break
    out = f"{base}<{fun[-1]}>" if fun else base
    if len(out) > width:
        out = out[: width - 3] + "..."
    return out


def kernel_labels(names: Any, width: int = 70) -> dict[str, str]:
    """:func:`kernel_label` of each distinct name, made unique among ``names``: names
    that share a label get their element types (``[float, long]``) where those differ,
    else a number in order of appearance (``#2``)."""
    uniq = list(dict.fromkeys(n for n in names if isinstance(n, str) and n))
    out = {n: kernel_label(n, width) for n in uniq}
    by_label: dict[str, list[str]] = {}
    for n in uniq:
        by_label.setdefault(out[n], []).append(n)
    for label, group in by_label.items():
        if len(group) < 2:
            continue
        typed = {n: f"{label}[{', '.join(dict.fromkeys(_TYPES.findall(_NOT_TYPES.sub('', _split_name(n)[1]))))}]"
                 for n in group}
        if len(set(typed.values())) == len(group):
            out.update(typed)
        else:
            out.update({n: label if i == 0 else f"{label}#{i + 1}" for i, n in enumerate(group)})
    return out


def report_kernel_labels(findings: Any) -> dict[str, str]:
    """:func:`kernel_labels` over every kernel name the findings' evidence rows show
    (``name``/``kernel`` keys of evidence lists), so that one report never shows two
    kernels under one label."""
    names = [row.get(k) for f in findings for v in (getattr(f, "evidence", None) or {}).values()
             if isinstance(v, list) for row in v if isinstance(row, Mapping) for k in ("name", "kernel")]
    return kernel_labels(names)


_UNIT_SUFFIX = ("_ns", "_us", "_ms")


def evidence_label(key: str) -> str:
    """The key as shown next to a value already rendered with its unit:
    ``window_ns`` -> ``window`` (``649.858 ms``, not ``window_ns=649.858 ms``)."""
    from ..options import Options

    base = key
    for suf in _UNIT_SUFFIX:
        if key.endswith(suf) and len(key) > len(suf):
            base = key[: -len(suf)]
            break
    if key in Options.__dataclass_fields__ and base != key:
        return f"{base} threshold"  # an option echoed in the evidence, not a measurement
    return base


def clock_s(ns: Any) -> str:
    """A moment on the trace's own clock, in seconds (the clock of --start/--end)."""
    return "n/a" if ns is None else f"{int(ns) / 1e9:.6f} s"


def trace_name(result: "AdviseResult") -> str:
    p = (result.trace_info or {}).get("path")
    return Path(str(p)).name if p else "trace"


def by_severity(result: "AdviseResult") -> list[tuple[str, list[Any]]]:
    groups: dict[str, list[Any]] = {}
    for f in result.findings:
        groups.setdefault(f.severity if f.severity in SEV_ORDER else "note", []).append(f)
    return [(s, groups[s]) for s in SEV_ORDER if s in groups]


def headline(result: "AdviseResult") -> tuple[str, str]:
    """(big line, why line): "GPU busy 6% of the time" / the worst findings' titles."""
    v = getattr(result, "verdict", None) or {}
    u = (result.summary or {}).get("gpu_utilization")
    if v.get("line"):
        big = v["line"]
    elif u is None:
        big = "No GPU activity in this trace"
    else:
        big = f"GPU busy {u * 100:.0f}% of the time"
    top = [f.title for f in result.findings if f.severity == "high"][:3] or [f.title for f in result.findings][:2]
    why = "; ".join(top) if top else "no findings"
    return big, why


_SUMMARY_LABELS = (
    ("gpu_utilization", "GPU utilization", pct),
    ("kernels", "kernels", fmt),
    ("short_kernel_fraction", "kernels shorter than 10 us", pct),
    ("median_kernel_us", "median kernel (us)", fmt),
    ("launch_threads_per_stream_max", "most CPU threads launching into one stream", fmt),
    ("memcpy.h2d", "host-to-device copies", fmt),
    ("memcpy.d2h", "device-to-host copies", fmt),
    ("memcpy.direction_switches", "H2D/D2H direction switches", fmt),
    ("sync_calls", "synchronizing API calls", fmt),
    ("graph_launches", "CUDA graph launches", fmt),
)


def summary_rows(summary: Mapping[str, Any], analyses: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """(label, value) rows of the summary's contract keys, then any other scalar key. With
    ``analyses``, the short-kernel row uses the threshold the analysis ran with (the
    summary's own field is fixed at 10 us by the JSON contract)."""
    rows: list[tuple[str, str]] = []
    seen = set()
    sk = (analyses or {}).get("short-kernels") or {}
    for key, label, f in _SUMMARY_LABELS:
        if key == "short_kernel_fraction" and sk.get("threshold_us") is not None and sk.get("count_share") is not None:
            rows.append((f"kernels shorter than {sk['threshold_us']:g} us", pct(sk["count_share"])))
            seen.add(key)
            continue
        cur: Any = summary
        for part in key.split("."):
            cur = cur.get(part) if isinstance(cur, Mapping) else None
        seen.add(key.split(".")[0])
        if cur is not None or key in ("gpu_utilization",):
            rows.append((label, f(cur)))
    for k, v in summary.items():
        if k not in seen and not isinstance(v, (dict, list)):
            rows.append((k, fmt(v)))
    return rows


def _plan_value(val: Mapping[str, Any]) -> str:
    from .._util.format import fmt_value

    if "count" in val:
        out = str(val["count"])
    elif "enabled" in val:
        out = "yes" if val["enabled"] else "no"
    else:
        out = ""
    extra = [f"{k.replace('_', ' ')} {fmt_value(k, v)}" for k, v in val.items()
             if k not in ("count", "enabled", "because", "reason", "assignments", "family")
             and not isinstance(v, (dict, list)) and v is not None]
    return out + (f" ({', '.join(extra)})" if extra else "")


def plan_rows(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The plan's decisions, as every report shows them: ``{"choice", "value",
    "because", "assignments"}`` per choice of the plan JSON (``recsys_doctor/planning/planner.py``):
    the choice, its value (a count, yes/no and its numbers), the findings it answers and
    why, and the range assignments as ``key=value`` lines."""
    rows = []
    for key, val in plan.items():
        if not isinstance(val, Mapping) or "reason" not in val:
            continue
        because = ", ".join(str(b) for b in val.get("because") or [])
        reason = str(val.get("reason") or "")
        rows.append({"choice": key.replace("_", " "), "value": _plan_value(val),
                     "because": f"{because}: {reason}" if because else reason,
                     "assignments": [", ".join(f"{k}={v}" for k, v in a.items())
                                     for a in val.get("assignments") or [] if isinstance(a, Mapping)]})
    return rows


def shown_plan(result: "AdviseResult") -> dict[str, Any]:
    """The plan the reports show: none for a trace without GPU work (no kernel, no graph
    execution: ``gpu_utilization`` is None), where a plan would have nothing to change.
    The JSON keeps the planner's document as it is."""
    if (result.summary or {}).get("gpu_utilization") is None:
        return {}
    return dict(result.plan or {})


def framework_text(info: dict[str, Any]) -> str:
    """``framework PyTorch (2,739 of 2,904 kernel executions are PyTorch's)``: what made the trace and why it
    is taken for it (the words of the fixes follow it); empty where the JSON has none."""
    fw = info.get("framework") or {}
    return f"framework {fw['label']} ({fw['because']})" if fw.get("label") else ""
