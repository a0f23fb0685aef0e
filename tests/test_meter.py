"""A script that prints no measurement of its own is measured by the hook (``_autoapply/meter.py``):
run as it is under the meter-only plan (nothing of it changed), its top-level model calls are
counted (a submodule's call inside them is not) and timed, and their rate is what
``profile --apply`` compares plans by (``script_hook.run_as_is``). On the CPU: the hook's
meter-only plan needs no GPU."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from recsys_doctor.applying.script_hook import merge_hook_stats, run_as_is  # noqa: E402
from recsys_doctor.errors import WorkloadError  # noqa: E402

SCRIPT = textwrap.dedent('''
    import sys, threading, time
    import torch

    class Slow(torch.nn.Module):  # two submodules, and 2 ms a call
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)

        def forward(self, x):
            time.sleep(0.002)
            return self.b(torch.relu(self.a(x)))

    model, x = Slow().eval(), torch.randn(4, 8)
    calls, threads = int(sys.argv[1]), int(sys.argv[2])

    def work():
        with torch.no_grad():
            for _ in range(calls):
                model(x)

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("scored", calls * threads)  # (no JSON line: nothing the tool can read)
    if len(sys.argv) > 3:
        print('{"qps": 123.0, "queries": 7}')
''')


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "silent.py"
    p.write_text(SCRIPT)
    return p


def test_a_silent_script_is_measured_by_its_top_level_model_calls(script, tmp_path):
    m, out, metered = run_as_is([sys.executable, str(script), "200", "1"], tmp_path / "run", log=tmp_path / "log")
    assert metered and "scored 200" in out
    # 200 calls, not 600 (each call's two submodule calls are inside it)
    assert m["calls"] == 200 and m["source"] == "hook"
    # 2 ms of sleep a call, one thread: at most 500 calls a second, and not far below it
    assert 300 < m["qps"] <= 505, m
    stats = json.loads((tmp_path / "run" / "meter.hook_stats.json").read_text())
    assert stats["meter_only"] and stats["measurement"] == m and stats["sites"] == []


def test_threads_calls_add_up(script, tmp_path):
    m, _, metered = run_as_is([sys.executable, str(script), "100", "4"], tmp_path / "run", log=tmp_path / "log")
    assert metered and m["calls"] == 400
    assert 300 * 2 < m["qps"] <= 505 * 4, m  # 4 threads sleeping side by side (the GIL is free while they sleep)


def test_a_script_printing_its_measurement_is_not_metered(script, tmp_path):
    m, _, metered = run_as_is([sys.executable, str(script), "30", "1", "json"], tmp_path / "run", log=tmp_path / "log")
    assert not metered and m == {"qps": 123.0, "queries": 7}
    assert not (tmp_path / "run" / "meter.hook_stats.json").exists()


def test_a_silent_script_without_model_calls_is_refused_in_one_line(tmp_path):
    p = tmp_path / "nothing.py"
    p.write_text("import torch\nprint(torch.ones(3).sum().item())\n")
    with pytest.raises(WorkloadError, match=r"printed no measurement.*counted too few model calls"):
        run_as_is([sys.executable, str(p)], tmp_path / "run", log=tmp_path / "log")


def test_worker_processes_rates_add_up():
    main = {"active": True, "measurement": None, "sites": []}
    kids = [{"active": True, "sites": [], "measurement": {"qps": 100.0, "calls": 500, "window_s": 4.5, "source": "hook"}},
            {"active": True, "sites": [], "measurement": {"qps": 50.5, "calls": 240, "window_s": 4.0, "source": "hook"}}]
    m = merge_hook_stats(main, kids)["measurement"]
    assert m == {"qps": 150.5, "calls": 740, "window_s": 4.5, "source": "hook", "processes": 2}
    step = {"step_ms": 12.5, "steps": 90, "window_s": 1.0, "source": "hook"}
    assert merge_hook_stats(main, [{"active": True, "sites": [], "measurement": step}])["measurement"] == step


def test_a_plan_run_is_metered_the_same_way(script, tmp_path):
    """Under a candidate's plan (graphs on: ``nn.Module.__call__`` patched when PyTorch is
    imported; on the CPU no thread is placed) the meter wraps the hook's call: the same count."""
    from recsys_doctor.applying.script_hook import run_script, script_env

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"runtime": {"groups": 2, "cuda_graphs": True}}))
    sp = tmp_path / "stats.json"
    env = script_env(plan, hook_dir=tmp_path / "hook", stats_path=sp, meter=True)
    m, _ = run_script([sys.executable, str(script), "120", "2"], env=env, log=tmp_path / "log")
    assert m["calls"] == 240 and m["source"] == "hook" and 300 < m["qps"] <= 505 * 2, m
    stats = json.loads(sp.read_text())
    assert not stats["meter_only"] and stats["graphs"] is True
    env.pop("RECSYS_DOCTOR_METER")  # not metered: no measurement, the run refused as before
    with pytest.raises(WorkloadError, match="printed no measurement"):
        run_script([sys.executable, str(script), "30", "1"], env=env, log=tmp_path / "log")


def test_apply_compare_measures_a_silent_command_by_its_model_calls(script, tmp_path):
    """``recsys-doctor apply PLAN --compare -- python silent.py``: both runs measured by the hook
    (as it is under the meter-only plan, then under PLAN), the q/s row printed for both."""
    import subprocess

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"runtime": {"groups": 2, "cuda_graphs": True}}))
    p = subprocess.run([sys.executable, "-m", "recsys_doctor", "apply", str(plan), "--compare", "--json", "--",
                        sys.executable, str(script), "150", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    for side in ("before", "after"):
        assert doc[side]["calls"] == 150 and doc[side]["source"] == "hook" and 300 < doc[side]["qps"] <= 505, doc


def test_worker_processes_are_metered_too(tmp_path):
    """A silent script whose model calls are made in worker processes (``spawn``, ending
    normally): each worker writes its count, and the program's measurement adds them up."""
    p = tmp_path / "procs.py"
    p.write_text(textwrap.dedent('''
        import multiprocessing as mp, time
        import torch

        def work(n):
            m = torch.nn.Linear(4, 1).eval()
            x = torch.randn(2, 4)
            with torch.no_grad():
                for _ in range(n):
                    time.sleep(0.002)
                    m(x)
            return n

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            ps = [ctx.Process(target=work, args=(60,)) for _ in range(2)]
            for q in ps:
                q.start()
            for q in ps:
                q.join()
            print("done")
    '''))
    m, _, metered = run_as_is([sys.executable, str(p)], tmp_path / "run", log=tmp_path / "log")
    assert metered and m["calls"] == 120 and m.get("processes") == 2, m


def test_a_silent_training_loop_is_measured_by_its_optimizer_steps(tmp_path):
    """A training loop that prints only its losses: measured by its optimizer steps (PyTorch's
    global step hook), as a step time, so ``profile --apply`` compares it as a training loop;
    each step here sleeps 3 ms besides its three model calls (one forward, two in the loss)."""
    p = tmp_path / "train.py"
    p.write_text(textwrap.dedent('''
        import time
        import torch

        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        reg = torch.nn.Linear(1, 1)
        opt = torch.optim.Adam(list(model.parameters()) + list(reg.parameters()), lr=1e-3)
        x, y = torch.randn(32, 8), torch.randn(32, 1)
        for step in range(80):
            time.sleep(0.003)
            out = model(x)
            loss = ((out - y) ** 2).mean() + reg(out).abs().mean() + 0 * reg(y).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 20 == 0:
                print(f"step {step} loss {loss.item():.4f}")
    '''))
    m, out, metered = run_as_is([sys.executable, str(p)], tmp_path / "run", log=tmp_path / "log")
    assert metered and "step 60 loss" in out
    assert m["steps"] == 80 and m["source"] == "hook" and "qps" not in m
    assert 3.0 <= m["step_ms"] < 30.0, m  # at least the 3 ms sleep a step
