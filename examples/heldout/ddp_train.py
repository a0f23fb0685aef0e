"""Train a wide&deep CTR model written for ``torchrun``: DistributedDataParallel, run here as one rank.

As most distributed recommender training scripts are: ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``
from the environment (0, 1, 0 under plain ``python``), ``init_process_group`` (NCCL on the GPU, gloo
on the CPU; ``env://`` under torchrun, else a ``file://`` rendezvous in a fresh temporary folder,
removed at the end), ``torch.cuda.set_device``, the model wrapped in ``DistributedDataParallel``.
8 multi-hot fields pooled by ``nn.EmbeddingBag(mode="sum")`` with offsets (dense gradients,
``Adagrad``) beside a dense MLP and a wide linear part (``AdamW``), ``BCEWithLogitsLoss``. A map-style
``Dataset`` made from the seed, a shuffled ``DistributedSampler`` (``set_epoch`` every epoch), a
``DataLoader`` (``--workers`` persistent processes, pinned memory, a ``collate_fn`` making a dict
with values + offsets per field, the last batch partial), ``.to(dev, non_blocking=True)``. Gradients
accumulate over ``--accum`` micro-batches, all but the last of a step under ``model.no_sync()`` (an
epoch's last step may be shorter); every ``--log-every`` steps the running loss is ``all_reduce``d
and logged on rank 0; a ``dist.barrier()`` ends each epoch.

    torchrun --nproc_per_node=1 ddp_train.py
    python ddp_train.py
    python ddp_train.py --device cpu --samples 1000 --batch 64 --vocab 500 --accum 3 --log-every 4 --workers 0

The last line (rank 0 only) is JSON: script, step_ms (mean over the optimizer steps after
``--warmup-steps``), steps (optimizer steps), workers and checksum (every micro-batch loss weighted
by its position, plus the sums of the trained parameters: the same for any worker count).
"""

import argparse
import contextlib
import json
import logging
import os
import shutil
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

N_DENSE, FIELDS, DIM = 13, 8, 16
log = logging.getLogger("ddp_train")


class ClickLog(Dataset):
    """Sample i: 13 dense features, 1-3 ids in each of 8 fields and a click label, all from the seed."""

    def __init__(self, n: int, vocab: int, seed: int):
        rng = np.random.default_rng(seed)
        self.dense = np.log1p(rng.exponential(1.0, (n, N_DENSE))).astype(np.float32)
        lengths = rng.integers(1, 4, (FIELDS, n))
        self.starts = np.concatenate([np.zeros((FIELDS, 1), np.int64), np.cumsum(lengths, axis=1)], axis=1)
        self.values = [rng.integers(0, vocab, int(s[-1]), dtype=np.int64) for s in self.starts]
        weight = rng.standard_normal((FIELDS, vocab)).astype(np.float32)
        logit = sum(weight[f, self.values[f][self.starts[f, :-1]]] for f in range(FIELDS)) * 0.4
        logit = logit + (self.dense - self.dense.mean(0)) @ rng.standard_normal(N_DENSE).astype(np.float32) - 1.0
        self.label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        ids = [self.values[f][self.starts[f, i]:self.starts[f, i + 1]] for f in range(FIELDS)]
        return self.dense[i], ids, self.label[i]


def collate(samples):
    values, offsets = [], []
    for f in range(FIELDS):
        per = [s[1][f] for s in samples]
        values.append(torch.from_numpy(np.concatenate(per)))
        offsets.append(torch.from_numpy(np.cumsum([0] + [len(p) for p in per[:-1]])))
    return {"dense": torch.from_numpy(np.stack([s[0] for s in samples])), "values": values, "offsets": offsets,
            "label": torch.tensor(np.array([s[2] for s in samples]))}


class WideDeep(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(vocab, DIM, mode="sum") for _ in range(FIELDS))
        self.bottom = nn.Sequential(nn.Linear(N_DENSE, 64), nn.ReLU(), nn.Linear(64, DIM), nn.ReLU())
        self.wide = nn.Linear(N_DENSE, 1)
        self.top = nn.Sequential(nn.Linear((FIELDS + 1) * DIM, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def forward(self, dense, values, offsets):
        pooled = [bag(v, o) for bag, v, o in zip(self.bags, values, offsets)]
        deep = self.top(torch.cat([self.bottom(dense)] + pooled, dim=1))
        return (deep + self.wide(dense)).squeeze(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=65_536)
    ap.add_argument("--batch", type=int, default=512, help="rows a micro-batch, per rank")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = args.device.startswith("cuda")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(levelname)s %(message)s")

    torchrun = "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ
    tmp = None if torchrun else tempfile.mkdtemp(prefix="ddp_train_")
    init_method = "env://" if torchrun else "file://" + os.path.join(tmp, "rendezvous")
    dist.init_process_group(backend="nccl" if cuda else "gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        if cuda:
            torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        torch.manual_seed(args.seed)
        net = WideDeep(args.vocab).to(dev)
        model = DistributedDataParallel(net, device_ids=[local_rank] if cuda else None)
        emb = [p for bag in net.bags for p in bag.parameters()]
        rest = [p for m in (net.bottom, net.wide, net.top) for p in m.parameters()]
        optimizers = [torch.optim.Adagrad(emb, lr=0.05), torch.optim.AdamW(rest, lr=1e-3, weight_decay=1e-4)]
        loss_fn = nn.BCEWithLogitsLoss()

        ds = ClickLog(args.samples, args.vocab, args.seed)
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=args.workers, pin_memory=cuda,
                            collate_fn=collate, persistent_workers=args.workers > 0)

        micro_losses, step_times, steps = [], [], 0
        running = torch.zeros(2, device=dev)  # loss sum, micro-batches
        t_step = time.perf_counter()
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for i, batch in enumerate(loader):
                dense, label = (batch[k].to(dev, non_blocking=True) for k in ("dense", "label"))
                values, offsets = ([t.to(dev, non_blocking=True) for t in batch[k]] for k in ("values", "offsets"))
                sync = (i + 1) % args.accum == 0 or i + 1 == len(loader)
                with contextlib.nullcontext() if sync else model.no_sync():
                    loss = loss_fn(model(dense, values, offsets), label)
                    (loss / args.accum).backward()
                micro_losses.append(loss.detach())
                running[0] += loss.detach()
                running[1] += 1
                if not sync:
                    continue
                for opt in optimizers:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                steps += 1
                if steps % args.log_every == 0:
                    dist.all_reduce(running)
                    if rank == 0:
                        log.info("epoch %d step %d loss %.4f", epoch, steps, (running[0] / running[1]).item())
                    running.zero_()
                if cuda:
                    torch.cuda.synchronize()
                now = time.perf_counter()
                step_times.append((now - t_step) * 1e3)
                t_step = now
            dist.barrier()

        if rank == 0:
            lv = torch.stack(micro_losses).double().cpu().numpy()
            checksum = float(lv @ np.linspace(1.0, 2.0, lv.size)) + sum(float(p.detach().double().sum())
                                                                        for p in net.parameters())
            timed = step_times[args.warmup_steps:] or step_times
            print(json.dumps({"script": "ddp_train", "step_ms": round(float(np.mean(timed)), 4), "steps": steps,
                              "workers": args.workers, "checksum": checksum}), flush=True)
    finally:
        dist.destroy_process_group()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
