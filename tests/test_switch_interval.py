"""The GIL switch interval a batching served model holds while it serves (issue 24,
``runtime/_serve_batching.py``): the shortest held interval is the process's, and the one
from before the first hold comes back once the last is released, in any order. CPU only:
``sys.setswitchinterval`` itself, no CUDA."""

from __future__ import annotations

import sys

import pytest

from recsys_doctor.errors import BadInputError
from recsys_doctor.runtime._serve_batching import (DEFAULT_SWITCH_INTERVAL_MS, BatchingOptions, hold_switch_interval,
                                                   release_switch_interval)


@pytest.fixture
def interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.004)  # a value of the test's own, not Python's default
    yield
    sys.setswitchinterval(before)


def test_shortest_held_wins_and_the_first_value_comes_back_in_any_order(interval):
    a = hold_switch_interval(0.5)
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    b = hold_switch_interval(0.2)
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    c = hold_switch_interval(1.0)  # longer than one held: the shortest stays
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    release_switch_interval(b)  # the shortest released first: the next shortest
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    release_switch_interval(a)
    assert sys.getswitchinterval() == pytest.approx(0.001)
    release_switch_interval(a)  # twice: nothing
    assert sys.getswitchinterval() == pytest.approx(0.001)
    release_switch_interval(c)
    assert sys.getswitchinterval() == pytest.approx(0.004)


def test_a_change_made_between_holds_is_what_comes_back(interval):
    t = hold_switch_interval(0.2)
    release_switch_interval(t)
    sys.setswitchinterval(0.003)
    t = hold_switch_interval(0.2)
    release_switch_interval(t)
    assert sys.getswitchinterval() == pytest.approx(0.003)


def test_settings():
    assert 0 < DEFAULT_SWITCH_INTERVAL_MS < 5  # shorter than Python's own 5 ms, or it changes nothing
    assert BatchingOptions(switch_interval_ms=None).switch_interval_ms is None
    for bad in (0, -1.0, "0.5", True, float("nan")):
        with pytest.raises(BadInputError, match="switch_interval_ms"):
            BatchingOptions(switch_interval_ms=bad)


def test_driver_threads_default_is_the_same_in_serve_and_the_options():
    """serve()'s own default and BatchingOptions' are the one constant (two drivers), and a
    count that is not a positive integer is refused in one line."""
    import inspect

    from recsys_doctor.runtime._serve_batching import DEFAULT_DRIVERS
    from recsys_doctor.runtime.serving import serve

    assert DEFAULT_DRIVERS == 2
    assert inspect.signature(serve).parameters["drivers"].default == BatchingOptions().drivers == DEFAULT_DRIVERS
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(BadInputError, match="drivers"):
            BatchingOptions(drivers=bad)
