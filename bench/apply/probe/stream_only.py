"""Run a serving script with its threads on CUDA side streams and nothing else of ours, to
tell a stream's own cost from the hook's: ``python stream_only.py MODE SCRIPT [ARGS...]``.
MODE: ``legacy`` (as the script is), ``shared`` (one stream for every thread started),
``shared_prio`` (one high-priority stream), ``per_thread`` (a stream per thread)."""

import runpy
import sys
import threading

import torch

mode, script, *args = sys.argv[1:]
sys.argv = [script, *args]
if mode != "legacy":
    shared = {"shared": lambda: torch.cuda.Stream(),
              "shared_prio": lambda: torch.cuda.Stream(priority=-1)}.get(mode, lambda: None)()
    orig = threading.Thread.run

    def run(self):  # the thread's work on the chosen stream
        with torch.cuda.stream(shared if shared is not None else torch.cuda.Stream()):
            orig(self)

    threading.Thread.run = run
runpy.run_path(script, run_name="__main__")
