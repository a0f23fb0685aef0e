"""Running test clients on threads (the GPU tests hammer the runtime from many at once)."""

from __future__ import annotations

import threading
from typing import Callable


def run_threads(worker: Callable[[int], object], n: int, timeout_s: float | None = None) -> list[BaseException]:
    """Run ``worker(k)`` for ``k`` in ``range(n)``, each on its own thread, all at once;
    wait for every one (at most ``timeout_s`` each: then fail, naming the hang) and return
    what they raised (empty when none did)."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            worker(k)
        except BaseException as e:  # noqa: BLE001 - returned to the test, which asserts on it
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "a client thread hangs"
    return errors
