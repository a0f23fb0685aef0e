"""PROTOTYPE (issue 24, an experiment): wire ``_cdriver.Driver`` (the batcher with its
driver in C, see ``_cdriver.c``) onto the stream groups, graphs and buffers that a served
model's batching set-up made (``serve(..., batching=True)``; its own Python driver is
left idle). ``make(served) -> call(args) -> output tensor``. Build on the GPU machine:
``bash bench/serving/cdriver/build.sh``."""

from __future__ import annotations

import math
import sys
from pathlib import Path


def make(served, nslots: int = 512):
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _cdriver

    workers = served._bworkers
    w0 = workers[0]
    plan = w0.setup.plan
    from recsys_doctor.runtime._batchspec import _nbytes

    spec = [(lf.dtype, _nbytes(lf), lf.offset) for lf in plan.leaves]
    rows = [r * math.prod(rest) * item for _dt, rest, r, item in w0.out_meta]
    groups = []
    for w in workers:
        if w.eager or set(w.execs) != set(w.buckets):
            raise SystemExit(f"proto_cdriver needs every bucket graphed: {w.eager}")
        groups.append((int(w.g.compute_i), int(w.dev_in_ptr), int(w.pinned_out.data_ptr()),
                       int(w.dev_out.data_ptr()), int(w.event_i),
                       {k: (int(w.execs[k]), int(w.out_lay[k].nbytes), tuple(int(o) for o in w.out_lay[k].offsets))
                        for k in w.buckets}))
    slots = torch.empty(nslots * plan.block, dtype=torch.uint8, pin_memory=True)
    ctx = served.manager.context
    d = _cdriver.Driver(int(ctx), groups, spec, plan.block, slots.data_ptr(), nslots, list(w0.table), rows)
    (dt, rest, r, _item), = w0.out_meta  # one output leaf (the wide&deep model's)
    frombuffer = torch.frombuffer
    shape = (r, *rest)

    def call(args):
        dense, idx, offs = args
        return frombuffer(d.call([dense, *idx, offs]), dtype=dt).view(shape)

    call.keep = (d, slots)  # type: ignore[attr-defined]
    call.stats = d.stats  # type: ignore[attr-defined]
    return call
