"""Serve a wide&deep model through the stream-group runtime from several client threads.

    python examples/runtime_serve.py            # 8 threads, 4 groups, prints q/s and a check
    python examples/runtime_serve.py --small    # tiny run (used under compute-sanitizer)

Needs an NVIDIA GPU and PyTorch. Every output is checked against single-stream eager
PyTorch on the same inputs; the exit code is 1 if any differs.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from pathlib import Path

import torch

from recsys_doctor.runtime import serve

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wdl_serving import WideDeep  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="tiny model and few queries")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--groups", type=int, default=4)
    args = ap.parse_args()
    n_sparse, vocab, batch, per_thread = (4, 1000, 32, 5) if args.small else (26, 100_000, 256, 200)
    threads = 4 if args.small else args.threads
    hot = 4

    torch.manual_seed(0)
    model = WideDeep(vocab, n_sparse=n_sparse, hidden=256).cuda().eval()

    def query(seed: int):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, 13, generator=g),
                [torch.randint(0, vocab, (batch * hot,), generator=g) for _ in range(n_sparse)],
                torch.arange(0, batch * hot, hot))

    queries = [query(s) for s in range(threads * per_thread)]
    with torch.no_grad():
        refs = [model(d.cuda(), [i.cuda() for i in idx], o.cuda()).cpu() for d, idx, o in queries]

    results: dict[int, torch.Tensor] = {}
    with serve(model, queries[0], groups=2 if args.small else args.groups, merge=True, graphs=True) as served:
        def client(k: int) -> None:
            for j in range(k, len(queries), threads):
                results[j] = served(*queries[j])

        t0 = time.perf_counter()
        ths = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        wall = time.perf_counter() - t0
        stats = served.stats()
    bad = sum(not torch.allclose(results[j], refs[j], rtol=1e-5, atol=1e-6) for j in range(len(queries)))
    print(f"{len(queries)} queries from {threads} threads in {wall:.3f} s ({len(queries) / wall:.0f} q/s); "
          f"groups served {[g['served'] for g in stats['groups']]}; fallbacks {stats['fallbacks'] or 'none'}; "
          f"mismatches {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
