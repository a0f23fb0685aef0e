"""The CUDA batch worker of one stream group. :meth:`CudaWorker.start` copies the ``n``
queries of a batch into the group's pinned staging (one ``_foreach_copy_``, by the driver
thread), then to the device (ONE host-to-device copy), runs ONE CUDA graph captured for
bucket ``k`` (the smallest bucket >= ``n``; the device blocks past ``n`` hold earlier,
valid queries): regroup on the GPU, forward, outputs into one device buffer, copied back
in ONE device-to-host copy, and records an event; :meth:`CudaWorker.finish` waits on that
event (the wait releases the GIL). The host outputs are one fresh NumPy copy per output
and batch, viewed per request with ``torch.from_numpy``. The driver calls keep the GIL
(:mod:`._fastpath`): a batch gives it up twice, in the staging copy and in the wait.

Graphs are captured largest bucket first into one private pool per group (the group's
graphs run one after another on its stream, so they share it), each forward's
independent branches spread over its group's branch streams (:mod:`._branches`;
where that capture fails, the bucket is captured again on one stream). Out of memory while
capturing a bucket drops that bucket and every larger one, with a warning; any other
capture failure runs that bucket eagerly on the group's stream (the reason is kept). The
graph object of a failed capture stays alive with the served model
(:func:`~._serve_entry.graph_of`, as for the query-signature captures).
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

from ..errors import first_line
from ._batched import BatchSetup, bucket_table, stage_batch
from ._branches import branched, capture_branched
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
        self.block = p.block
        self.stream = sm._ext[g.index]
        # every device block holds a valid query from the start: padded blocks run real inputs
        host = torch.zeros(kmax * p.block, dtype=torch.uint8)
        torch._foreach_copy_(p.slot_views(host, kmax), list(setup.tensors) * kmax)
        self.dev_in = host.to(sm.device)
        self.dev_in_ptr = self.dev_in.data_ptr()
        #: the group's pinned staging: each batch's tensors are copied in (one
        #: ``_foreach_copy_``), then to the device with one host-to-device copy
        self.host_in = host.pin_memory()
        self.host_in_ptr = self.host_in.data_ptr()
        self.m = len(p.leaves)
        self.in_views = p.slot_views(self.host_in, kmax)
        self.shifts = torch.arange(kmax, device=sm.device) * p.shift
        self._event = g._new_event()
        self.event_i = int(self._event.handle)
        self._out_layouts(buckets)
        self.graphs: dict[int, Any] = {}
        self.execs: dict[int, int] = {}
        self.eager: dict[int, str] = {}
        #: buckets captured on one stream because the branch-parallel capture failed: why
        self.branch_fallbacks: dict[int, str] = {}
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
        #: per bucket, each output's pinned rows as a NumPy ``[k, rows, ...]`` array: a
        #: batch's outputs are one NumPy copy each and a ``torch.from_numpy`` per request,
        #: all without releasing the GIL (a torch op releases it, and getting it back
        #: among many client threads is what costs, issue 24)
        self.host_k = {k: [v.view(k, r, *rest) for v, (_, rest, r, _) in
                           zip(self._out_views(self.pinned_out, k), self.out_meta)] for k in buckets}
        try:
            self.host_np: dict[int, list[Any]] | None = {k: [v.numpy() for v in vs] for k, vs in self.host_k.items()}
        except (TypeError, RuntimeError):  # a dtype NumPy lacks (bfloat16): torch ops instead
            self.host_np = None

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
        from ._serve_entry import capturing

        torch = self.torch
        for k in sorted(self.buckets, reverse=True):
            with capturing(), torch.no_grad():
                try:
                    graph = self._capture_branched(k)
                    self.graphs[k] = graph
                    self.execs[k] = int(graph.raw_cuda_graph_exec())
                except torch.OutOfMemoryError as e:
                    self._drop(k, first_line(e))
                except Exception as e:  # noqa: BLE001 - the bucket runs eagerly, reason kept
                    torch.cuda.synchronize(self.sm.device)
                    self.eager[k] = f"CUDA graph capture failed, running eagerly: {first_line(e)}"
        if not self.buckets:
            raise torch.OutOfMemoryError("out of memory capturing every batch size, even 1")

    def _capture_branched(self, k: int) -> Any:
        """Bucket ``k``'s graph, its forward's branches on its group's branch
        streams (:mod:`._branches`); where that capture fails, on the group's stream alone
        (the reason kept in ``branch_fallbacks``)."""
        def failed(e: BaseException) -> bool:
            self.torch.cuda.synchronize(self.sm.device)
            self.branch_fallbacks[k] = first_line(e)
            return True

        return capture_branched(self.torch, self.sm._sides[self.g.index], lambda side: self._capture_on(k, side), failed)

    def _capture_on(self, k: int, side: list[Any]) -> Any:
        from ._serve_entry import graph_of

        torch = self.torch
        with torch.cuda.stream(self.stream):
            self._forward(k)
            with branched(side):  # the branch streams' lazy inits (cuBLAS workspaces) outside the capture
                self._forward(k)
        self.stream.synchronize()

        def bucket() -> None:
            with branched(side):
                self._forward(k)

        return graph_of(self.sm, self.pool, self.stream, bucket)

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
    def start(self, reqs: Sequence[Any]) -> list[Any]:
        """Stage the batch (:func:`~._batched.stage_batch`) and launch it: one H2D copy, the
        bucket's graph, one D2H copy, an event record; :meth:`finish` waits. Returns the
        requests that run."""
        reqs = stage_batch(self.torch, self.in_views, self.m, reqs)
        n = len(reqs)
        if not n:
            return reqs
        sm, fp, s = self.sm, self.sm._fp, self.g.compute_i
        ensure_context(sm.manager.context)
        fp.htod(self.dev_in_ptr, self.host_in_ptr, n * self.block, s)
        k = self.table[n]
        ex = self.execs.get(k)
        if ex:
            fp.launch(ex, s)
        else:
            with self.torch.cuda.stream(self.stream), self.torch.no_grad():
                self._forward(k)
        fp.dtoh(self.pinned_out.data_ptr(), self.dev_out.data_ptr(), self.out_lay[k].nbytes, s)
        fp.record(self.event_i, s)
        return reqs

    def finish(self, reqs: Sequence[Any]) -> list[Any]:
        """Wait for the batch :meth:`start` launched; one output per request."""
        n = len(reqs)
        k = self.table[n]
        self.sm._fp.wait(self.event_i)
        from_numpy = self.torch.from_numpy
        setup = self.setup
        if self.host_np is None:
            tparts = [v.clone().unbind(0) for v in self.host_k[k]]
            return [setup.unflatten([p[j] for p in tparts]) for j in range(n)]
        parts = [a.copy() for a in self.host_np[k]]
        if len(parts) == 1 and setup.out_spec.is_leaf():
            one = parts[0]
            return [from_numpy(one[j]) for j in range(n)]
        return [setup.unflatten([from_numpy(p[j]) for p in parts]) for j in range(n)]

    def gpu_times_us(self, reps: int = 20) -> dict[int, float]:
        """GPU time of one batch per bucket (H2D, graph, D2H; alone on the device), in us.
        A first round is thrown away: measured first thing in a process (the committed
        sweep) every bucket came out at 4.3-4.9 ms on the H100, where ``bench/serving/batch_diag.py``
        in the same call, after timed copies, measured 241-786 us; the cause is not known."""
        torch = self.torch
        out = {}
        for k in (*self.buckets[:1], *self.buckets):  # the first round warms up (its time dropped)
            fp, s = self.sm._fp, self.g.compute_i
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(self.sm.device)
            with torch.cuda.stream(self.stream):
                start.record()
                for _ in range(reps):
                    fp.htod(self.dev_in_ptr, self.host_in_ptr, k * self.block, s)
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
