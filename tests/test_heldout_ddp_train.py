"""The held-out DistributedDataParallel training loop (examples/heldout/ddp_train.py) on the CPU.

Written for ``torchrun`` and run with plain ``python`` as one rank (gloo, a ``file://``
rendezvous in a temporary folder of its own), as ``profile --apply`` runs it. Its checksum must
not depend on its DataLoader's worker count, and is recomputed here by a plain training loop with
neither DDP nor torch.distributed: a one-rank DDP averages its gradients over a world of one, so
they are the plain ones. It is also run as torchrun starts it (``env://``), as two ranks.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_heldout_scripts import HELDOUT, TINY, _tiny_run
from torch.utils.data import DistributedSampler

NAME = "ddp_train.py"
#: tiny sizes (with --device cpu, tests/test_heldout_scripts.py): 1,000 samples in batches of 64 are
#: 16 micro-batches an epoch, the last of 40 rows; at 3 a step, 6 optimizer steps an epoch, the last
#: of one micro-batch
ARGS = dict(zip(TINY[NAME][::2], TINY[NAME][1::2]))
WORKERS = (0, 2)
#: what torchrun sets; none of it is in the plain runs' environment
TORCHRUN_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": "", **extra}


def _start(env: dict[str, str], workers: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HELDOUT / NAME), "--device", "cpu", *TINY[NAME], "--workers", str(workers)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HELDOUT, env=env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """All runs at once: one rank with 0 and 2 workers (each with a TMPDIR of its own, to see what
    it leaves there), and two ranks through ``env://`` as torchrun starts them. By key: stdout
    lines, stderr and the TMPDIR's entries after the run."""
    port = str(_free_port())
    plan = {("plain", w): (_env(TMPDIR=str(tmp_path_factory.mktemp(f"w{w}"))), w) for w in WORKERS}
    plan |= {("torchrun", r): (_env(TMPDIR=str(tmp_path_factory.mktemp(f"r{r}")), MASTER_ADDR="127.0.0.1",
                                    MASTER_PORT=port, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r)), 0)
             for r in (0, 1)}
    procs = {key: (_start(env, w), Path(env["TMPDIR"])) for key, (env, w) in plan.items()}
    out = {}
    for key, (p, tmp) in procs.items():
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode == 0, f"{key}: {stderr[-2000:]}"
        out[key] = (stdout.splitlines(), stderr, sorted(e.name for e in tmp.iterdir()))
    return out


def _steps(samples: int, batch: int, accum: int, epochs: int, world: int = 1) -> int:
    """Optimizer steps: the sampler pads each rank to ceil(samples / world) samples, the loader's last
    batch is partial, and an epoch's last step takes whatever micro-batches are left."""
    per_rank = math.ceil(samples / world)
    return epochs * math.ceil(math.ceil(per_rank / batch) / accum)


def test_one_rank_prints_its_steps_and_a_checksum_that_ignores_its_workers(runs):
    samples, batch, accum, epochs = (int(ARGS[k]) for k in ("--samples", "--batch", "--accum", "--epochs"))
    assert _steps(samples, batch, accum, epochs) == 12
    out = {}
    for w in WORKERS:
        lines, stderr, _ = runs[("plain", w)]
        assert len(lines) == 1, lines
        r = json.loads(lines[0])
        assert set(r) == {"script", "step_ms", "steps", "workers", "checksum"}
        assert r["script"] == "ddp_train" and r["workers"] == w and r["steps"] == 12
        assert r["step_ms"] > 0 and math.isfinite(r["checksum"])
        # the all-reduced running loss, logged on rank 0 every 4 steps
        assert [ln.split(" loss ")[0].split(" INFO ")[1] for ln in stderr.splitlines() if " loss " in ln] == [
            "epoch 0 step 4", "epoch 1 step 8", "epoch 1 step 12"]
        out[w] = r["checksum"]
    assert out[0] == out[2]


def test_the_runs_leave_nothing_in_the_temporary_folder(runs):
    """The ``file://`` rendezvous folder is removed (``torchinductor_<user>``, a cache that
    DistributedDataParallel's import of torch._dynamo makes, is torch's, not the script's)."""
    for key, (_, _, left) in runs.items():
        assert [e for e in left if not e.startswith("torchinductor_")] == [], key


def test_under_torchrun_only_rank_0_prints(runs):
    """Two ranks through ``env://``: each trains on its half (500 samples, 8 micro-batches, 3 steps an
    epoch); only rank 0 prints its JSON line and logs."""
    samples, batch, accum, epochs = (int(ARGS[k]) for k in ("--samples", "--batch", "--accum", "--epochs"))
    lines, stderr, _ = runs[("torchrun", 0)]
    r = json.loads(lines[-1])
    assert len(lines) == 1 and r["steps"] == _steps(samples, batch, accum, epochs, world=2) == 6
    assert "rank0 INFO epoch 1 step 4 loss" in stderr
    lines, stderr, _ = runs[("torchrun", 1)]
    assert lines == [] and " loss " not in stderr
    assert r["checksum"] != json.loads(runs[("plain", 0)][0][0])["checksum"]


def test_ddp_train_checksum_recomputed_without_ddp(runs):
    """A plain loop with neither DDP nor torch.distributed: the same seed, model class (unwrapped)
    and optimizers, the batches in the sampler's order (``randperm`` seeded with seed + epoch, as
    DistributedSampler draws it for one replica), the loss over 3 divided by 3 and the optimizers
    stepped every 3 micro-batches and at each epoch's end."""
    seed = 0
    with _tiny_run(NAME) as (mod, a):
        samples, batch, vocab, accum, epochs = (int(a[k]) for k in ("--samples", "--batch", "--vocab", "--accum",
                                                                    "--epochs"))
        net = mod.WideDeep(vocab).train()
        emb = [p for bag in net.bags for p in bag.parameters()]
        rest = [p for m in (net.bottom, net.wide, net.top) for p in m.parameters()]
        optimizers = [torch.optim.Adagrad(emb, lr=0.05), torch.optim.AdamW(rest, lr=1e-3, weight_decay=1e-4)]
        ds = mod.ClickLog(samples, vocab, seed)
        losses, steps, sizes = [], 0, []
        for epoch in range(epochs):
            g = torch.Generator()
            g.manual_seed(seed + epoch)
            order = torch.randperm(samples, generator=g).tolist()
            sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=seed)
            sampler.set_epoch(epoch)
            assert list(sampler) == order
            batches = [order[k:k + batch] for k in range(0, samples, batch)]
            for i, idx in enumerate(batches):
                b = mod.collate([ds[j] for j in idx])
                assert all(int(o[-1]) < len(v) for v, o in zip(b["values"], b["offsets"]))
                loss = F.binary_cross_entropy_with_logits(net(b["dense"], b["values"], b["offsets"]), b["label"])
                (loss / accum).backward()
                losses.append(loss.item())
                sizes.append(len(idx))
                if (i + 1) % accum and i + 1 != len(batches):
                    continue
                assert all(p.grad is not None and not p.grad.is_sparse for p in emb)
                for opt in optimizers:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                steps += 1
        assert steps == _steps(samples, batch, accum, epochs) and sizes[15] == samples - 15 * batch == 40
        expected = float(np.array(losses) @ np.linspace(1.0, 2.0, len(losses))) + sum(
            float(p.detach().double().sum()) for p in net.parameters())
    for w in WORKERS:
        r = json.loads(runs[("plain", w)][0][-1])
        assert r["steps"] == steps and r["checksum"] == pytest.approx(expected, rel=1e-5)
