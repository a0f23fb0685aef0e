"""Train a CTR model with sparse embedding gradients in float16, the way the AMP recipe says.

Written the way many recommender training scripts are: multi-hot categorical fields pooled by
``nn.EmbeddingBag(mode="sum", sparse=True)`` (sparse gradients, ``torch.optim.SparseAdam``)
beside a dense MLP (``AdamW``, ``clip_grad_norm_`` on the unscaled gradients): two optimizers
a step. Mixed precision is float16 ``torch.autocast`` with a ``torch.amp.GradScaler``
(``scale(loss).backward()``, ``unscale_``, ``step`` of each optimizer, ``update``), which skips
the steps whose gradients overflowed and lowers its scale - a data-dependent decision the
scaler takes on the GPU and reads back. A map-style ``Dataset`` makes each sample, a
``collate_fn`` joins each field's ids into values + offsets (every batch's id count differs),
and a ``DataLoader`` (``--workers`` processes, pinned memory, the last batch partial) feeds
an Apex-style prefetcher: the next batch is copied with ``.cuda(non_blocking=True)`` on a
side ``torch.cuda.Stream`` while the current step runs, then the compute stream waits for it
(``wait_stream``, ``record_stream``). The loss is logged every ``--log-every`` steps
(``loss.item()``, ``scaler.get_scale()``).

    python sparse_amp_train.py --epochs 2
    python sparse_amp_train.py --device cpu --samples 1000 --batch 64 --vocab 500 --workers 1

On the CPU the autocast type is bfloat16 and the scaler is off (as the recipe says). The last
line is JSON: script, steps, workers, step_ms, scale (the scaler's last: each skipped
step halved it from 65536) and checksum (every step's loss, position-weighted, plus the sums
of the trained weights: the same for any worker count).
"""

import argparse
import json
import logging
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

N_DENSE, FIELDS, DIM = 13, 8, 32
log = logging.getLogger("train")


class Clicks(Dataset):
    """Sample i: 13 dense features, 1-4 ids in each of 8 fields, a click label (from the ids)."""

    def __init__(self, n: int, vocab: int, seed: int):
        self.n, self.vocab, self.seed = n, vocab, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng([self.seed, i])
        dense = np.log1p(rng.exponential(2.0, N_DENSE)).astype(np.float32)
        ids = [rng.integers(0, self.vocab, int(rng.integers(1, 5))) for _ in range(FIELDS)]
        label = float((sum(int(f[0]) for f in ids) + int(dense[0] * 10)) % 3 == 0)
        return dense, ids, label


def collate(samples):
    dense = torch.from_numpy(np.stack([s[0] for s in samples]))
    values, offsets = [], []
    for f in range(FIELDS):
        per = [s[1][f] for s in samples]
        values.append(torch.from_numpy(np.concatenate(per)))
        offsets.append(torch.from_numpy(np.cumsum([0] + [len(p) for p in per[:-1]])))
    return dense, values, offsets, torch.tensor([s[2] for s in samples], dtype=torch.float32)


class CTR(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(vocab, DIM, mode="sum", sparse=True) for _ in range(FIELDS))
        self.bottom = nn.Sequential(nn.Linear(N_DENSE, 64), nn.ReLU(), nn.Linear(64, DIM))
        self.top = nn.Sequential(nn.Linear((FIELDS + 1) * DIM, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def forward(self, dense, values, offsets):
        pooled = [bag(v, o) for bag, v, o in zip(self.bags, values, offsets)]
        return self.top(torch.cat([self.bottom(dense)] + pooled, dim=1)).squeeze(1)


class Prefetcher:
    """Apex's data_prefetcher: the next batch's copies on a side stream, overlapping the step."""

    def __init__(self, loader, dev):
        self.it, self.dev = iter(loader), dev
        self.stream = torch.cuda.Stream() if dev.type == "cuda" else None
        self._load()

    def _load(self):
        try:
            batch = next(self.it)
        except StopIteration:
            self.next = None
            return
        if self.stream is None:
            self.next = batch
            return
        with torch.cuda.stream(self.stream):
            dense, values, offsets, y = batch
            self.next = (dense.cuda(non_blocking=True), [v.cuda(non_blocking=True) for v in values],
                         [o.cuda(non_blocking=True) for o in offsets], y.cuda(non_blocking=True))

    def get(self):
        batch = self.next
        if batch is not None and self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
            dense, values, offsets, y = batch
            for t in (dense, y, *values, *offsets):
                t.record_stream(torch.cuda.current_stream())
        self._load()
        return batch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=60_000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=200_000)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    amp_dtype = torch.float16 if dev.type == "cuda" else torch.bfloat16

    torch.manual_seed(args.seed)
    model = CTR(args.vocab).to(dev).train()
    sparse = [p for bag in model.bags for p in bag.parameters()]
    dense_params = list(model.bottom.parameters()) + list(model.top.parameters())
    opt_sparse = torch.optim.SparseAdam(sparse, lr=1e-3)
    opt_dense = torch.optim.AdamW(dense_params, lr=1e-3, weight_decay=1e-5)
    scaler = torch.amp.GradScaler(dev.type, enabled=amp_dtype == torch.float16)
    loader = DataLoader(Clicks(args.samples, args.vocab, args.seed), batch_size=args.batch, shuffle=False,
                        num_workers=args.workers, collate_fn=collate, pin_memory=dev.type == "cuda",
                        persistent_workers=args.workers > 0)

    losses, step = [], 0
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        pf = Prefetcher(loader, dev)
        while (batch := pf.get()) is not None:
            dense, values, offsets, y = batch
            with torch.autocast(dev.type, dtype=amp_dtype):
                logit = model(dense, values, offsets)
            loss = F.binary_cross_entropy_with_logits(logit.float(), y)
            opt_sparse.zero_grad(set_to_none=True)
            opt_dense.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(opt_dense)
            nn.utils.clip_grad_norm_(dense_params, 1.0)
            scaler.step(opt_dense)
            scaler.step(opt_sparse)
            scaler.update()
            losses.append(loss.detach())
            step += 1
            if step % args.log_every == 0:
                log.info("epoch %d step %d loss %.4f scale %g", epoch, step, loss.item(), scaler.get_scale())
    if dev.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0

    lv = torch.stack(losses).double().cpu().numpy()
    checksum = float(lv @ np.linspace(1.0, 2.0, lv.size)) + sum(float(p.detach().double().sum())
                                                                for p in model.parameters())
    print(json.dumps({"script": "sparse_amp_train", "steps": step, "workers": args.workers,
                      "step_ms": round(wall / step * 1e3, 3), "scale": scaler.get_scale() if scaler.is_enabled() else None,
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
