"""Run a script whose ``with Pool(...) as pool:`` would end in ``terminate()`` (SIGTERM to its
workers) with ``close(); join()`` instead, so that its workers exit on their own: the ground truth
for what Nsight Systems should record of them (``flush_interval.sh``).

    python bench/apply/probe/pool_close.py SCRIPT [ARGS...]
"""
import multiprocessing.pool as mpp
import runpy
import sys


def _exit(self, *exc):
    self.close()
    self.join()


mpp.Pool.__exit__ = _exit
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
