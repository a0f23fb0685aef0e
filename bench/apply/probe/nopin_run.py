"""Run a script with every DataLoader's pin_memory forced off: ``python nopin_run.py SCRIPT [ARGS...]``
(what gil-handoffs asks to measure where the DataLoader's pin-memory thread waits for the GIL)."""

import runpy
import sys

import torch.utils.data as tud

_Orig = tud.DataLoader


class DataLoader(_Orig):  # type: ignore[misc,valid-type]
    def __init__(self, *args, **kwargs):
        kwargs["pin_memory"] = False
        super().__init__(*args, **kwargs)


tud.DataLoader = DataLoader
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
