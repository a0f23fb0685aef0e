"""Kineto ``ts``/``dur`` (µs, as JSON numbers) -> integer ns, exactly.

Integers (most traces: integer µs on the Unix epoch) are scaled in one numpy step. Floats
decoded as float64 give the exact ns where every value lies below 2**40 µs (~12.7 days:
relative time) with at most 3 decimals, the usual case. A float of 2**40 µs or more (µs
on the epoch, where float64 resolves only ~0.25 µs, or days of uptime) or with more
decimals raises :class:`NeedExact`: the loader decodes the trace again with its float
literals as their text (``float_hook=str``; it looks at the start of the file first to
spare that), and texts are read from their own decimal digits by numpy string ufuncs,
rounded half to even at the ns where they have more than 3 decimals. A value that is not
finite or does not fit int64 ns (``Infinity``, ``1e29``, ``ts`` 1e19) is bad input:
:class:`BadTime`, never a wrapped number; a value that is no number (text, a list) is
missing, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np

__all__ = ["MISSING", "BadTime", "NeedExact", "ns_of", "text_ns"]

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


class NeedExact(Exception):
    """A float ts/dur decoded as a float64 where that loses ns: decode the trace again
    with the float literals as text (:func:`~._kineto_decode.exact_floats`)."""


def ns_of(get: Callable[[Any], Any], items: Sequence[Any], field: str) -> np.ndarray:
    """``get(item)`` (µs) of every item as int64 ns; :data:`MISSING` where absent or not a
    number; raises :class:`BadTime` where out of range, :class:`NeedExact` for a float
    (not its text) whose ns float64 cannot give."""
    vals = list(map(get, items))
    types = set(map(type, vals))
    if types <= {int, bool}:  # integer µs (most traces: on the epoch): exact in int64
        us = np.fromiter(vals, np.int64, count=len(vals)) if vals else np.zeros(0, np.int64)
        out_of_range = (us > _LIMIT_US) | (us < -_LIMIT_US)
        if out_of_range.any():
            i = int(np.flatnonzero(out_of_range)[0])
            raise BadTime(i, field, vals[i])
        return us * 1000
    if types == {str}:  # float literals as their text (exact mode)
        return _texts(vals, field)
    if types == {float}:
        x = np.fromiter(vals, np.float64, count=len(vals))
        if np.isfinite(x).all() and (np.abs(x) < _FLOAT_EXACT_BELOW).all():
            scaled = x * 1000.0
            exact = np.rint(scaled)
            if (scaled == exact).all():  # relative µs with at most 3 decimals: the float is exact
                return exact.astype(np.int64)
    return _general(vals, field)


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
    with np.errstate(invalid="ignore"):  # (near the int64 ends: read from the digits below)
        ns[ok] = exact[ok].astype(np.int64)
    idx = np.flatnonzero(ok & ((np.abs(x) >= _FLOAT_EXACT_BELOW) | (scaled != exact)))
    if not len(idx):
        return ns
    texts = [vals[i] for i in idx.tolist()]
    if float in set(map(type, texts)):
        raise NeedExact(field)
    got = _digits_ns(texts)
    ns[idx] = got
    for j in np.flatnonzero(got == MISSING).tolist():  # anything else, one by one
        i, v = int(idx[j]), texts[j]
        if isinstance(v, (int, str)):  # (bool is an int)
            ns[i] = text_ns(v) if isinstance(v, str) else int(v) * 1000
        if ns[i] == MISSING:
            raise BadTime(i, field, v)
    return ns


def _texts(vals: list[Any], field: str) -> np.ndarray:
    """:func:`ns_of` of values that are mostly number texts: those :func:`_digits_ns` reads
    at once, the others (ints, exponents, junk) one by one by :func:`_general`."""
    ns = _digits_ns(vals)
    rest = np.flatnonzero(ns == MISSING)
    if len(rest):
        try:
            ns[rest] = _general([vals[i] for i in rest.tolist()], field)
        except BadTime as e:
            raise BadTime(int(rest[e.index]), field, e.value) from None
    return ns


def _digits_ns(texts: list[Any]) -> np.ndarray:
    """ns of plain number texts (no exponent, at most 3 decimals, at most 18 digits:
    ``"1712195495519689.047"``), all at once: the text without its point, read as an
    integer by numpy, times 10**(3 - decimals); :data:`MISSING` for any other value."""
    out = np.full(len(texts), MISSING, np.int64)
    try:
        a = np.array(texts, dtype="S")
    except (UnicodeEncodeError, ValueError, TypeError):
        return out
    if a.ndim != 1:
        return out
    st = getattr(np, "strings", np.char)  # (numpy 2's string ufuncs; np.char before)
    n = st.str_len(a)
    dot = st.find(a, b".")
    places = np.where(dot >= 0, n - dot - 1, 0)
    digits = st.replace(a, b".", b"")
    neg = st.startswith(a, b"-")
    # one point at most, a sign only in front, at most 3 decimals; the ns fit int64: at
    # most 18 digits, or 19 below 9e18 (epoch µs with 3 decimals have 19)
    size = st.str_len(digits) - neg + 3 - places
    ok = ((places <= 3) & (st.find(a, b".", dot + 1) < 0) & (st.find(a, b"-", 1) < 0) & (size > 3 - places)
          & ((size <= 18) | ((size == 19) & ~neg & (digits < b"9"))) & st.isdigit(st.replace(digits, b"-", b"")))
    if not ok.any():
        return out
    whole = digits[ok].astype(np.int64)  # (digits only, after the sign: numpy would take " 7", "+7")
    out[ok] = whole * 10 ** (3 - places[ok])
    return out


def _number(v: Any) -> float:
    """A number, or its text as Python reads it (" 7", "+7"); NaN for anything else."""
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    return float("nan")


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
