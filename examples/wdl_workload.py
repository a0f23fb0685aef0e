"""Wide&deep serving as a recsys-doctor Workload: the tool drives the load itself.

    recsys-doctor profile examples/wdl_workload.py --threads 8
    recsys-doctor profile examples/wdl_workload.py --threads 4 --duration 2 -- --batch 512

The model and the query inputs are the ones of ``examples/wdl_serving.py`` (imported, not
copied): 26 sparse features through EmbeddingBag + 13 dense + a 3-layer MLP, batch 256,
~90 kernels per query, most shorter than 10 us. Each client thread sends queries back to
back: the host inputs (pinned) go to the GPU, the model runs, the output comes back to
the host - all on the one default stream every thread shares. That is the serving loop
``advise`` diagnoses as launch-bound with stream contention.

Arguments after ``--``: ``--batch N`` (256), ``--vocab N`` (100000), ``--threads N`` (8).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _example_args import int_options  # noqa: E402
from wdl_serving import WideDeep, host_query  # noqa: E402

from recsys_doctor.capture.workload import Workload  # noqa: E402


def workload(argv: list[str] | None = None) -> Workload:
    a = int_options("wdl_workload.py", argv, batch=256, vocab=100_000, threads=8)
    torch.manual_seed(0)
    model = WideDeep(a.vocab).cuda().eval()

    def inputs(k: int):
        # one query's host inputs per client, pinned so the H2D copies can be async
        torch.manual_seed(1000 + k)
        return host_query(a.batch, a.vocab)

    return Workload(model=model, inputs=inputs, kind="serve", concurrency=a.threads, duration_s=1.0,
                    warmup=3, name="wdl_serving")
