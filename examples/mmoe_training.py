"""MMoE multi-task training as a recsys-doctor Workload: the tool times every step.

    recsys-doctor profile examples/mmoe_training.py --steps 100
    recsys-doctor profile examples/mmoe_training.py -- --batch 1024

26 sparse features (Embedding, dim 16) -> 8 experts (3-layer MLPs) mixed by 4 gates ->
4 task towers; BCE loss over the 4 tasks, Adam. Batch 512. In eager PyTorch one step is
hundreds of tiny kernels on one stream: on the H100 ~8.7 ms per step, while a
whole-step CUDA graph takes ~4.2 ms (``../shared/GPU.md``). The experts are independent
branches, the textbook case for side streams once launches are cheap.

The step returns the loss, which the tool records, so a faster configuration can be
checked to compute the same losses.

What ``profile --apply`` needs from a training workload (``recsys_doctor.applying.train_runner.make_runner``):
``model.streams`` - the experts and the task heads run through
``recsys_doctor.runtime.parallel_branches(..., streams=model.streams)``; ``False`` (the
default here) runs them one after another on the current stream, exactly as plain eager
code, and the runtime sets a ``BranchStreams`` to run them on side streams; and
``step.optimizer`` - the optimizer, which the runtime makes ``capturable`` to capture the
whole step (forward, backward, Adam) as one CUDA graph. The input batch is fixed (as in the probe that
measured the numbers above), so the loss falls step after step.

Arguments after ``--``: ``--batch N`` (512), ``--vocab N`` (100000), ``--seed N`` (0).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn

from recsys_doctor.runtime import parallel_branches
from recsys_doctor.capture.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _example_args import int_options  # noqa: E402

N_FEATURES, DIM, N_EXPERTS, N_TASKS, HIDDEN, EXPERT_OUT = 26, 16, 8, 4, 128, 64


class Expert(nn.Module):
    def __init__(self, hidden: int = HIDDEN, out: int = EXPERT_OUT) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N_FEATURES * DIM, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MMoE(nn.Module):
    """Multi-gate mixture of experts: every task mixes all experts with its own softmax gate.
    The one MMoE definition: the training benchmark and the GPU tests import it with their
    own sizes (``hidden``/``expert_out``/``tower``) and ``streams``."""

    def __init__(self, vocab: int = 100_000, *, hidden: int = HIDDEN, expert_out: int = EXPERT_OUT,
                 tower: int = 32, streams: object = False) -> None:
        super().__init__()
        self.emb = nn.ModuleList([nn.Embedding(vocab, DIM) for _ in range(N_FEATURES)])
        self.experts = nn.ModuleList([Expert(hidden, expert_out) for _ in range(N_EXPERTS)])
        self.gates = nn.ModuleList([nn.Linear(N_FEATURES * DIM, N_EXPERTS) for _ in range(N_TASKS)])
        self.towers = nn.ModuleList([nn.Sequential(nn.Linear(expert_out, tower), nn.ReLU(), nn.Linear(tower, 1))
                                     for _ in range(N_TASKS)])
        #: where the branches run: False = the current stream (eager reference); the
        #: runtime puts a recsys_doctor.runtime.BranchStreams here (profile --apply)
        self.streams: object = streams

    def _task(self, k: int, x: torch.Tensor, ex: torch.Tensor) -> torch.Tensor:
        w = torch.softmax(self.gates[k](x), 1).unsqueeze(2)
        return self.towers[k]((w * ex).sum(1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = torch.cat([e(ids[:, i]) for i, e in enumerate(self.emb)], 1)
        ex = torch.stack(parallel_branches(self.experts, x, streams=self.streams), 1)  # B, E, 64
        heads = [lambda x, ex, k=k: self._task(k, x, ex) for k in range(N_TASKS)]
        return torch.cat(parallel_branches(heads, x, ex, streams=self.streams), 1)


def warm_up_aside(step, n: int) -> None:
    """``n`` eager calls of ``step()`` on a side stream, then wait for them: what capturing
    a training step as a CUDA graph needs first (allocator, cuBLAS and Adam state warmed up
    off the capture stream). The benchmark and the GPU tests use it for their
    hand-written whole-step graphs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(n):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def workload(argv: list[str] | None = None) -> Workload:
    a = int_options("mmoe_training.py", argv, batch=512, vocab=100_000, seed=0)
    torch.manual_seed(a.seed)
    model = MMoE(a.vocab).cuda().train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    lossf = nn.BCEWithLogitsLoss()
    ids = torch.randint(0, a.vocab, (a.batch, N_FEATURES), device="cuda")
    labels = torch.rand(a.batch, N_TASKS, device="cuda")

    def step(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=False)
        loss = lossf(model(ids), labels)
        loss.backward()
        opt.step()
        return loss.detach()

    step.optimizer = opt  # type: ignore[attr-defined]  # for profile --apply (capturable Adam)

    return Workload(model=model, inputs=lambda k: (ids, labels), kind="train", concurrency=1,
                    steps=200, warmup=5, run=step, name="mmoe_training")
