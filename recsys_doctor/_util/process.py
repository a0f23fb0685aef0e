"""numpy without the BLAS threads it never uses, for the CLI's trace-reading commands
(``advise``, ``check``, ``compare``).

numpy's OpenBLAS starts one server thread per CPU when numpy is imported, and they spin
for a while before they sleep. These commands call no BLAS routine, and on a 2-CPU
machine those threads take CPU time from the loader's and the analysis's own work: 0.2 to
0.4 s of a 10-million-row export's 5-6 s (``bench/scale/scale_trace.py``). The library's own
functions leave the setting alone.
"""

from __future__ import annotations

import os
import sys

__all__ = ["import_numpy_quietly"]

_VARS = ("OPENBLAS_NUM_THREADS",)


def import_numpy_quietly() -> None:
    """Import numpy with one OpenBLAS thread, unless numpy is imported already or the user
    set the thread count. The environment is restored at once, so the programs this process
    starts keep their own BLAS threads."""
    if "numpy" in sys.modules or any(v in os.environ for v in _VARS):
        return
    for v in _VARS:
        os.environ[v] = "1"
    try:
        import numpy  # noqa: F401
    except ImportError:  # pragma: no cover - a dependency
        pass
    finally:
        for v in _VARS:
            os.environ.pop(v, None)
