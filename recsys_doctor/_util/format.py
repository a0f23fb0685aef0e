"""Numbers as people read them: the one set of formatters behind every report, the CLI
tables and the gate's messages (the JSON output keeps raw numbers).

* :func:`fmt`: any scalar, compact (counts with thousands separators, floats to 4
  significant digits, ``n/a`` for None/NaN);
* :func:`pct`: a share (0..1) as a percentage;
* :func:`fixed`: a measured number to a fixed number of decimals, with its unit;
* :func:`duration_ns`: nanoseconds in the unit that reads best (ns, us, ms, s);
* :func:`fmt_unit`: a value in a declared unit (``ns``, ``us``, ``ms``, ``share``,
  ``bytes``, ``number``);
* :func:`fmt_evidence`: a finding's evidence value, its unit declared by the analyzer
  (``EVIDENCE_UNITS`` in each ``analyzers/`` module; a nested value without a unit of its
  own takes its parent's);
* :func:`fmt_value`: a plan value, the unit taken from its key (the planner's own field
  names: ``*_ns``, ``*_us``, ``*_ms``, ``*share*``/``*fraction*``/``*utilization*``).
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["fmt", "pct", "fixed", "duration_ns", "fmt_value", "fmt_unit", "fmt_evidence", "shorten", "UNITS"]

#: the units an evidence value is declared in
UNITS = ("ns", "us", "ms", "share", "bytes", "number")

#: kernel names are often several hundred characters of template arguments; the terminal
#: shows the head (namespace and kernel name), the JSON and HTML reports keep them whole
NAME_WIDTH = 100


def fmt(v: Any) -> str:
    """A compact, human-readable rendering of a scalar (floats to 4 significant digits;
    a float that holds a whole number prints as that integer)."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        if v.is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
            return f"{v:.3g}"
        if abs(v) >= 1e4:  # (",.4g" would print 13115.09 as "1.312e+04")
            return f"{v:,.0f}"
        return f"{v:,.4g}"
    if hasattr(v, "item"):
        return fmt(v.item())
    if isinstance(v, (list, tuple)) and all(not isinstance(x, (dict, list)) for x in v):
        return ", ".join(fmt(x) for x in v)
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return str(v)


def pct(share: Any, digits: int = 1) -> str:
    """``0.4231`` -> ``42.3%`` (``n/a`` for None)."""
    return "n/a" if share is None else f"{float(share) * 100:.{digits}f}%"


def fixed(v: Any, unit: str = "", digits: int = 2) -> str:
    """``1234.5`` -> ``1,234.50`` plus ``unit``; ``-`` when there is no measurement."""
    if v is None:
        return "-"
    return f"{v:,.{digits}f}{unit}" if isinstance(v, float) else f"{v}{unit}"


def duration_ns(v: float) -> str:
    """``77630`` -> ``77.63 us``: seconds, ms, us or ns, whichever reads best."""
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3f} s"
    if a >= 1e6:
        return f"{v / 1e6:.3f} ms"
    if a >= 1e3:
        return f"{v / 1e3:.2f} us"
    return f"{v:.0f} ns"


def shorten(s: str, width: int = NAME_WIDTH) -> str:
    return s if len(s) <= width else s[: width - 3] + "..."


def _suffix_unit(key: str) -> str | None:
    """The unit a plan field's name ends in (``*_ns``, ``*_us``, ``*_ms``), else None."""
    k = key.lower()
    return next((u for u in ("ns", "us", "ms") if k.endswith("_" + u)), None)


def _is_share_key(key: str) -> bool:
    k = key.lower()
    return any(t in k for t in ("fraction", "share", "utilization", "ratio_of"))


def fmt_unit(unit: str | None, v: Any) -> str:
    """``v`` in ``unit`` (one of :data:`UNITS`, or None: a plain number): nanoseconds as the
    duration that reads best, us/ms floats with their unit, a share (0..1) as a percentage,
    counts with thousands separators."""
    if v is None:
        return "n/a"
    if isinstance(v, str):
        return shorten(v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return duration_ns(v) if unit == "ns" else f"{v:,}"
    if isinstance(v, float):
        if unit == "share" and -0.001 <= v <= 1.001:
            return pct(v)
        if unit == "us":
            return f"{v:,.2f} us"
        if unit == "ms":
            return f"{v:,.3f} ms"
        if unit == "ns":
            return duration_ns(v)
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def fmt_evidence(units: Any, key: str, v: Any, inherited: str | None = None) -> str:
    """A finding's evidence value ``v`` under ``key``, in the unit ``units`` (the
    finding's declared ``{key: unit}``) gives ``key``; a key without one takes
    ``inherited`` (its parent's): ``shared_idle_ns: {finding id: ns}`` is durations."""
    u = units.get(key, inherited)
    if isinstance(v, dict):
        return ", ".join(f"{k}={fmt_evidence(units, str(k), x, u)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt_evidence(units, key, x, inherited) for x in v[:5]) + (" ..." if len(v) > 5 else "")
    return fmt_unit(u, v)


def fmt_value(key: str, v: Any) -> str:
    """A human rendering of one plan value, its unit taken from its key: a float under a
    share key in 0..1 as %, else by the key's suffix (:func:`fmt_unit`)."""
    if isinstance(v, dict):
        # a key without a unit of its own (a finding id, a stream) takes the dict's:
        # ``shared_idle_ns: {"short-kernels": 1200000}`` is a duration, not a count
        return ", ".join(f"{k}={fmt_value(k if _suffix_unit(str(k)) or _is_share_key(str(k)) else key, x)}"
                         for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt_value(key, x) for x in v[:5]) + (" ..." if len(v) > 5 else "")
    if isinstance(v, float) and _is_share_key(key) and -0.001 <= v <= 1.001:
        return pct(v)
    return fmt_unit(_suffix_unit(key), v)
