"""The analyzers' vectorized helpers against plain-Python references written out here
(dicts, loops, counting instants), on random inputs with ties, negative values, missing
labels and ranges too wide to pack, so that each fast path and its fallback agree with
what the helper promises."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from recsys_doctor.analyzers._arrays import code_order, code_spans
from recsys_doctor.analyzers._attribution import where_shares
from recsys_doctor.analyzers._ops import api_thread_spans
from recsys_doctor.analyzers._util import group_codes, str_is
from recsys_doctor.analyzers.stream_contention import _overlap_stats, _sweep_events
from recsys_doctor.model import Trace


def _ref_group_codes(*cols):
    """Groups numbered in the sorted order of their distinct key tuples."""
    keys = list(zip(*[[int(v) for v in c] for c in cols]))
    order = {k: i for i, k in enumerate(sorted(set(keys)))}
    return [order[k] for k in keys], sorted(set(keys))


@pytest.mark.parametrize("seed", range(6))
def test_group_codes_numbers_groups_in_sorted_key_order(seed):
    rng = np.random.default_rng(seed)
    n = 500
    pid = rng.choice([-3, 7, 123456, 2**31 - 5], n)
    dev = rng.integers(0, 3, n)
    stream = rng.choice([0, 7, 13, 2**40], n)
    codes, keys = group_codes(pid, dev, stream)
    want_codes, want_keys = _ref_group_codes(pid, dev, stream)
    assert codes.tolist() == want_codes
    assert keys == want_keys
    assert all(type(v) is int for k in keys for v in k)


def test_group_codes_falls_back_when_ranges_do_not_pack():
    a = np.array([-(2**62), 2**62, 0, 2**62, -(2**62)], dtype=np.int64)
    b = np.array([5, 5, 1, 4, 5], dtype=np.uint64)
    codes, keys = group_codes(a, b)
    want_codes, want_keys = _ref_group_codes(a, b)
    assert codes.tolist() == want_codes and keys == want_keys
    # (and a float column goes the per-column way)
    codes, keys = group_codes(np.array([2.0, 1.0, 2.0]), np.array([1, 1, 1]))
    assert codes.tolist() == [1, 0, 1] and keys == [(1.0, 1), (2.0, 1)]


def test_str_is_compares_codes_as_the_strings_would_compare():
    s = pd.Series(pd.Categorical(["h2d", "d2h", None, "d2h", "d2d"]))
    rows = np.array([3, 2, 1, 1, 0])
    assert str_is(s, "d2h").tolist() == [False, True, False, True, False]
    assert str_is(s, "d2h", rows).tolist() == [True, False, True, True, False]
    assert str_is(s, "pageable").tolist() == [False] * 5  # not a category at all
    plain = pd.Series(["a", None, "b"])
    assert str_is(plain, "b").tolist() == [False, False, True]
    assert str_is(plain, "a", np.array([0, 0])).tolist() == [True, True]


def _ref_where(labels, weights, top):
    sums: dict = defaultdict(float)
    for lab, w in zip(labels, weights):
        if lab is not None:
            sums[lab] += w
    total = float(sum(weights))
    ranked = sorted(sums.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [(k, round(v / total, 4)) for k, v in ranked]


@pytest.mark.parametrize("kind", ["count", "int", "float", "huge"])
def test_where_shares_sums_per_label(kind):
    rng = np.random.default_rng(3)
    n = 400
    labels = [None if x == 0 else f"thread {x}" for x in rng.integers(0, 9, n)]
    weights = {"count": None, "int": rng.integers(0, 10**9, n),
               "float": rng.random(n) * 1e3, "huge": rng.integers(2**50, 2**52, n)}[kind]
    got = [(d["k"], d["share"]) for d in where_shares(labels, weights, key="k", top=20)]
    want = _ref_where(labels, [1.0] * n if weights is None else [float(w) for w in weights], 20)
    # (ties between equal sums may come in either order: compare as sets of pairs when any)
    assert sorted(got) == sorted(want)
    assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
    # the codes form gives the same entries
    codes, uniq = pd.factorize(np.asarray(labels, dtype=object))
    assert where_shares((codes, np.asarray(uniq, dtype=object)), weights, key="k", top=20) == \
        where_shares(labels, weights, key="k", top=20)


def test_where_shares_counts_a_label_whose_weights_are_all_zero():
    got = where_shares(["a", "b", "a", None], np.array([0, 5, 0, 5]), key="k", top=5)
    assert got == [{"k": "b", "share": 0.5}, {"k": "a", "share": 0.0}]


@pytest.mark.parametrize("seed", range(5))
def test_sweep_events_orders_ends_before_starts(seed):
    rng = np.random.default_rng(seed)
    s = rng.integers(-50, 50, 300)
    e = s + rng.integers(0, 5, 300)
    times, delta = _sweep_events(s, e)
    want = sorted([(int(t), 1) for t in s] + [(int(t), -1) for t in e], key=lambda x: (x[0], x[1]))
    assert list(zip(times.tolist(), delta.tolist())) == want
    big = np.array([2**62, -(2**62)], dtype=np.int64)  # too wide to double: the lexsort way
    times, delta = _sweep_events(big, big + 1)
    assert times.tolist() == [-(2**62), -(2**62) + 1, 2**62, 2**62 + 1] and delta.tolist() == [1, -1, 1, -1]


@pytest.mark.parametrize("seed", range(8))
def test_overlap_share_counts_instants(seed):
    """Share of launch time during which another thread is launching too, counted one
    integer instant at a time: at each instant, the threads inside a call of theirs."""
    rng = np.random.default_rng(seed)
    n = 60
    tid = rng.integers(1, 4, n)
    s = rng.integers(0, 150, n)
    e = s + rng.integers(0, 12, n)
    o = np.lexsort((e, s))
    calls = pd.DataFrame({"tid": tid[o], "api_start": s[o], "api_end": e[o]})
    share, _ = _overlap_stats(calls)
    busy = over = 0
    for x in range(0, 200):
        inside = {t for t, a, b in zip(tid, s, e) if a <= x < b}
        busy += len(inside)
        over += len(inside) if len(inside) >= 2 else 0
    assert share == pytest.approx(over / busy if busy else 0.0, abs=1e-12)


def test_api_thread_spans_first_start_last_end_per_thread():
    rng = np.random.default_rng(1)
    n = 300
    pid = rng.choice([10, 20], n)
    tid = rng.choice([1, 2, 3], n)
    start = rng.integers(0, 10**6, n)
    end = start + rng.integers(0, 10**3, n)
    api = pd.DataFrame({"start": start, "end": end, "pid": pid, "tid": tid, "correlation": np.arange(1, n + 1),
                        "name": pd.Categorical(["cudaLaunchKernel"] * n)})
    spans = api_thread_spans(Trace(path="t", format="test", api=api))
    want: dict = {}
    for p, t, a, b in zip(pid.tolist(), tid.tolist(), start.tolist(), end.tolist()):
        lo, hi = want.get((p, t), (a, b))
        want[(p, t)] = (min(lo, a), max(hi, b))
    assert list(spans.index) == sorted(want)
    assert [(int(lo), int(hi)) for lo, hi in zip(spans["lo"], spans["hi"])] == [want[k] for k in sorted(want)]


def test_cli_imports_numpy_with_one_blas_thread_and_restores_the_environment():
    code = ("import os, sys\n"
            "from recsys_doctor._util.process import import_numpy_quietly\n"
            "import_numpy_quietly()\n"
            "print('numpy' in sys.modules, os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')))\n")
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("counts threads through /proc (Linux)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    loaded, var, threads = out.split()
    assert loaded == "True" and var == "None"
    assert int(threads) == 1  # numpy's BLAS started no server thread
    # a user's own setting wins and is left as it was
    env["OPENBLAS_NUM_THREADS"] = "2"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[1] == "2"


@pytest.mark.parametrize("n_codes", [3, 40_000])
def test_code_order_is_a_stable_sort_and_code_spans_the_extremes(n_codes):
    rng = np.random.default_rng(n_codes)
    codes = rng.integers(0, n_codes, 2000)
    start = rng.integers(-10**6, 10**6, 2000)
    end = start + rng.integers(0, 100, 2000)
    order = code_order(codes, n_codes)
    assert order.tolist() == sorted(range(len(codes)), key=lambda i: (codes[i], i))
    lo, hi = code_spans(codes, n_codes, start, end)
    want: dict = {}
    for c, a, b in zip(codes.tolist(), start.tolist(), end.tolist()):
        x, y = want.get(c, (a, b))
        want[c] = (min(x, a), max(y, b))
    for c in range(n_codes):
        got = (int(lo[c]), int(hi[c]))
        assert got == want.get(c, (np.iinfo(np.int64).max, np.iinfo(np.int64).min))
