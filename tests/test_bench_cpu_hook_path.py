"""bench/apply/cpu_hook_path.py (the hook's steady-state Python a query, on the CPU) still drives the
hook's real path: its hand-built thread graph is replayed once per query, each copy hands out the
thread's buffer, and nothing falls back - else its numbers would time some other path. Pinned
sources (a view the script keeps gets its own memory) and pageable numpy arrays (their bytes written
into the thread's slots, counted at the script's line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import runpy, sys
sys.argv = ["cpu_hook_path.py"]
mod = runpy.run_path(sys.argv_path, run_name="bench")
model, src, tg = mod["setup"](6)
import torch
from recsys_doctor.applying._autoapply._common import _state
from recsys_doctor.applying._autoapply import accounting
dense, *idx, offs = src
for q in range(5):
    with torch.inference_mode():
        xs = [dense.to("cuda:0", non_blocking=True), [t.to("cuda:0", non_blocking=True) for t in idx],
              offs.to("cuda:0", non_blocking=True)]
        views = [xs[0], *xs[1], xs[2]]
        assert all(v.data_ptr() == b.data_ptr() for v, b in zip(views, tg.tin)), "a copy was not the buffer's view"
        out = model(*xs)
    # the graph's output lent to the script (the same memory: .lentout), the last one dropped first
    assert torch.equal(out, tg.static_out) and (out.data_ptr() == tg.static_out.data_ptr()) == (tg.lent is not None)
    del out
assert tg.lent is not None and _state["outputs_lent"] == 5, _state["outputs_lent"]
assert _state["thread_replays"] == 5, _state["thread_replays"]
rows = {r["kind"]: r for r in accounting.sites()}
assert rows["model"]["taken_over"] == 5 and rows["model"]["fallback"] == 0, rows
assert rows["h2d"]["taken_over"] == 30 and rows["h2d"]["fallback"] == 0, rows
# a view the script keeps past its query: the next query's copy gives it its own memory first
kept = views[0]
with torch.inference_mode():
    again = dense.to("cuda:0", non_blocking=True)
assert again is not kept and again.data_ptr() == tg.tin[0].data_ptr()
with torch._C.DisableTorchFunctionSubclass():
    assert kept.data_ptr() != tg.tin[0].data_ptr()
print("ok")
"""


PAGEABLE = """
import runpy, sys
import numpy as np
mod = runpy.run_path(sys.argv_path, run_name="bench")
model, src, tg = mod["setup"](5, True)
import torch
from recsys_doctor.applying._autoapply._common import _state
from recsys_doctor.applying._autoapply import accounting
rng = np.random.default_rng(0)
for q in range(4):  # new arrays every query, as a script's requests: their bytes land in the slots
    arrays = [rng.standard_normal(tuple(t.shape)).astype(np.float32) if t.is_floating_point()
              else rng.integers(0, 1000, tuple(t.shape)) for t in src]
    with torch.inference_mode():
        xs = [torch.from_numpy(a).cuda() for a in arrays]
        assert all(v.data_ptr() == b.data_ptr() for v, b in zip(xs, tg.tin)), "a copy was not the buffer's view"
        model(xs[0], xs[1:-1], xs[-1])
    assert all(np.array_equal(s.numpy(), a) for s, a in zip(src, arrays)), "a slot does not hold the query's bytes"
assert _state["thread_replays"] == 4 and _state["pageable_fast"] == 20, _state
rows = {r["kind"]: r for r in accounting.sites()}
assert rows["h2d"]["taken_over"] == 20 and rows["h2d"]["fallback"] == 0, rows
assert rows["h2d"]["site"] == "<string>:COPY_LINE", rows  # (the script's line that made the copies)
print("ok")
"""


def test_the_cpu_harness_times_the_hooks_thread_graph_path():
    code = PROBE.replace("sys.argv_path", repr(str(ROOT / "bench/apply/cpu_hook_path.py")))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]
    line = next(n for n, text in enumerate(PAGEABLE.splitlines(), 1) if "xs = [torch.from_numpy" in text)
    code = PAGEABLE.replace("sys.argv_path", repr(str(ROOT / "bench/apply/cpu_hook_path.py"))).replace(
        "COPY_LINE", str(line))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]
    run = subprocess.run([sys.executable, "bench/apply/cpu_hook_path.py", "--inputs", "4", "--queries", "500"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0 and "the hook's cost" in run.stdout, run.stderr[-2000:]
