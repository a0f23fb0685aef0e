"""Train a small CTR model (embeddings + MLP) from a map-style Dataset with a DataLoader.

The usual loop: ``DataLoader(..., shuffle=True, pin_memory=True)`` (``num_workers=0`` so it
runs anywhere), each batch moved with ``.to(device, non_blocking=True)``, BCE loss, Adam,
a log line every ``--log-every`` steps. The data is synthetic: labels come from a fixed
random "teacher", so the loss goes down. The last partial batch of each epoch is kept.

    python dataloader_train.py --epochs 3
    python dataloader_train.py --device cpu --samples 2048 --batch 128 --vocab 1000 --epochs 2

The last line is JSON: step_ms (mean over the timed steps), steps and checksum (every
step's loss, weighted by step index, plus the sum of the trained parameters).
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
        teacher_w = rng.standard_normal(N_DENSE).astype(np.float32)
        teacher_e = rng.standard_normal((N_SPARSE, vocab)).astype(np.float32)
        logit = self.dense @ teacher_w + teacher_e[np.arange(N_SPARSE), self.sparse].sum(1) * 0.3
        self.label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        return torch.from_numpy(self.dense[i]), torch.from_numpy(self.sparse[i]), torch.tensor(self.label[i])


class CTRModel(nn.Module):
    def __init__(self, vocab, dim=16):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(vocab, dim) for _ in range(N_SPARSE))
        self.mlp = nn.Sequential(nn.Linear(N_SPARSE * dim + N_DENSE, 256), nn.ReLU(),
                                 nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, dense, sparse):
        x = torch.cat([e(sparse[:, k]) for k, e in enumerate(self.emb)] + [dense], dim=1)
        return self.mlp(x).squeeze(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=10, help="steps not timed")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    if -(-args.samples // args.batch) * args.epochs <= args.warmup:
        ap.error("no step left to time: more samples or epochs, or a smaller --warmup")

    torch.manual_seed(args.seed)
    data = ClickLog(args.samples, args.vocab, args.seed)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=0,
                        pin_memory=True, generator=torch.Generator().manual_seed(args.seed))
    model = CTRModel(args.vocab).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()

    losses, step, t0 = [], 0, None
    model.train()
    for epoch in range(args.epochs):
        for dense, sparse, label in loader:
            if step == args.warmup:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            dense = dense.to(device, non_blocking=True)
            sparse = sparse.to(device, non_blocking=True)
            label = label.to(device, non_blocking=True)
            loss = loss_fn(model(dense, sparse), label)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            step += 1
            if step % args.log_every == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    timed = step - args.warmup
    step_ms = (time.perf_counter() - t0) * 1e3 / timed

    per_step = torch.stack(losses).double().cpu().numpy()
    params = sum(p.detach().double().sum().item() for p in model.parameters())
    checksum = float(per_step @ np.linspace(1.0, 2.0, per_step.size)) + params
    print(json.dumps({"script": "dataloader_train", "step_ms": round(step_ms, 4), "steps": timed,
                      "batch": args.batch, "final_loss": round(float(per_step[-1]), 5),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
