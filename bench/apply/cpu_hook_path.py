"""The script hook's own Python per query in its steady state - a thread-graph replay - measured on
the CPU, where no GPU is lent: ``python bench/apply/cpu_hook_path.py [--inputs 28] [--queries 20000]
[--profile]``.

A query as ``examples/plain_serving_script.py`` makes it: ``x.to("cuda", non_blocking=True)`` of each
of ``--inputs`` pinned tensors, then one model call; with ``--pageable`` as ``examples/scripts/
dlrm_numpy_serve.py`` does, ``torch.from_numpy(a).cuda()`` of numpy arrays (their bytes written into
the thread's pinned slots, the slots being the thread graph's sources). In the hook's steady state
each copy hands out a view of the thread's device buffer and the model call replays the thread's
graph, which makes the copies and runs the model; what is left on the host is the hook's Python (the
patched ``Tensor.to`` and ``nn.Module.__call__``, its checks and counts) around one replay, whose
output is lent to the script (:mod:`.lentout`: checked free before the replay, no clone). Here the
thread graph is built by hand (CPU tensors stand in for the pinned sources and the device buffers;
the graph's ``replay`` does nothing), so every line of the hook's path runs as on the GPU but for the
CUDA calls themselves. Printed: microseconds a query for that path, and for the least a hand-written
CUDA-graph server does on the host (the replay; it reads the scores from the graph's own copy in
pinned memory, ``bench/apply/handwritten/``), their difference being the hook's cost;
``--profile``: the hook's functions by own time.

Not a GPU measurement: a host's speed differs, and on the GPU each replay is a CUDA call
(bench/apply/results/hostprof_h100 has py-spy's view of the same path there)."""

from __future__ import annotations

import argparse
import time

import torch


class _Graph:
    """A captured graph's stand-in: replaying it costs nothing."""

    def replay(self) -> None:
        pass


class _Event:
    """A CUDA event's stand-in: always complete."""

    def record(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _Stream:
    device_index = None  # (no device: the module's, None on the CPU, is never "another GPU")
    device = torch.device("cuda", 0)
    cuda_stream = 7


class Model(torch.nn.Module):
    def forward(self, dense, idx, offs):  # never run: the replay stands for it
        raise AssertionError("the thread graph replays this call")


def setup(n_inputs: int, pageable_: bool = False):
    from recsys_doctor.applying import _autoapply as hook
    from recsys_doctor.applying._autoapply import interception, pageable
    from recsys_doctor.applying._autoapply._common import _state, _tls
    from recsys_doctor.applying._autoapply.argtree import skeleton
    from recsys_doctor.applying._autoapply.groups import _Gate, _Group
    from recsys_doctor.applying._autoapply.lentout import lend
    from recsys_doctor.applying._autoapply.pageable_fast import Learned
    from recsys_doctor.applying._autoapply.staging import _ThreadCopies, _ThreadGraph

    pageable_copies = pageable_  # (the module's name is taken)

    hook.activate({"runtime": {"groups": 1, "cuda_graphs": True}})  # (nn.Module.__call__ patched now)
    interception._patch_thread_copies(torch)  # Tensor.to / .cuda, as at the first placed thread
    for k, v in {"gate": _Gate(), "thread_replays": 0, "materialized": 0}.items():
        _state.setdefault(k, v)
    model = Model().eval()
    with torch.inference_mode():  # (the graph's output, captured inside the queries' inference mode)
        out0 = torch.randn(256)
    src = [torch.randn(256, 13)] + [torch.randint(0, 1000, (256,)) for _ in range(n_inputs - 2)] + \
          [torch.arange(256)]
    tin = [s.clone() for s in src]  # the thread's device buffers
    args = (tin[0], tin[1:-1], tin[-1])
    orig_to = _state["orig_tensor_methods"]["to"]
    move = pageable.Move(torch.device("cuda", 0), None, True, False, None)
    here = f"{__file__}:0"
    if pageable_copies:  # the sources are the thread's pinned slots; the script's arrays are copied into them
        tg = _ThreadGraph(model, _Graph(), src, tin, skeleton((args, {}), torch.Tensor), out0, 0)
        orig_cuda = _state["orig_tensor_methods"]["cuda"]
        blocking = pageable.Move(torch.device("cuda", 0), None, False, False, None)
        raw = pageable.raw_call(torch, orig_cuda, (), {}, blocking)
        tg.learned = [Learned(raw, t.dtype, t.shape, t.numel() * t.element_size(), t, t.data_ptr(), i, blocking.device,
                              _Stream.cuda_stream) for i, t in enumerate(src)]
        _state["stream_now"] = lambda index: _Stream.cuda_stream
        if not hasattr(torch._C, "_cuda_getDevice"):  # (.cuda() names no device: the current one, asked)
            torch._C._cuda_getDevice = lambda: 0
        _state.setdefault("pageable_fast", 0)
    else:
        tg = _ThreadGraph(model, _Graph(), src, tin, skeleton((args, {}), torch.Tensor), out0, 0,
                          [move] * len(src), [here] * len(src))
        tg.raw = [pageable.raw_call(torch, orig_to, ("cuda:0",), {"non_blocking": True}, move)] * len(src)
    tg.lent = lend(torch, tg.static_out)  # (its output lent, as a captured thread graph's is)
    _state.setdefault("outputs_lent", 0)
    g = _Group(0, _Stream())
    _tls.group, _tls.depth = g, 0
    _tls.copies = st = _ThreadCopies(g.stream)
    st.tg = tg
    st.slot_event = _Event()  # (recorded after each model call that read the slots)
    _tls.calls, _tls.handles, _tls.called = 10**6, _state.get("activation"), True
    return model, src, tg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=28, help="pinned tensors copied a query (2 or more)")
    ap.add_argument("--queries", type=int, default=20000)
    ap.add_argument("--pageable", action="store_true",
                    help="numpy arrays copied by torch.from_numpy(a).cuda(), as dlrm_numpy_serve.py does")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, src, tg = setup(max(2, a.inputs), a.pageable)
    arrays = [t.numpy().copy() for t in src]

    def query():  # the script's query, as plain_serving_script.py makes it
        dense, *idx, offs = src
        with torch.inference_mode():
            return model(dense.to("cuda:0", non_blocking=True), [t.to("cuda:0", non_blocking=True) for t in idx],
                         offs.to("cuda:0", non_blocking=True))

    def query_pageable():  # as dlrm_numpy_serve.py makes it, from numpy arrays
        dense, *idx, offs = arrays
        with torch.inference_mode():
            return model(torch.from_numpy(dense).cuda(), [torch.from_numpy(t).cuda() for t in idx],
                         torch.from_numpy(offs).cuda())

    if a.pageable:
        query = query_pageable  # noqa: F811

    def least():  # a hand-written graph server's host work a query for the model: the replay
        tg.graph.replay()
        return tg.static_out

    from recsys_doctor.applying._autoapply._common import _state
    before = _state["thread_replays"]
    query()
    assert _state["thread_replays"] == before + 1, "the query did not replay the thread graph"

    def per_query(f, n):
        t = time.perf_counter()
        for _ in range(n):
            f()
        return (time.perf_counter() - t) / n * 1e6

    rounds = [(per_query(query, a.queries // 5), per_query(least, a.queries // 5)) for _ in range(5)]
    hooked, hand = min(r[0] for r in rounds), min(r[1] for r in rounds)
    print(f"{a.inputs} inputs: the hook's path {hooked:.1f} us a query, a hand-written server's {hand:.1f} us, "
          f"the hook's cost {hooked - hand:.1f} us ({(hooked - hand) / a.inputs:.2f} us an input); "
          f"outputs lent {_state['outputs_lent']} of {_state['thread_replays'] - before} replays")
    if a.profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        per_query(query, a.queries // 5)
        pr.disable()
        st = pstats.Stats(pr)
        n = a.queries // 5
        rows = sorted(((v[2], k) for k, v in st.stats.items()), reverse=True)[:25]  # type: ignore[attr-defined]
        for t, k in rows:
            calls = st.stats[k][1] / n  # type: ignore[attr-defined]
            print(f"{t / n * 1e6:8.2f} us  {calls:5.1f}x  {k[0].rsplit('/', 1)[-1]}:{k[1]} {k[2]}")


if __name__ == "__main__":
    main()
