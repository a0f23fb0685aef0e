"""Train a DLRM-style CTR model the way a tuned training job does: AMP, gradient accumulation, workers.

A ``DataLoader`` with ``--workers`` worker processes (persistent), ``pin_memory`` and a seeded
shuffle; each batch moved with ``.to(dev, non_blocking=True)``; the forward under
``torch.autocast`` in bfloat16 (``--amp off`` for float32); the loss divided by ``--accum`` and
the optimizer stepped every ``--accum`` micro-batches, after ``clip_grad_norm_``;
``zero_grad(set_to_none=True)``; a ``StepLR`` schedule. Every ``--eval-every`` optimizer steps
the model is switched to ``eval()`` and scores a fixed validation set (moved to the GPU once)
under ``torch.no_grad()``, then goes back to ``train()``: the same model object called for
training (gradients on) and for evaluation (off, the same shapes every time).

    python amp_accum_train.py --epochs 2
    python amp_accum_train.py --device cpu --samples 2048 --batch 128 --vocab 500 --epochs 1 --workers 0 --eval-every 2

The last line is JSON: step_ms (mean over the optimizer steps after ``--warmup-steps``), steps
(optimizer steps), evals, workers, amp and checksum (every micro-batch loss weighted by its index, every validation loss, and
the sum of the trained parameters).
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

N_DENSE, N_SPARSE = 13, 8


class ClickLog(Dataset):
    def __init__(self, n, vocab, seed):
        rng = np.random.default_rng(seed)
        self.dense = rng.standard_normal((n, N_DENSE), dtype=np.float32)
        self.sparse = rng.integers(0, vocab, (n, N_SPARSE), dtype=np.int64)
        w = rng.standard_normal(N_DENSE).astype(np.float32)
        e = rng.standard_normal((N_SPARSE, vocab)).astype(np.float32)
        logit = self.dense @ w + e[np.arange(N_SPARSE), self.sparse].sum(1) * 0.3
        self.label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        return self.dense[i], self.sparse[i], self.label[i]


class DLRM(nn.Module):
    def __init__(self, vocab, dim=16):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(N_DENSE, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        self.emb = nn.ModuleList([nn.Embedding(vocab, dim) for _ in range(N_SPARSE)])
        n = N_SPARSE + 1
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, dense, sparse):
        x = self.bottom(dense)
        feats = torch.stack([x] + [e(sparse[:, k]) for k, e in enumerate(self.emb)], dim=1)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        i, j = torch.triu_indices(feats.shape[1], feats.shape[1], offset=1, device=dense.device)
        return self.top(torch.cat([x, inter[:, i, j]], dim=1)).squeeze(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=65_536)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    ap.add_argument("--vocab", type=int, default=50_000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=16, help="optimizer steps between validation passes")
    ap.add_argument("--amp", choices=["bf16", "off"], default=None, help="default: bf16 on CUDA, off on the CPU")
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    amp = (args.amp or ("bf16" if cuda else "off")) == "bf16"
    torch.manual_seed(args.seed)

    train = ClickLog(args.samples, args.vocab, args.seed)
    val = ClickLog(4 * args.batch, args.vocab, args.seed + 1)
    val_batches = [tuple(torch.from_numpy(a[k:k + args.batch]).to(dev) for a in (val.dense, val.sparse, val.label))
                   for k in range(0, len(val), args.batch)]
    loader = DataLoader(train, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.workers > 0, pin_memory=cuda,
                        generator=torch.Generator().manual_seed(args.seed))
    model = DLRM(args.vocab).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.5)
    loss_fn = nn.BCEWithLogitsLoss()

    def autocast():
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp)

    def validate():
        model.eval()
        with torch.no_grad(), autocast():
            losses = [loss_fn(model(d, s).float(), y) for d, s, y in val_batches]
        model.train()
        return float(torch.stack(losses).mean())

    micro_losses, val_losses, step_times = [], [], []
    steps, micro = 0, 0
    t_step = time.perf_counter()
    for _ in range(args.epochs):
        for dense, sparse, label in loader:
            dense, sparse = dense.to(dev, non_blocking=True), sparse.to(dev, non_blocking=True)
            label = label.to(dev, non_blocking=True)
            with autocast():
                loss = loss_fn(model(dense, sparse).float(), label)
            (loss / args.accum).backward()
            micro_losses.append(loss.detach())
            micro += 1
            if micro % args.accum:
                continue
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            steps += 1
            if steps % args.eval_every == 0:
                val_losses.append(validate())
            if cuda:
                torch.cuda.synchronize()
            now = time.perf_counter()
            if steps > args.warmup_steps:
                step_times.append((now - t_step) * 1e3)
            t_step = now

    losses = torch.stack(micro_losses).double().cpu().numpy()
    weights = np.linspace(1.0, 2.0, losses.size)
    params = sum(float(p.detach().double().sum()) for p in model.parameters())
    checksum = float(losses @ weights) + float(sum(val_losses)) + params
    print(json.dumps({"script": "amp_accum_train", "step_ms": round(float(np.mean(step_times)), 4),
                      "steps": steps, "evals": len(val_losses), "workers": args.workers, "amp": amp,
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
