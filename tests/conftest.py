"""Shared fixtures.

* ``shared_traces``: the real traces in ``../shared/traces`` beside the checkout; tests
  that use it skip cleanly where it is absent (anyone can clone and ``make test``).
* ``project_data``: the project's own small fixtures in ``tests/data``.
* the ``gpu`` marker: such tests skip unless an NVIDIA GPU is usable.
* ``hook_group``: a script-hook thread's group on the CPU (no stream) over a fresh hook state.
* ``heldout_runs``: every held-out script of examples/heldout/ run once on the CPU at each thread
  count of tests/test_heldout_scripts.py, shared by the test modules that check them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(os.environ.get("RECSYS_DOCTOR_SHARED", ROOT.parent / "shared")) / "traces"
DATA = Path(__file__).resolve().parent / "data"


def _have_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return n > 0
    except Exception:
        return False


HAVE_GPU = _have_gpu()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords and not HAVE_GPU:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"{SHARED_TRACES} not present (clone with ../shared beside it to run these)")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def project_data() -> Path:
    return DATA


def shared_files(sub: str, patterns: tuple[str, ...]) -> list[Path]:
    """Files under ``../shared/traces/<sub>`` for parametrizing; empty where absent."""
    d = SHARED_TRACES / sub
    if not d.is_dir():
        return []
    out: list[Path] = []
    for p in patterns:
        out.extend(sorted(d.glob(p)))
    return out


@pytest.fixture(autouse=True)
def _private_history_db(tmp_path_factory, monkeypatch):
    """Every test records runs into its own history database, never the user's."""
    if "RECSYS_DOCTOR_DB" not in os.environ or os.environ.get("RECSYS_DOCTOR_TEST_DB_SET"):
        db = tmp_path_factory.mktemp("history") / "history.db"
        monkeypatch.setenv("RECSYS_DOCTOR_DB", str(db))
        monkeypatch.setenv("RECSYS_DOCTOR_TEST_DB_SET", "1")


@pytest.fixture
def hook_group(monkeypatch):
    """A hooked thread's group of the script hook (no stream: nothing reaches a capture) and a
    fresh state: what its graph path needs to run on the CPU up to a capture."""
    from recsys_doctor.applying import _autoapply as hook
    from recsys_doctor.applying._autoapply import accounting
    from recsys_doctor.applying._autoapply._common import _tls
    from recsys_doctor.applying._autoapply.groups import _Gate, _Group

    for k, v in {"gate": _Gate(), "fallbacks": [], "graph_bytes": 0, "captured": 0, "replays": 0}.items():
        monkeypatch.setitem(hook._state, k, v)
    accounting.reset()
    g = _Group(0, stream=None)
    _tls.group = g
    yield g
    del _tls.group


@pytest.fixture(scope="module")
def heldout_json(heldout_runs, request) -> dict[int, dict]:
    """The held-out script named by the requesting test module's ``NAME`` at each thread count
    with its TINY arguments (``heldout_runs``: one intra-op thread, nothing on PYTHONPATH): its one
    JSON line, parsed."""
    from test_heldout_scripts import json_runs

    return json_runs(heldout_runs, request.module.NAME)


@pytest.fixture(scope="session")
def heldout_runs() -> dict[tuple[str, int], list[str]]:
    """Every held-out script at 1 and 3 client threads (one intra-op thread each, nothing on
    PYTHONPATH), a few at a time (two per CPU, 4 to 16 at once: all ~80 at once took more memory
    than a small machine has): their stdout lines, by (script, threads)."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from test_heldout_scripts import CLIENTS, HELDOUT, THREADS, TINY

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}

    def run(key: tuple[str, int]) -> list[str]:
        name, t = key
        p = subprocess.run([sys.executable, str(HELDOUT / name), "--device", "cpu", *TINY[name],
                            CLIENTS.get(name, ("--threads",))[0], str(t)],
                           capture_output=True, text=True, cwd=HELDOUT, env=env, timeout=300)
        assert p.returncode == 0, f"{key}: {p.stderr[-2000:]}"
        return p.stdout.splitlines()

    keys = [(name, t) for name in TINY for t in THREADS]
    with ThreadPoolExecutor(max_workers=max(4, min(16, 2 * (os.cpu_count() or 2)))) as pool:
        return dict(zip(keys, pool.map(run, keys)))
