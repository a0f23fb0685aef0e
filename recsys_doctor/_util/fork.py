"""A second process for CPU-bound work: the Kineto loader decodes half of a large events
array in one, and ``advise`` runs some of the analyzers in one.

Both use :func:`os.fork`: the child starts with this process's memory (the loaded trace,
the imported modules) at no copying cost, does its share, sends the results back pickled
through a pipe and leaves with :func:`os._exit` (no exit handler of the parent runs twice).
Only where that is cheap and safe (:func:`second_cpu`), and anything the child fails to
deliver is done again here, so the results never depend on the child.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import select
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .progress import pause_live_displays

__all__ = ["second_cpu", "fork", "fork_with_queue", "serve_queue", "load_results", "run_in_two",
           "read_all", "reap", "child_timeout", "CHILD_TIMEOUT_S"]

#: seconds a child may stay silent, once this process waits for its results, before it is
#: taken as hung: it is killed, a one-line warning says so and its share is done here. By
#: then it holds at most one task (an analyzer, a chunk of events: seconds even on the
#: largest traces). The environment variable ``RECSYS_DOCTOR_CHILD_TIMEOUT`` (seconds)
#: overrides it.
CHILD_TIMEOUT_S = 300.0


def second_cpu() -> bool:
    """Whether work may be shared with a forked child: Linux (fork is cheap, and safe for
    what the children here do), at least two CPUs in this process's affinity, and this
    process is not itself a worker of a process pool (``advise DIR`` already runs one rank
    per CPU)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - Linux has it
        cpus = os.cpu_count() or 1
    return cpus >= 2 and multiprocessing.parent_process() is None


def fork() -> int:
    """:func:`os.fork`, with no progress bar's refresh thread running at the fork (each is
    stopped first and restarted after it, here only: see
    :func:`~recsys_doctor._util.progress.pause_live_displays`) and without Python 3.12's warning
    about forking a process with threads (the children here touch no lock another thread
    may hold: they compute, pickle and write to their own pipe). Raises ``OSError`` when
    the system refuses."""
    resume = pause_live_displays()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except BaseException:  # noqa: BLE001 - the bars are restarted, the error re-raised
        resume()
        raise
    if pid:  # the child draws nothing: its copies of the bars stay stopped
        resume()
    return pid


def child_timeout() -> float:
    """:data:`CHILD_TIMEOUT_S`, or ``RECSYS_DOCTOR_CHILD_TIMEOUT`` where that is a positive number."""
    raw = os.environ.get("RECSYS_DOCTOR_CHILD_TIMEOUT", "")
    try:
        value = float(raw)
    except ValueError:
        return CHILD_TIMEOUT_S
    return value if value > 0 else CHILD_TIMEOUT_S


def read_all(fd: int, pid: int, timeout: float | None = None) -> bytes | None:
    """Everything the child ``pid`` writes to the pipe ``fd`` until it closes it; ``fd`` is
    closed. None when the child sends nothing for ``timeout`` seconds (default
    :func:`child_timeout`): it is killed then, and a one-line warning says so on stderr
    (the caller does its share itself)."""
    wait = child_timeout() if timeout is None else timeout
    chunks: list[bytes] = []
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        while True:
            if not poller.poll(wait * 1000):  # (any data, or the writer's close, ends the wait)
                reap(pid, kill=True)
                print(f"recsys-doctor: warning: the helper process {pid} sent nothing for {wait:g} s: "
                      "stopped it, its share runs here (RECSYS_DOCTOR_CHILD_TIMEOUT sets the limit)",
                      file=sys.stderr, flush=True)
                return None
            part = os.read(fd, 1 << 20)
            if not part:
                return b"".join(chunks)
            chunks.append(part)
    finally:
        os.close(fd)


def reap(pid: int, *, kill: bool) -> int | None:
    """Wait for the child ``pid`` (killed first when ``kill``); its exit code, None when it
    cannot be had."""
    with contextlib.suppress(OSError):
        if kill:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
    return None


def fork_with_queue(queue: bytes, child: Callable[[int, int], Any]) -> tuple[int, int, int] | None:
    """Fork a child that shares a work queue with this process: ``queue`` is written to a
    pipe both read from (the kernel hands each read's bytes to one reader only, so each
    takes the next items not yet taken; a read past the end gives b""). The child runs
    ``child(queue_fd, results_fd)``, which must not return (it ends with :func:`os._exit`);
    here ``(pid, queue_fd, results_fd)``, or None when the system refuses the fork.
    ``queue`` must fit the pipe's buffer (64 KiB): it is written before anyone reads."""
    qr, qw = os.pipe()
    os.write(qw, queue)
    os.close(qw)  # the queue is full
    rr, rw = os.pipe()
    try:
        pid = fork()
    except OSError:
        for fd in (qr, rr, rw):
            os.close(fd)
        return None
    if pid == 0:  # the child: never returns, not even when child() raises
        try:
            os.close(rr)
            child(qr, rw)
        finally:
            os._exit(1)  # pragma: no cover - child() leaves by os._exit itself
    os.close(rw)
    return pid, qr, rr


def load_results(payload: bytes) -> dict[int, Any]:
    """A child's pickled ``{index: result}``; empty when it sent nothing or something
    unreadable (a truncated payload: the child died writing it)."""
    try:
        got = pickle.loads(payload) if payload else {}
    except Exception:  # noqa: BLE001 - not what the child meant to send
        return {}
    return got if isinstance(got, dict) else {}


def run_in_two(tasks: Sequence[Callable[[], Any]], on_done: Callable[[int], None] | None = None,
               order: Sequence[int] | None = None) -> list[Any]:
    """``[t() for t in tasks]``, with a forked child taking tasks too: each process claims
    the next task not yet taken (one byte read from a shared pipe, which the kernel hands
    to one reader only), so the two stay busy until the list is done; ``order`` is the
    order in which they are taken (a permutation of the indices; the longest first
    balances the two best). The child sends its results back pickled; a task it could not
    finish, or whose result does not pickle, is run here. Errors are raised as the loop
    would raise them: the first failing task in list order. ``on_done(i)`` is called here
    as each task's result is in.

    Tasks must not depend on one another's side effects (each sees the state at the fork)."""
    n = len(tasks)
    if order is not None and sorted(order) != list(range(n)):
        raise ValueError("order must be a permutation of the task indices")
    if n < 2 or n > 255 or not second_cpu():
        return _in_order(tasks, {}, on_done)
    started = fork_with_queue(bytes(range(n) if order is None else order), lambda qr, rw: _child(tasks, qr, rw))
    if started is None:
        return _in_order(tasks, {}, on_done)
    pid, qr, rr = started
    results: dict[int, Any] = {}
    try:
        while (b := os.read(qr, 1)):
            i = b[0]
            try:
                results[i] = tasks[i]()
            except Exception as e:  # noqa: BLE001 - raised in list order by _in_order
                results[i] = _Failed(e)
                break  # what follows a failure is not needed
            if on_done is not None:
                on_done(i)
        else:
            payload = read_all(rr, pid)
            rr = -1
            if payload is not None:  # (a hung child was killed and reaped)
                reap(pid, kill=False)
            pid = 0
            for i, v in sorted(load_results(payload or b"").items()):
                try:
                    results[i] = pickle.loads(v)
                except Exception:  # noqa: BLE001 - run here instead
                    continue
                if on_done is not None:
                    on_done(i)
    finally:
        os.close(qr)
        if rr >= 0:
            os.close(rr)
        if pid:
            reap(pid, kill=True)
    return _in_order(tasks, results, on_done)


class _Failed:
    def __init__(self, error: Exception) -> None:
        self.error = error


def _in_order(tasks: Sequence[Callable[[], Any]], results: dict[int, Any],
              on_done: Callable[[int], None] | None) -> list[Any]:
    """The results in list order, running here each task that has none yet; the first
    failure in list order is raised."""
    out = []
    for i, t in enumerate(tasks):
        if i not in results:
            results[i] = t()
            if on_done is not None:
                on_done(i)
        r = results[i]
        if isinstance(r, _Failed):
            raise r.error
        out.append(r)
    return out


def serve_queue(take: Callable[[], int | None], run: Callable[[int], Any], results_fd: int) -> None:
    """The loop of a child started by :func:`fork_with_queue`: ``results[i] = run(i)`` for
    each index ``take()`` claims, until none is left, ``run`` raises (that index has no
    result) or returns None (kept: the parent sees it); then ``{index: result}`` is written
    pickled to ``results_fd`` and the child exits (code 0, or 1 when anything else failed).
    Never returns: no exit handler of the parent runs in the child."""
    code = 1
    try:
        done: dict[int, Any] = {}
        while (i := take()) is not None:
            try:
                r = run(i)
            except Exception:  # noqa: BLE001 - the parent runs it again and sees the error
                break  # and the rest of the queue (it reads it to its end)
            done[i] = r
            if r is None:
                break
        with os.fdopen(results_fd, "wb") as f:
            pickle.dump(done, f, protocol=pickle.HIGHEST_PROTOCOL)
        code = 0
    except BaseException:  # noqa: BLE001 - the parent runs what is missing
        code = 1
    finally:
        os._exit(code)


def _child(tasks: Sequence[Callable[[], Any]], qr: int, rw: int) -> None:
    """The forked child of :func:`run_in_two`: claim and run tasks until none is left,
    then send ``{index: pickled result}`` of those that ran and pickled, and exit."""

    def take() -> int | None:
        b = os.read(qr, 1)
        return b[0] if b else None

    serve_queue(take, lambda i: pickle.dumps(tasks[i](), protocol=pickle.HIGHEST_PROTOCOL), rw)
