"""Capture without a GPU: workload loading and driving, NVML degrading, the nsys command
lines, the profile command's errors - and the whole nsys path end to end with a stand-in
``nsys`` that runs the program for real and "exports" a known SQLite trace."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from recsys_doctor.capture import child_argv, choose_backend, profile
from recsys_doctor.capture import nsys as nsys_backend
from recsys_doctor.capture._child import main as child_main
from recsys_doctor.capture.nvml import NvmlSampler, NvmlSamples, plot_samples
from recsys_doctor.capture.torch_profiler import require_torch_cuda
from recsys_doctor.errors import BadInputError, NsysNotFoundError
from recsys_doctor.capture.workload import (Workload, WorkloadError, is_workload_module, load_workload, measure,
                                    percentile)

from conftest import HAVE_GPU

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "recsys_doctor" / "data" / "demo_wdl_serial_q4.sqlite.gz"


def write(p: Path, src: str) -> Path:
    p.write_text(textwrap.dedent(src))
    return p


CPU_WORKLOAD = """
    from recsys_doctor.capture.workload import Workload

    CALLS = []

    def workload(argv):
        threads = int(argv[0]) if argv else 2
        return Workload(model=None, inputs=lambda k: (k,), kind="serve", concurrency=threads, steps=4,
                        warmup=1, run=lambda k: CALLS.append(k))
"""


# ------------------------------------------------------------------ workload loading
def test_is_workload_module_parses_without_running(tmp_path):
    boom = write(tmp_path / "script.py", "raise SystemExit('executed!')\n")
    assert is_workload_module(boom) is False  # parsed, not run
    wl = write(tmp_path / "wl.py", "def workload():\n    pass\n")
    assert is_workload_module(wl) is True
    imported = write(tmp_path / "wl2.py", "from somewhere import workload\n")
    assert is_workload_module(imported) is True


def test_load_workload_passes_args_and_imports_neighbours(tmp_path):
    write(tmp_path / "helper_mod_xyz.py", "THREADS = 3\n")
    p = write(tmp_path / "wl.py", """
        from helper_mod_xyz import THREADS
        from recsys_doctor.capture.workload import Workload
        def workload(argv):
            return Workload(model=None, inputs=lambda k: (), concurrency=THREADS + len(argv))
    """)
    wl = load_workload(p, ["a", "b"])
    assert wl.concurrency == 5 and wl.kind == "serve" and wl.name == "wl"


@pytest.mark.parametrize("src, cls, needle", [
    ("x = 1\n", BadInputError, "has no workload() function"),
    ("workload = 3\n", BadInputError, "not a function"),
    ("def workload():\n    return 42\n", BadInputError, "returned int"),
    ("def workload(:\n", BadInputError, "not valid Python"),
    ("raise RuntimeError('no CUDA here')\ndef workload(): pass\n", WorkloadError, "RuntimeError: no CUDA here"),
    ("def workload():\n    raise ValueError('bad vocab')\n", WorkloadError, "ValueError: bad vocab"),
    ("from recsys_doctor.capture.workload import Workload\n"
     "def workload():\n    return Workload(model=None, inputs=lambda k: (), kind='infer')\n", BadInputError, "kind"),
    ("from recsys_doctor.capture.workload import Workload\n"
     "def workload():\n    return Workload(model=None, inputs=lambda k: (), kind='train')\n", BadInputError, "run="),
])
def test_load_workload_errors(tmp_path, src, cls, needle):
    p = write(tmp_path / "bad.py", src)
    with pytest.raises(cls) as ei:
        load_workload(p)
    assert needle in str(ei.value)
    assert "\n" not in str(ei.value)


def test_load_workload_refuses_args_it_cannot_take(tmp_path):
    p = write(tmp_path / "wl.py", "from recsys_doctor.capture.workload import Workload\n"
                                  "def workload():\n    return Workload(model=None, inputs=lambda k: ())\n")
    with pytest.raises(BadInputError, match="takes no arguments"):
        load_workload(p, ["--batch", "3"])


def test_missing_and_directory(tmp_path):
    with pytest.raises(BadInputError, match="no such file"):
        load_workload(tmp_path / "model.py")
    with pytest.raises(BadInputError, match="is a directory"):
        is_workload_module(tmp_path)


# ------------------------------------------------------------------ the driver
class FakeClock:
    """A clock that only moves when a query says so: latencies are exactly known."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_measure_exact_latencies_with_a_scripted_clock():
    clock = FakeClock()
    lat_ms = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0, 6.0, 7.0, 8.0, 9.0]
    it = iter(lat_ms)

    def run(x):
        clock.now += next(it) / 1e3

    wl = Workload(model=None, inputs=lambda k: (k,), concurrency=1, steps=10, warmup=0, run=run)
    m = measure(wl, clock=clock)
    assert m.calls == 10 and m.threads == 1
    # nearest rank by hand: sorted 1..10 -> p50 is the 5th value, p99 the 10th
    assert m.p50_ms == pytest.approx(5.0)
    assert m.p99_ms == pytest.approx(10.0)
    assert m.mean_ms == pytest.approx(5.5)
    assert m.wall_s == pytest.approx(0.055)
    assert m.qps == pytest.approx(10 / 0.055)


def test_percentile_nearest_rank():
    v = list(range(1, 201))  # 1..200
    assert percentile(v, 99) == 198  # ceil(0.99*200) = 198th value
    assert percentile(v, 50) == 100
    assert percentile([7.0], 99) == 7.0


def test_measure_threads_steps_warmup_and_losses():
    calls: list[tuple[str, int]] = []
    lock = threading.Lock()
    made = []

    def inputs(k):
        made.append(k)
        return (k,)

    def run(k):
        with lock:
            calls.append((threading.current_thread().name, k))
        return SimpleNamespace(item=lambda: float(len(calls)))

    wl = Workload(model=None, inputs=inputs, kind="train", concurrency=3, steps=4, warmup=2, run=run)
    m = measure(wl)
    assert sorted(made) == [0, 1, 2]  # inputs made once per client
    assert len(calls) == 3 * (4 + 2)  # warm-up calls are not measured but happen
    assert m.calls == 12 and m.threads == 3
    assert {name for name, _ in calls} == {"client-0", "client-1", "client-2"}
    assert all(name == f"client-{k}" for name, k in calls)
    assert len(m.losses) == 4 and m.step_ms is not None


def test_measure_overrides_and_duration():
    wl = Workload(model=None, inputs=lambda k: (), concurrency=1, steps=1000, warmup=0, run=lambda: None)
    m = measure(wl, threads=2, duration_s=0.05)
    assert m.threads == 2
    assert 0.05 <= m.wall_s < 2.0
    assert m.calls > 0


def test_measure_client_error_becomes_workload_error():
    def run(k):
        if k == 1:
            raise KeyError("feature_7")

    wl = Workload(model=None, inputs=lambda k: (k,), concurrency=2, steps=3, warmup=0, run=run)
    with pytest.raises(WorkloadError, match="KeyError"):
        measure(wl)


def test_measure_hooks_run_and_client_context():
    entered = []

    @contextlib.contextmanager
    def ctx(k):
        entered.append(k)
        yield

    seen = []
    wl = Workload(model=None, inputs=lambda k: (k,), concurrency=2, steps=2, warmup=0, run=lambda k: 1 / 0)
    m = measure(wl, run=lambda k: seen.append(k), client_context=ctx)
    assert sorted(entered) == [0, 1] and sorted(seen) == [0, 0, 1, 1] and m.calls == 4


def test_measure_synchronizes_after_calls_unless_they_are_synchronous(monkeypatch):
    from recsys_doctor.capture import _drive
    syncs: list[int] = []
    monkeypatch.setattr(_drive, "_default_sync", lambda: (lambda: syncs.append(1)))
    wl = Workload(model=None, inputs=lambda k: (), concurrency=1, steps=5, warmup=2, run=lambda: None)
    measure(wl)
    assert syncs == [1] * (1 + 5)  # once after the warm-up, then after every timed call

    class Done:  # like a served model: returns once its results are on the host
        synchronous = True

        def __call__(self) -> None:
            pass

    syncs.clear()
    measure(wl, run=Done())
    assert syncs == []
    measure(wl, run=Done(), sync=lambda: syncs.append(2))  # an explicit sync always runs
    assert syncs == [2] * (1 + 5)


def test_phases_reach_the_annotators_and_reuse_one_nvtx_range():
    from recsys_doctor.capture._drive import annotate_with, phase

    assert phase("query") is phase("query")  # built once per name: it wraps every call
    seen: list[str] = []

    @contextlib.contextmanager
    def note(name):
        seen.append(name)
        yield

    with annotate_with(note):
        with phase("query"), phase("step"):
            pass
    with phase("query"):
        pass
    assert seen == ["query", "step"]


def test_child_writes_measurement(tmp_path):
    p = write(tmp_path / "wl.py", CPU_WORKLOAD)
    out = tmp_path / "m.json"
    assert child_main([str(p), "--result", str(out), "--steps", "3", "--", "5"]) == 0
    d = json.loads(out.read_text())
    assert d["threads"] == 5 and d["calls"] == 15


def test_child_reports_bad_input(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert child_main([str(tmp_path / "missing.py"), "--result", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err and not out.exists()


# ------------------------------------------------------------------ NVML
def test_nvml_without_pynvml_degrades(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with NvmlSampler(0, 0.01) as s:
        pass
    assert s.result.samples == [] and "pynvml not installed" in s.result.reason
    summ = s.result.summary()
    assert summ["n"] == 0 and "pynvml" in summ["reason"]


@pytest.mark.skipif(HAVE_GPU, reason="checks the no-GPU path")
def test_nvml_without_gpu_degrades():
    with NvmlSampler(0, 0.01) as s:
        pass
    assert s.result.samples == [] and s.result.reason


def test_nvml_disabled():
    with NvmlSampler(0, enabled=False) as s:
        pass
    assert s.result.samples == [] and "--no-nvml" in s.result.reason


class FakeNvml:
    """The pynvml API surface the sampler uses, with scripted utilization values."""

    NVML_CLOCK_SM = 1

    def __init__(self, utils, fail_after=None):
        self.utils, self.i, self.fail_after, self.shutdowns = utils, 0, fail_after, 0

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return "h0"

    def nvmlDeviceGetName(self, h):
        return b"Fake GPU"

    def nvmlSystemGetDriverVersion(self):
        return "580.1"

    def nvmlDeviceGetUtilizationRates(self, h):
        if self.fail_after is not None and self.i >= self.fail_after:
            raise RuntimeError("GPU is lost")
        u = self.utils[self.i % len(self.utils)]
        self.i += 1
        return SimpleNamespace(gpu=u, memory=u // 2)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=3 * 2**20 * 1024)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980


def test_nvml_sampler_with_fake_nvml(tmp_path):
    import time

    nv = FakeNvml([10, 20, 90])
    with NvmlSampler(0, 0.005, nvml=nv) as s:
        time.sleep(0.1)
    r = s.result
    assert nv.shutdowns == 1 and r.reason is None and r.device_name == "Fake GPU"
    assert len(r.samples) >= 3
    u = [x["util_gpu"] for x in r.samples]
    assert u[:3] == [10.0, 20.0, 90.0]
    summ = r.summary()
    assert summ["util_mean"] == pytest.approx(sum(u) / len(u), abs=0.01)
    assert summ["util_p50"] == sorted(u)[(len(u) - 1) // 2] or len(u) % 2 == 0
    assert summ["mem_used_max_mib"] == 3072.0 and summ["sm_clock_mean_mhz"] == 1980.0
    saved = json.loads(r.save(tmp_path / "nvml.json").read_text())
    assert len(saved["samples"]) == len(r.samples)
    png = plot_samples(r, tmp_path / "nvml.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nvml_sampling_error_is_kept_not_raised():
    import time

    nv = FakeNvml([50], fail_after=2)
    with NvmlSampler(0, 0.002, nvml=nv) as s:
        time.sleep(0.05)
    assert len(s.result.samples) == 2 and "GPU is lost" in s.result.reason


def test_plot_without_samples_is_none(tmp_path):
    assert plot_samples(NvmlSamples(0, 0.05, reason="x"), tmp_path / "p.png") is None
    assert not (tmp_path / "p.png").exists()


# ------------------------------------------------------------------ nsys command lines
def test_nsys_profile_argv_exact():
    argv = nsys_backend.profile_argv("/opt/nsys", "/tmp/run/trace", ["python3", "m.py", "--x", "1"])
    assert argv == ["/opt/nsys", "profile", "-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none",
                    "--force-overwrite=true", "-o", "/tmp/run/trace", "python3", "m.py", "--x", "1"]


def test_nsys_profile_argv_with_gil_stacks():
    """``profile --gil-stacks``: the OS runtime traced too, every call of 10 us or more with its
    DWARF-unwound call stack (how tests/data/gil_wdl_eager_q4 was made)."""
    argv = nsys_backend.profile_argv("/opt/nsys", "/tmp/run/trace", ["python3", "m.py"], gil_stacks=True)
    assert argv == ["/opt/nsys", "profile", "-t", "cuda,nvtx,osrt", "--sample=none", "--cpuctxsw=none",
                    "--osrt-threshold=10000", "--osrt-backtrace-threshold=10000", "--backtrace=dwarf",
                    "--force-overwrite=true", "-o", "/tmp/run/trace", "python3", "m.py"]


def test_nsys_export_argv_exact():
    argv = nsys_backend.export_argv("/opt/nsys", "/tmp/run/trace.nsys-rep", "/tmp/run/trace.sqlite")
    assert argv == ["/opt/nsys", "export", "--type", "sqlite", "--force-overwrite", "true",
                    "-o", "/tmp/run/trace.sqlite", "/tmp/run/trace.nsys-rep"]


def test_child_argv():
    argv = child_argv(Path("wl.py"), Path("m.json"), ["--batch", "8"], threads=8, duration_s=2, steps=None,
                      profiled="nsys")
    assert argv == [sys.executable, "-m", "recsys_doctor.capture._child", "wl.py", "--result", "m.json",
                    "--threads", "8", "--duration", "2.0", "--profiled", "nsys", "--", "--batch", "8"]


def test_backend_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("RECSYS_DOCTOR_NSYS", raising=False)
    monkeypatch.setattr("recsys_doctor.loaders.nsysrep.NSYS_GLOBS", ())
    assert choose_backend("auto") == "torch"
    assert choose_backend("torch") == "torch"
    with pytest.raises(NsysNotFoundError, match="--backend torch"):
        choose_backend("nsys")
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert choose_backend("auto") == "nsys"
    with pytest.raises(BadInputError):
        choose_backend("cupti")


def test_torch_backend_needs_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BadInputError, match="needs PyTorch"):
        require_torch_cuda()


# ------------------------------------------------------------------ the nsys path end to end, stand-in nsys
FAKE_NSYS = """#!{python}
# Stand-in for nsys: 'profile' runs the program for real (so the child process and the
# measurement are real) and writes a placeholder report; 'export' writes a known SQLite.
import json, shutil, subprocess, sys, gzip
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
if args[0] == "profile":
    o = args[args.index("-o") + 1]
    prog = args[args.index("-o") + 2:]
    rc = subprocess.call(prog)
    open(o + ".nsys-rep", "wb").write(b"fake report")
    sys.exit(rc)
if args[0] == "export":
    with gzip.open({demo!r}, "rb") as src, open(args[args.index("-o") + 1], "wb") as dst:
        shutil.copyfileobj(src, dst)
"""


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    log = tmp_path / "nsys_calls.jsonl"
    exe = tmp_path / "bin" / "nsys"
    exe.parent.mkdir()
    exe.write_text(FAKE_NSYS.format(python=sys.executable, log=str(log), demo=str(DEMO)))
    exe.chmod(0o755)
    monkeypatch.setenv("RECSYS_DOCTOR_NSYS", str(exe))
    monkeypatch.setattr("recsys_doctor.capture.backend.require_gpu", lambda i=0: {"gpu": "stand-in", "gpu_count": 1})
    return exe, log


def _kernel_count(sqlite: Path, nvtx: str | None = None) -> int:
    """Kernels in the export, or those overlapping the span of the NVTX ranges ``nvtx``."""
    con = sqlite3.connect(sqlite)
    try:
        if nvtx is None:
            return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        lo, hi = con.execute(
            "SELECT min(n.start), max(n.end) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON n.textId = s.id "
            "WHERE coalesce(n.text, s.value) = ?", (nvtx,)).fetchone()
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE end > ? AND start < ?",
                           (lo, hi)).fetchone()[0]
    finally:
        con.close()


def test_profile_workload_through_stand_in_nsys(tmp_path, fake_nsys):
    exe, log = fake_nsys
    wl = write(tmp_path / "wl.py", CPU_WORKLOAD)
    out = tmp_path / "run"
    res = profile(wl, ["3"], backend="auto", out_dir=out, steps=2)
    calls = [json.loads(ln) for ln in log.read_text().splitlines()]
    calls = [c for c in calls if c != ["--version"]]  # asked once for the environment record
    assert [c[0] for c in calls] == ["profile", "export"]
    assert calls[0][:7] == ["profile", "-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none",
                            "--force-overwrite=true", "-o"]
    assert calls[0][8:] == child_argv(wl, out / "measurement.json", ["3"], threads=None, duration_s=None,
                                      steps=2, profiled="nsys")
    cap = res.capture
    assert cap["backend"] == "nsys" and cap["target_kind"] == "workload"
    # the child really ran: 3 threads (from the workload's argv) x 2 steps
    assert cap["measurement"]["calls"] == 6 and cap["measurement"]["profiled"] == "nsys"
    assert cap["baseline"]["measurement"]["calls"] == 6 and cap["baseline"]["measurement"]["profiled"] is None
    # the stand-in exported the demo trace (made by examples/wdl_serving.py), which has a
    # 'measure' range: only kernels overlapping it are analyzed
    assert cap["window"] == "measure"
    sqlite = out / "trace.sqlite"
    assert res.advise.trace_info["counts"]["kernels"] == _kernel_count(sqlite, "measure")
    assert _kernel_count(sqlite, "measure") < _kernel_count(sqlite)
    saved = json.loads((out / "profile.json").read_text())
    assert saved["capture"]["backend"] == "nsys" and saved["schema"] == 1
    assert {f["id"] for f in saved["findings"]} == {f.id for f in res.advise.findings}
    assert (out / "nvml.json").is_file()


def test_profile_script_through_stand_in_nsys_and_failure(tmp_path, fake_nsys):
    ok = write(tmp_path / "ok.py", "import sys\nprint('hello from', sys.argv[1:])\n")
    res = profile(ok, ["--flag"], out_dir=tmp_path / "r1")
    assert res.capture["target_kind"] == "script" and res.capture["measurement"] is None
    assert "hello from ['--flag']" in (tmp_path / "r1" / "program.log").read_text()
    bad = write(tmp_path / "bad.py", "raise SystemExit('model weights missing')\n")
    with pytest.raises(WorkloadError, match="exited with status 1 under nsys: model weights missing"):
        profile(bad, out_dir=tmp_path / "r2")


def test_profile_with_a_required_missing_range(tmp_path, fake_nsys):
    ok = write(tmp_path / "ok.py", "pass\n")
    with pytest.raises(BadInputError, match="no NVTX range"):
        profile(ok, out_dir=tmp_path / "r", nvtx="no-such-range-anywhere")


# ------------------------------------------------------------------ the CLI
def _cli():
    from recsys_doctor.cli import _Group, main

    if "profile" in main.commands:
        return main
    from recsys_doctor.cli.profile import profile_cmd

    g = _Group()
    g.add_command(profile_cmd, "profile")
    return g


def test_cli_help():
    res = CliRunner().invoke(_cli(), ["profile", "--help"])
    assert res.exit_code == 0
    for opt in ("--backend", "--out", "--json", "--threads", "--duration", "--steps", "workload()"):
        assert opt in res.output


@pytest.mark.parametrize("argv, needle", [
    (["profile", "{tmp}/model.py"], "model.py: no such file"),
    (["profile", "{tmp}"], "is a directory"),
    (["profile", "{tmp}/script.py", "--threads", "4"], "apply to a workload module"),
    (["profile", "{tmp}/wl.py", "--threads", "0"], "'--threads': 0 is not in the range x>=1"),
    (["profile", "{tmp}/wl.py", "--duration", "0"], "'--duration': 0.0 is not in the range x>0"),
    (["profile", "{tmp}/wl.py", "--steps", "x"], "'--steps': 'x' is not a valid integer"),
    (["profile", "{tmp}/wl.py", "--apply", "--top-k", "0"], "'--top-k': 0 is not in the range x>=1"),
    (["profile", "{tmp}/wl.py", "--set", "nonsense"], "NAME=VALUE"),
])
def test_cli_one_line_errors(tmp_path, argv, needle):
    write(tmp_path / "script.py", "print(1)\n")
    write(tmp_path / "wl.py", CPU_WORKLOAD)
    res = CliRunner().invoke(_cli(), [a.format(tmp=tmp_path) for a in argv])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("recsys-doctor: error:") and needle in lines[0]
    assert "Traceback" not in res.output


@pytest.mark.skipif(HAVE_GPU, reason="checks the no-GPU message")
def test_cli_no_gpu_is_one_clear_line(tmp_path):
    write(tmp_path / "wl.py", CPU_WORKLOAD)
    res = CliRunner().invoke(_cli(), ["profile", str(tmp_path / "wl.py"), "--backend", "torch",
                                      "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert res.output.startswith("recsys-doctor: error: no NVIDIA GPU found") and res.output.count("\n") == 1


def test_cli_json_through_stand_in_nsys(tmp_path, fake_nsys):
    wl = write(tmp_path / "wl.py", CPU_WORKLOAD)
    res = CliRunner().invoke(_cli(), ["profile", str(wl), "--json", "--steps", "1", "--no-baseline",
                                      "--out", str(tmp_path / "o"), "--", "2"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["capture"]["backend"] == "nsys" and d["capture"]["measurement"]["calls"] == 2
    assert d["capture"]["baseline"] is None and "findings" in d and "plan" in d
    assert d["capture"]["nvml"]["n"] == 0 or HAVE_GPU


def test_cli_terminal_report_names_the_backend(tmp_path, fake_nsys):
    wl = write(tmp_path / "wl.py", CPU_WORKLOAD)
    res = CliRunner().invoke(_cli(), ["profile", str(wl), "--steps", "1", "--no-baseline",
                                      "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "Nsight Systems" in res.output and "queries/s" in res.output and "Findings" in res.output


def test_nvml_summary_over_a_window():
    r = NvmlSamples(0, 0.05, samples=[
        {"t_s": 0.0, "t_epoch": 10.0, "util_gpu": 0.0, "util_mem": 0.0, "sm_clock_mhz": 300.0, "mem_used_mib": 1.0},
        {"t_s": 1.0, "t_epoch": 11.0, "util_gpu": 40.0, "util_mem": 4.0, "sm_clock_mhz": 1900.0, "mem_used_mib": 9.0},
        {"t_s": 2.0, "t_epoch": 12.0, "util_gpu": 60.0, "util_mem": 6.0, "sm_clock_mhz": 1980.0, "mem_used_mib": 8.0},
        {"t_s": 3.0, "t_epoch": 13.0, "util_gpu": 0.0, "util_mem": 0.0, "sm_clock_mhz": 300.0, "mem_used_mib": 2.0},
    ])
    w = r.summary([10.5, 12.5])
    assert w["n"] == 2 and w["n_total"] == 4
    assert w["util_mean"] == 50.0 and w["util_p50"] == 50.0 and w["mem_used_max_mib"] == 9.0
    assert r.summary()["util_mean"] == 25.0


def test_measure_records_its_window_on_the_unix_clock():
    import time

    t0 = time.time()
    wl = Workload(model=None, inputs=lambda k: (), concurrency=2, steps=3, warmup=0, run=lambda: None)
    m = measure(wl)
    assert len(m.window_epoch) == 2 and t0 <= m.window_epoch[0] <= m.window_epoch[1] <= time.time()
