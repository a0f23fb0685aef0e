"""The tests' own interval union, written out by hand (sort, merge, sum) so that GPU busy
and idle time are computed without the package's code."""

from __future__ import annotations

from collections.abc import Iterable


def union_len(pairs: Iterable[tuple[int, int]]) -> int:
    """Total length covered by the (start, end) intervals; overlaps count once."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(pairs):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total
