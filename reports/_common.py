"""Shared pieces of the HTML and Markdown renderers: headline wording, number formats."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..advise import AdviseResult

__all__ = ["SEV_ORDER", "fmt", "pct", "headline", "by_severity", "summary_rows", "trace_name"]

SEV_ORDER = ("high", "medium", "low", "note")


def fmt(v: Any) -> str:
    """A compact, human-readable rendering of a scalar (floats to 4 significant digits)."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:,.4g}"
    if hasattr(v, "item"):
        return fmt(v.item())
    if isinstance(v, (list, tuple)) and all(not isinstance(x, (dict, list)) for x in v):
        return ", ".join(fmt(x) for x in v)
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return str(v)


def pct(v: Any) -> str:
    return "n/a" if v is None else f"{float(v) * 100:.1f}%"


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
    u = (result.summary or {}).get("gpu_utilization")
    if u is None:
        big = "No GPU activity in this trace"
    elif u < 0.5:
        big = f"GPU busy {u * 100:.0f}% of the time: idle {100 - u * 100:.0f}%"
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


def summary_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the summary's contract keys, then any other scalar key."""
    rows: list[tuple[str, str]] = []
    seen = set()
    for key, label, f in _SUMMARY_LABELS:
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
