"""Which operators of ``runtime/_serve_entry._ALWAYS_SYNC`` wait for the GPU on this machine's
PyTorch? Each is run on CUDA tensors (1) under PyTorch's sync debug mode "error" and (2) inside
a CUDA graph capture (a synchronization fails the capture). Prints one JSON line per operator."""

from __future__ import annotations

import json

import torch


def cases():
    d = "cuda"
    x = torch.arange(8.0, device=d)
    m = x > 3
    yield "_local_scalar_dense", lambda: x[0].item()
    yield "nonzero", lambda: x.nonzero()
    yield "masked_select", lambda: x.masked_select(m)
    yield "_unique2", lambda: torch.unique(x, return_inverse=True)
    yield "unique_dim", lambda: torch.unique(x.view(2, 4), dim=0)
    yield "unique_consecutive", lambda: torch.unique_consecutive(x)
    yield "equal", lambda: torch.equal(x, x)
    yield "is_nonzero", lambda: bool(x[:1] > 0)
    yield "masked_scatter_", lambda: x.clone().masked_scatter_(m, torch.ones(8, device=d))
    yield "masked_fill_ (control: no sync)", lambda: x.clone().masked_fill_(m, 1.0)


def main() -> None:
    for name, fn in cases():
        fn()  # warm up (lazy init outside the checks)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
            debug = "no sync"
        except RuntimeError as e:
            debug = "syncs: " + str(e).splitlines()[0][:120]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(s):
                with torch.cuda.graph(g, stream=s):
                    fn()
            cap = "captured"
        except Exception as e:  # noqa: BLE001
            cap = "capture failed: " + str(e).splitlines()[0][:120]
        torch.cuda.synchronize()
        print(json.dumps({"op": name, "sync_debug_mode": debug, "graph_capture": cap}), flush=True)


if __name__ == "__main__":
    main()
