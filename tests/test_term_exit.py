"""Processes a profiled program starts exit through Python when SIGTERM ends them
(recsys_doctor/capture/term_exit.py): each test runs a small program in a subprocess, with and
without the capture's environment, and reads what its workers left (files their ``atexit``
functions write, exit codes). No GPU, no nsys: what nsys needs is that the worker exits as on
``sys.exit``, which an ``atexit`` function's file shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from recsys_doctor.capture.term_exit import ENV_ROOT, capture_env

# a spawn pool of 2 workers (both started before the first task), each registering an atexit
# function that writes a file named by its pid; once they have served a few tasks, each is given a
# long one (MODE "sleep": in Python; "c": one C call that releases the GIL and runs no Python
# handler) and the parent ends the pool with terminate(), as `with Pool() as pool:` does, then
# prints the workers' exit codes
POOL = textwrap.dedent("""
    import atexit, json, multiprocessing as mp, os, sys, time

    def init(folder, ready):
        atexit.register(lambda: open(os.path.join(folder, f"exit-{os.getpid()}"), "w").close())
        ready.wait(timeout=60)

    def task(mode):
        if mode == "sleep":
            time.sleep(60)
        elif mode == "c":
            import hashlib
            hashlib.pbkdf2_hmac("sha256", b"x", b"y", 10**9)  # minutes
        return os.getpid()

    if __name__ == "__main__":
        folder, mode = sys.argv[1], sys.argv[2]
        ctx = mp.get_context("spawn")
        ready = ctx.Barrier(3)
        pool = ctx.Pool(2, initializer=init, initargs=(folder, ready))
        ready.wait(timeout=60)
        pool.map(task, [""] * 8, chunksize=1)
        pool.apply_async(task, (mode,)); pool.apply_async(task, (mode,))
        time.sleep(1.0)
        workers = list(pool._pool)
        t0 = time.perf_counter()
        pool.terminate()
        print(json.dumps({"codes": sorted(p.exitcode for p in workers), "terminate_s": time.perf_counter() - t0}))
""")


def _run(tmp_path: Path, body: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> dict:
    prog = tmp_path / "prog.py"
    prog.write_text(body)
    p = subprocess.run([sys.executable, str(prog), *args], capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k != ENV_ROOT}
    return capture_env({**base, **extra}, tmp_path / "term_exit")


def test_pool_workers_ended_by_terminate_exit_through_python_only_under_the_capture(tmp_path):
    plain, captured = tmp_path / "plain", tmp_path / "captured"
    plain.mkdir()
    captured.mkdir()
    r0 = _run(tmp_path, POOL, str(plain), "sleep", env={k: v for k, v in os.environ.items() if k != ENV_ROOT})
    assert r0["codes"] == [-15, -15]  # killed by the signal: no atexit function ran
    assert list(plain.iterdir()) == []
    r1 = _run(tmp_path, POOL, str(captured), "sleep", env=_env(tmp_path))
    assert r1["codes"] == [143, 143]  # SystemExit(128 + 15) out of time.sleep
    assert len(list(captured.iterdir())) == 2  # each worker's atexit function ran
    assert r1["terminate_s"] < 10  # (the watchdog's grace period): they exited on their own


def test_a_worker_stuck_in_a_c_call_is_killed_after_the_grace_period(tmp_path):
    out = tmp_path / "stuck"
    out.mkdir()
    r = _run(tmp_path, POOL, str(out), "c", env=_env(tmp_path, RECSYS_DOCTOR_TERM_GRACE_S="1"))
    assert r["codes"] == [-9, -9]  # the watchdog's SIGKILL; the pbkdf2 call would take minutes
    assert r["terminate_s"] < 20
    assert list(out.iterdir()) == []


def test_a_sigterm_during_the_workers_own_exit_lets_it_finish(tmp_path):
    # the worker's target has returned and its atexit function runs (1.5 s) when SIGTERM comes
    body = textwrap.dedent("""
        import atexit, json, multiprocessing as mp, os, sys, time

        def slow_exit(folder):
            open(os.path.join(folder, "start"), "w").close()
            time.sleep(1.5)
            open(os.path.join(folder, "done"), "w").close()

        def serve(folder):
            atexit.register(slow_exit, folder)

        if __name__ == "__main__":
            folder = sys.argv[1]
            p = mp.get_context("spawn").Process(target=serve, args=(folder,))
            p.start()
            while not os.path.exists(os.path.join(folder, "start")):
                time.sleep(0.01)
            p.terminate(); p.join(30)
            print(json.dumps({"code": p.exitcode, "done": os.path.exists(os.path.join(folder, "done"))}))
    """)
    plain, captured = tmp_path / "plain", tmp_path / "captured"
    plain.mkdir()
    captured.mkdir()
    env0 = {k: v for k, v in os.environ.items() if k != ENV_ROOT}
    assert _run(tmp_path, body, str(plain), env=env0) == {"code": -15, "done": False}
    assert _run(tmp_path, body, str(captured), env=_env(tmp_path)) == {"code": 0, "done": True}


def test_the_programs_first_process_and_forked_children_keep_the_default(tmp_path):
    body = textwrap.dedent("""
        import json, os, signal, sys
        first = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        root = os.environ["RECSYS_DOCTOR_CAPTURE_ROOT"] == str(os.getpid())
        if sys.argv[1] == "child":
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(w, b"1" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else b"0")
                os._exit(0)
            os.waitpid(pid, 0)
            print(json.dumps({"default": first, "root": root, "forked_default": os.read(r, 1) == b"1"}))
        else:
            import subprocess
            p = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True)
            print(json.dumps({"default": first, "root": root, "child": json.loads(p.stdout)}))
    """)
    r = _run(tmp_path, body, "parent", env=_env(tmp_path))
    assert r["default"] is True and r["root"] is True
    assert r["child"] == {"default": False, "root": False, "forked_default": True}


def test_a_handler_the_program_sets_itself_is_left_alone(tmp_path):
    # the worker replaces the handler with its own slow one: the watchdog must not kill it
    body = textwrap.dedent("""
        import json, multiprocessing as mp, os, signal, sys, time

        def slow(signum, frame):
            time.sleep(2.5)
            os._exit(7)

        def serve(q):
            signal.signal(signal.SIGTERM, slow)
            q.put(os.getpid())
            time.sleep(60)

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=serve, args=(q,))
            p.start(); q.get(timeout=60)
            p.terminate(); p.join(30)
            print(json.dumps({"code": p.exitcode}))
    """)
    assert _run(tmp_path, body, env=_env(tmp_path, RECSYS_DOCTOR_TERM_GRACE_S="1")) == {"code": 7}


def test_the_sitecustomize_it_shadows_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = '1'\n")
    body = "import json, os\nprint(json.dumps({'ran': os.environ.get('SHADOWED_RAN')}))\n"
    assert _run(tmp_path, body, env=_env(tmp_path, PYTHONPATH=str(other))) == {"ran": "1"}


def test_capture_env_starts_a_new_root_and_puts_its_folder_first(tmp_path):
    env = capture_env({ENV_ROOT: "123", "PYTHONPATH": "/x"}, tmp_path / "t")
    assert ENV_ROOT not in env
    assert env["PYTHONPATH"].split(os.pathsep) == [str((tmp_path / "t").resolve()), "/x"]
    assert (tmp_path / "t" / "sitecustomize.py").is_file()
