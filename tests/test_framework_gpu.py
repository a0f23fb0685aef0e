"""A program PyTorch did not make, through ``profile`` on the GPU machine
(``pytest -m gpu tests/test_framework_gpu.py``): examples/cuda_python_serve.py, NVRTC kernels
launched from 4 Python threads through cuda-python into one shared stream.

Its checksum is recomputed by hand from the docstring; its trace is read with SQL (every kernel is
one of its two, none PyTorch's); ``profile``'s report names the framework CUDA, tells no fix in
PyTorch's words and says how to carry the plan out in CUDA."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from _sql import sql_rows  # noqa: E402

from recsys_doctor.cli import main  # noqa: E402

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "cuda_python_serve.py"
THREADS, QUERIES, ROWS, LAYERS = 4, 60, 256, 12


def _checksum() -> float:
    """The docstring's sum: thread t's query q ends at y = q * 0.01 + LAYERS * 0.5 * x_t (nothing
    below 0, so the ReLUs change nothing), x_t = (t + 1) * 0.001 * (i % 97)."""
    i = np.arange(ROWS)
    total = 0.0
    for t in range(THREADS):
        x = np.float32((t + 1) * 0.001) * (i % 97).astype(np.float32)
        total += sum(ROWS * q * 0.01 + LAYERS * 0.5 * float(x.sum(dtype=np.float64)) for q in range(QUERIES))
    return total


def test_the_program_computes_what_its_docstring_says():
    p = subprocess.run([sys.executable, str(SCRIPT), "--threads", str(THREADS), "--queries", str(QUERIES)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(p.stdout.strip().splitlines()[-1])
    assert d["queries"] == THREADS * QUERIES
    assert d["checksum"] == pytest.approx(_checksum(), rel=1e-5)


def test_profile_names_it_cuda_and_speaks_cuda(tmp_path):
    out = tmp_path / "o"
    res = CliRunner().invoke(main, ["profile", "--json", "--out", str(out), str(SCRIPT), "--",
                                    "--threads", str(THREADS), "--queries", str(QUERIES)], catch_exceptions=False)
    assert res.exit_code == 0, res.output[-3000:]
    d = json.loads(res.stdout)
    db = out / "trace.sqlite"
    names = dict(sql_rows(db, "SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                              "ON s.id = k.demangledName GROUP BY s.value"))
    # the warm-up client and the 4 threads: every query launches each kernel LAYERS times
    assert names == {"scale_add": (THREADS + 1) * QUERIES * LAYERS, "relu": (THREADS + 1) * QUERIES * LAYERS}, names
    fw = d["trace"]["framework"]
    assert fw["name"] == "cuda" and fw["evidence"]["pytorch_kernels"] == 0, fw
    for f in d["findings"]:
        if f["id"] != "no-gpu-activity":
            assert not re.search(r"torch|PyTorch|\.item\(\)|\.cpu\(\)|DataLoader", f["recommendation"]), f
    notes = d["plan"].get("notes") or []
    assert any(n.startswith("In CUDA: ") for n in notes), notes


def test_the_torch_backend_keeps_its_kernels_and_does_not_call_it_pytorch(tmp_path):
    """``profile --backend torch`` (CUPTI through torch.profiler, in the script's own process) of the
    same program: CUPTI records the program's own kernels (counted from the JSON), and a PyTorch
    profiler trace without a PyTorch op is still a CUDA program's."""
    import gzip

    out = tmp_path / "t"
    res = CliRunner().invoke(main, ["profile", "--backend", "torch", "--json", "--out", str(out), str(SCRIPT), "--",
                                    "--threads", str(THREADS), "--queries", str(QUERIES)], catch_exceptions=False)
    assert res.exit_code == 0, res.output[-3000:]
    d = json.loads(res.stdout)
    path = Path(d["capture"]["trace"])
    raw = (gzip.open(path) if path.suffix == ".gz" else open(path, "rb")).read()
    events = json.loads(raw)
    events = events["traceEvents"] if isinstance(events, dict) else events
    kernels = [e for e in events if str(e.get("cat", "")).lower() == "kernel"]
    assert sum(e["name"] == "scale_add" for e in kernels) == (THREADS + 1) * QUERIES * LAYERS
    assert not any(str(e.get("name", "")).startswith("aten::") for e in events)
    fw = d["trace"]["framework"]
    assert fw["name"] == "cuda", fw
    assert fw["because"].startswith("a PyTorch profiler trace without a PyTorch op or kernel"), fw
