"""Kineto ``ts``/``dur`` (µs, as JSON numbers) -> integer ns, exactly.

The decoders hand float literals over as their text (``float_hook=str``), integers as
ints. A column of integers (most traces: integer µs on the Unix epoch) is scaled in one
numpy step. Otherwise the numbers are read as float64 first: where that is exact at the
ns (every value below 2**40 µs, ~12.7 days, with at most 3 decimals: relative time) the
float gives the ns; the others (float µs on the Unix epoch, where float64 resolves only
~0.25 µs, or more than 3 decimals) are read from their own decimal digits, rounded half
to even at the ns. A value that is not finite or does not fit int64 ns (``Infinity``,
``1e29``, ``ts`` 1e19) is bad input: :class:`BadTime`, never a wrapped number.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np

__all__ = ["MISSING", "BadTime", "ns_of", "text_ns"]

#: ns of a missing (or non-numeric) ts/dur
MISSING = np.iinfo(np.int64).min
#: the largest |µs| whose ns fit int64
_LIMIT_US = (2**63 - 1) // 1000
#: below this (µs) a float64 with at most 3 decimals times 1000 rounds to the exact ns
_FLOAT_EXACT_BELOW = 2.0**40


class BadTime(ValueError):
    """A ts/dur that is no time in µs an int64 of ns holds (the event's index in its batch)."""

    def __init__(self, index: int, field: str, value: Any) -> None:
        super().__init__(f"{field} {value!s} is not a time in µs that int64 ns can hold")
        self.index, self.field, self.value = index, field, value


def ns_of(get: Callable[[Any], Any], items: Sequence[Any], field: str) -> np.ndarray:
    """``get(item)`` (µs) of every item as int64 ns; :data:`MISSING` where absent or not a
    number; raises :class:`BadTime` where out of range."""
    vals = list(map(get, items))
    try:  # integers only (the usual case): one C pass
        us = np.fromiter(vals, np.int64, count=len(vals))
    except (TypeError, ValueError, OverflowError):
        return _general(vals, field)
    out_of_range = (us > _LIMIT_US) | (us < -_LIMIT_US)
    if out_of_range.any():
        i = int(np.flatnonzero(out_of_range)[0])
        raise BadTime(i, field, vals[i])
    return us * 1000


def _general(vals: list[Any], field: str) -> np.ndarray:
    try:  # numbers and their text (None: NaN): one C pass
        x = np.array(vals, dtype=np.float64)
        if x.ndim != 1:
            raise ValueError
    except (TypeError, ValueError):  # something that is no number (text, a list...): missing
        x = np.array([_number(v) for v in vals], dtype=np.float64)
    nan = np.isnan(x)
    bad = ~nan & (~np.isfinite(x) | (np.abs(x) > _LIMIT_US))
    for i in np.flatnonzero(nan).tolist():  # a NaN literal is bad input, a missing value is not
        if isinstance(vals[i], float):
            bad[i] = True
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise BadTime(i, field, vals[i])
    ns = np.full(len(x), MISSING, np.int64)
    ok = ~nan
    scaled = np.where(ok, x, 0.0) * 1000.0
    exact = np.rint(scaled)
    ns[ok] = exact[ok].astype(np.int64)
    for i in np.flatnonzero(ok & ((np.abs(x) >= _FLOAT_EXACT_BELOW) | (scaled != exact))).tolist():
        v = vals[i]
        if isinstance(v, (int, str)):  # (bool is an int)
            ns[i] = text_ns(v) if isinstance(v, str) else int(v) * 1000
            if ns[i] == MISSING:
                raise BadTime(i, field, v)
    return ns


def _number(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and _NUMBER.fullmatch(v.strip()):
        return float(v)
    return float("nan")


_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")


def text_ns(v: str) -> int:
    """A decimal number's text (µs) -> ns, exactly, rounded half to even;
    :data:`MISSING` where it is not a finite number within int64 ns."""
    head, dot, frac = v.partition(".")
    body = head[1:] if head[:1] == "-" else head
    if body.isdigit() and frac.isdigit() and len(frac) <= 3 and body.isascii() and frac.isascii():
        ns = int(body) * 1000 + int(frac.ljust(3, "0"))
        ns = -ns if head[:1] == "-" else ns
    else:
        try:
            ns = int((Decimal(v) * 1000).to_integral_value(rounding="ROUND_HALF_EVEN"))
        except (InvalidOperation, ValueError, OverflowError):
            return MISSING
    return ns if -(2**63) < ns < 2**63 else MISSING
