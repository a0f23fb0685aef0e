"""The one set of number formatters (recsys_doctor._util.format): expected strings written by hand."""

from __future__ import annotations

import math

import numpy as np

from recsys_doctor._util.format import duration_ns, fixed, fmt, fmt_value, pct


def test_fmt_counts_floats_and_absent():
    assert fmt(1234567) == "1,234,567"
    assert fmt(1234567.0) == "1,234,567"  # a whole-number float is a count: printed exactly
    assert fmt(0.123456) == "0.1235"
    assert fmt(1234.5678) == "1,235"
    assert fmt(13115.094) == "13,115" and fmt(-191163.4) == "-191,163"  # not "1.312e+04" (4 significant digits)
    assert fmt(999999.4) == "999,999" and fmt(1500000.5) == "1.5e+06"
    assert fmt(0.0001234) == "0.000123"
    assert fmt(None) == "n/a" and fmt(math.nan) == "n/a"
    assert fmt(True) == "yes" and fmt(np.int64(7)) == "7"
    assert fmt([1, 2.5]) == "1, 2.5"


def test_pct_fixed_duration():
    assert pct(0.4231) == "42.3%" and pct(0.4231, 0) == "42%" and pct(None) == "n/a"
    assert fixed(1234.5, " ms", 3) == "1,234.500 ms" and fixed(None) == "-" and fixed(7, " s") == "7 s"
    assert duration_ns(77_630) == "77.63 us" and duration_ns(2_500_000) == "2.500 ms"
    assert duration_ns(3_000_000_000) == "3.000 s" and duration_ns(420) == "420 ns"


def test_fmt_value_takes_the_unit_from_the_key():
    assert fmt_value("idle_share", 0.25) == "25.0%"
    assert fmt_value("median_us", 3.0) == "3.00 us"
    assert fmt_value("window_ns", 649_858_000) == "649.858 ms"
    assert fmt_value("count", 12345) == "12,345"
    assert fmt_value("x", None) == "n/a"
    # a nested dict keyed by finding ids takes the outer key's unit; its own units win
    assert fmt_value("shared_idle_ns", {"short-kernels": 1_200_000}) == "short-kernels=1.200 ms"
    assert fmt_value("shared_idle_ns", {"gap_share": 0.5, "other": 3}) == "gap_share=50.0%, other=3 ns"
