"""Train a two-tower retrieval model with in-batch negatives; log the loss, print no step time.

Written the way a research training script often is: a prefetch pool makes each step's batch
in numpy (``ThreadPoolExecutor(--prefetch).map`` over the step numbers, so the order holds),
the loop moves it with ``torch.from_numpy(a).to(dev, non_blocking=True)`` (pageable memory),
scores every user of the batch against every item of the batch (the other rows are the
negatives), ``F.cross_entropy`` against ``torch.arange(B, device=dev)``, Adam, and
``logging`` reports ``loss.item()`` every ``--log-every`` steps. No step time, no samples/s:
a tool that wants one must measure it itself.

    python log_train.py --steps 600
    python log_train.py --device cpu --steps 12 --batch 32 --users 500 --items 500 --log-every 4

The last line is JSON: script, steps, prefetch, batch and checksum (every step's loss,
position-weighted, plus the trained embedding tables' sums: the same for any prefetch count).
"""

import argparse
import json
import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

N_DENSE, DIM, TEMP = 8, 32, 0.05
log = logging.getLogger("train")


class TwoTower(nn.Module):
    def __init__(self, users: int, items: int):
        super().__init__()
        self.user_emb = nn.Embedding(users, DIM)
        self.item_emb = nn.Embedding(items, DIM)
        self.user_mlp = nn.Sequential(nn.Linear(DIM + N_DENSE, 64), nn.ReLU(), nn.Linear(64, DIM))
        self.item_mlp = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, DIM))

    def forward(self, user_ids: torch.Tensor, user_dense: torch.Tensor, item_ids: torch.Tensor) -> torch.Tensor:
        u = F.normalize(self.user_mlp(torch.cat([self.user_emb(user_ids), user_dense], dim=1)), dim=1)
        v = F.normalize(self.item_mlp(self.item_emb(item_ids)), dim=1)
        return u @ v.T / TEMP  # [B, B]: row i's positive is column i


def make_batch(seed, step, batch, users, items):
    rng = np.random.default_rng([seed, step])
    user_ids = rng.integers(0, users, batch, dtype=np.int64)
    item_ids = (user_ids * 7 + rng.integers(0, 5, batch)) % items  # what each user engaged with
    dense = rng.standard_normal((batch, N_DENSE)).astype(np.float32)
    return user_ids, dense, item_ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--users", type=int, default=200_000)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--prefetch", type=int, default=2, help="threads making batches ahead of the loop")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = TwoTower(args.users, args.items).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    losses = []
    with ThreadPoolExecutor(max_workers=args.prefetch) as pool:
        batches = pool.map(lambda s: make_batch(args.seed, s, args.batch, args.users, args.items), range(args.steps))
        for step, (user_ids, dense, item_ids) in enumerate(batches):
            user_ids = torch.from_numpy(user_ids).to(dev, non_blocking=True)
            dense = torch.from_numpy(dense).to(dev, non_blocking=True)
            item_ids = torch.from_numpy(item_ids).to(dev, non_blocking=True)
            logits = model(user_ids, dense, item_ids)
            loss = F.cross_entropy(logits, torch.arange(logits.shape[0], device=dev))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            if step % args.log_every == 0:
                log.info("step %d loss %.4f", step, loss.item())

    flat = torch.stack(losses).double().cpu().numpy()
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    checksum += float(model.user_emb.weight.detach().double().sum()) + float(model.item_emb.weight.detach().double().sum())
    print(json.dumps({"script": "log_train", "steps": len(losses), "prefetch": args.prefetch, "batch": args.batch,
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
