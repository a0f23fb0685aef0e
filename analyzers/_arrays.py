"""Numpy helpers that know nothing of traces: interval unions and pair codes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

__all__ = ["merge_intervals", "pair_codes", "code_order", "code_spans"]


def merge_intervals(start: Any, end: Any) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals ``[start, end)`` as sorted disjoint (starts, ends) arrays.
    Touching intervals are merged."""
    s = np.asarray(start, dtype=np.int64)
    e = np.asarray(end, dtype=np.int64)
    if s.size == 0:
        return s[:0], e[:0]
    e = np.maximum(e, s)
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    cm = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > cm[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def code_order(codes: np.ndarray, n_codes: int) -> np.ndarray:
    """``np.argsort(codes, kind="stable")`` for group codes ``0..n_codes-1``: with fewer than
    2**15 groups, of a narrow copy, which numpy sorts by counting (its radix sort)."""
    return np.argsort(codes.astype(np.int16) if n_codes < 1 << 15 else codes, kind="stable")


def code_spans(codes: np.ndarray, n_codes: int, start: Any, end: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per group code ``0..n_codes-1``: the least ``start`` and the greatest ``end`` of its
    rows (one unbuffered pass each, not a groupby; a code with no row keeps the int64
    extremes)."""
    lo = np.full(n_codes, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(n_codes, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, codes, np.asarray(start, dtype=np.int64))
    np.maximum.at(hi, codes, np.asarray(end, dtype=np.int64))
    return lo, hi


def pair_codes(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (a, b) pairs in first-seen order: (code of each row, a and b of each pair).
    One hash pass over a packed key when both fit in 32 bits (pids, tids, streams do)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if len(a) and a.min() == a.max():  # one a (one process, one device): the pairs are b's values
        inv, keys = pd.factorize(b)
        return inv, np.full(len(keys), a[0], dtype=np.int64), np.asarray(keys, dtype=np.int64)
    lim = 1 << 31
    if not len(a) or (-lim <= a.min() and a.max() < lim and -lim <= b.min() and b.max() < lim):
        inv, keys = pd.factorize((a << 32) | (b & 0xFFFFFFFF))
        keys = np.asarray(keys, dtype=np.int64)
        lo = keys & 0xFFFFFFFF
        return inv, keys >> 32, np.where(lo >= lim, lo - (1 << 32), lo)
    fa, ua = pd.factorize(a)
    fb, ub = pd.factorize(b)
    w = max(len(ub), 1)
    inv, pair = pd.factorize(fa.astype(np.int64) * w + fb)
    return inv, np.asarray(ua)[pair // w], np.asarray(ub)[pair % w]
