"""The CUDA batch worker of one stream group: a batch of ``n`` queries is packed into the
group's pinned staging (one ``_foreach_copy_``, which runs without the GIL), copied to the
device in ONE host-to-device copy of the first ``k`` query blocks (``k``: the smallest
bucket >= ``n``; the blocks past ``n`` hold earlier, valid queries), run as ONE CUDA graph
captured for bucket ``k`` (regroup on the GPU, forward, outputs into one device buffer),
copied back in ONE device-to-host copy and waited for on ONE event (the wait releases the
GIL). The host outputs are one fresh copy per batch, split by rows per request.

Graphs are captured largest bucket first into one private pool per group (the group's
graphs run one after another on its stream, so they share it). Out of memory while
capturing a bucket drops that bucket and every larger one, with a warning; any other
capture failure runs that bucket eagerly on the group's stream (the reason is kept).
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

from ..errors import first_line
from ._batched import BatchSetup, bucket_table
from ._cuda import ensure_context
from ._policy import out_flatten, pack_layout

__all__ = ["CudaWorker"]


class CudaWorker:
    """Batches of one stream group ``g`` of served model ``sm`` (see the module docstring).
    ``buckets``: sizes to capture, ascending; :attr:`buckets` keeps the usable ones."""

    def __init__(self, sm: Any, g: Any, setup: BatchSetup, buckets: Sequence[int]) -> None:
        torch = sm.torch
        self.torch, self.sm, self.g, self.setup = torch, sm, g, setup
        p = setup.plan
        self.max_k = kmax = max(buckets)
        self.m = len(p.leaves)
        self.stream = sm._ext[g.index]
        self.pinned_in = torch.empty(kmax * p.block, dtype=torch.uint8, pin_memory=True)
        self.dev_in = torch.empty(kmax * p.block, dtype=torch.uint8, device=sm.device)
        self.views = p.slot_views(self.pinned_in, kmax)
        # every block holds a valid query from the start: padded blocks run real inputs
        for j in range(kmax):
            torch._foreach_copy_(self.views[j * self.m:(j + 1) * self.m], setup.tensors)
        self.dev_in.copy_(self.pinned_in)
        self.shifts = torch.arange(kmax, device=sm.device) * p.shift
        self._event = g._new_event()
        self.event_i = int(self._event.handle)
        self._out_layouts(buckets)
        self.graphs: dict[int, Any] = {}
        self.execs: dict[int, int] = {}
        self.eager: dict[int, str] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.buckets = tuple(buckets)
        torch.cuda.synchronize(sm.device)
        if sm.config.cuda_graphs:
            self._capture_all()
        else:
            self.eager = {k: "CUDA graphs disabled" for k in self.buckets}
        self.table = bucket_table(self.buckets)

    # -- set-up ----------------------------------------------------------------------
    def _out_layouts(self, buckets: Sequence[int]) -> None:
        """Per bucket: the outputs' byte offsets in the output buffers and their shapes."""
        torch = self.torch
        with torch.no_grad():
            outs, _ = out_flatten(self.setup.model(*self.setup.rebuild([t.to(self.sm.device) for t in self.setup.tensors])))
        self.out_meta = [(o.dtype, tuple(o.shape[1:]), r, o.element_size()) for o, r in zip(outs, self.setup.out_rows)]
        self.out_lay: dict[int, Any] = {}
        for k in buckets:
            self.out_lay[k] = pack_layout([(str(dt), (k * r, *rest), item) for dt, rest, r, item in self.out_meta])
        nb = max(lay.nbytes for lay in self.out_lay.values())
        self.dev_out = torch.empty(nb, dtype=torch.uint8, device=self.sm.device)
        self.pinned_out = torch.empty(nb, dtype=torch.uint8, pin_memory=True)

    def _out_views(self, buf: Any, k: int) -> list[Any]:
        lay = self.out_lay[k]
        return [buf[off:off + nb].view(dt).view(k * r, *rest)
                for (dt, rest, r, _), off, nb in zip(self.out_meta, lay.offsets, lay.nbytes_each)]

    def _forward(self, k: int) -> None:
        """Regroup the first ``k`` blocks, run the model, outputs into the device buffer."""
        s = self.setup
        outs, _ = out_flatten(s.model(*s.rebuild(s.plan.regroup(self.dev_in, k, self.shifts))))
        for dv, o in zip(self._out_views(self.dev_out, k), outs):
            if tuple(o.shape) != tuple(dv.shape):
                raise RuntimeError(f"the model's output shape {list(o.shape)} is not {list(dv.shape)} for {k} queries")
            dv.copy_(o)

    def _capture_all(self) -> None:
        from ._serve_entry import _CAPTURE_LOCK

        torch = self.torch
        for k in sorted(self.buckets, reverse=True):
            with _CAPTURE_LOCK, torch.no_grad():
                try:
                    with torch.cuda.stream(self.stream):
                        self._forward(k)
                        self._forward(k)
                    self.stream.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
                        self._forward(k)
                    self.graphs[k] = graph
                    self.execs[k] = int(graph.raw_cuda_graph_exec())
                except torch.OutOfMemoryError as e:
                    self._drop(k, first_line(e))
                except Exception as e:  # noqa: BLE001 - the bucket runs eagerly, reason kept
                    torch.cuda.synchronize(self.sm.device)
                    self.eager[k] = f"CUDA graph capture failed, running eagerly: {first_line(e)}"
        if not self.buckets:
            raise torch.OutOfMemoryError("out of memory capturing every batch size, even 1")

    def _drop(self, k: int, why: str) -> None:
        torch = self.torch
        try:
            torch.cuda.synchronize(self.sm.device)
        except Exception:  # noqa: BLE001 - the capture's error is what counts
            pass
        bigger = [b for b in self.buckets if b >= k]
        for b in bigger:
            self.graphs.pop(b, None)
            self.execs.pop(b, None)
        self.buckets = tuple(b for b in self.buckets if b < k)
        torch.cuda.empty_cache()
        warnings.warn(f"recsys-doctor serve: out of memory capturing the batch of {k} on group {self.g.index} "
                      f"({why}); batches of up to {max(self.buckets, default=0)} run instead", RuntimeWarning,
                      stacklevel=2)

    # -- the hot path ----------------------------------------------------------------
    def __call__(self, reqs: Sequence[Any]) -> list[Any]:
        torch = self.torch
        n = len(reqs)
        k = self.table[n]
        src = [t for r in reqs for t in r.leaves]
        torch._foreach_copy_(self.views[:n * self.m], src)
        sm, fp, s = self.sm, self.sm._fp, self.g.compute_i
        ensure_context(sm.manager.context)
        fp.htod(self.dev_in.data_ptr(), self.pinned_in.data_ptr(), k * self.setup.plan.block, s)
        ex = self.execs.get(k)
        if ex:
            fp.launch(ex, s)
        else:
            with torch.cuda.stream(self.stream), torch.no_grad():
                self._forward(k)
        nb = self.out_lay[k].nbytes
        fp.dtoh(self.pinned_out.data_ptr(), self.dev_out.data_ptr(), nb, s)
        fp.record(self.event_i, s)
        fp.wait(self.event_i)
        host = self.pinned_out[:nb].clone()
        return self.setup.split(self._out_views(host, k), n)

    def gpu_times_us(self, reps: int = 20) -> dict[int, float]:
        """GPU time of one batch per bucket (H2D, graph, D2H; alone on the device), in us."""
        torch = self.torch
        out = {}
        for k in self.buckets:
            fp, s = self.sm._fp, self.g.compute_i
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(self.sm.device)
            with torch.cuda.stream(self.stream):
                start.record()
                for _ in range(reps):
                    fp.htod(self.dev_in.data_ptr(), self.pinned_in.data_ptr(), k * self.setup.plan.block, s)
                    if self.execs.get(k):
                        fp.launch(self.execs[k], s)
                    else:
                        with torch.no_grad():
                            self._forward(k)
                    fp.dtoh(self.pinned_out.data_ptr(), self.dev_out.data_ptr(), self.out_lay[k].nbytes, s)
                end.record()
            end.synchronize()
            out[k] = round(start.elapsed_time(end) * 1e3 / reps, 1)
        return out

    def close(self) -> None:
        self.graphs.clear()
        self.execs.clear()
        if self._event is not None:
            try:
                self._event.close()
            finally:
                self._event = None
