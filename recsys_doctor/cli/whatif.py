"""``recsys-doctor whatif``: every candidate plan priced from a trace (nothing is run)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from .._util.format import fixed
from .._util.json import json_default
from ..errors import BadInputError
from ._tables import Footnotes
from .advise import parse_time

__all__ = ["whatif_cmd", "costs_with_buckets", "render_whatif"]


def costs_with_buckets(path: Path | None) -> Any:
    """The default :class:`~recsys_doctor.planning.whatif.WhatIfCosts`, with the measured
    bucket costs of ``path`` when given (a bad file: ``BadInputError``, one line)."""
    from ..planning.io import read_bucket_costs
    from ..planning.whatif import WhatIfCosts

    if path is None:
        return WhatIfCosts()
    return replace(WhatIfCosts(), bucket_gpu_ns=read_bucket_costs(path), bucket_source=str(path))


@click.command("whatif")
@click.argument("trace", type=click.Path(path_type=Path, dir_okay=False, exists=False))
@click.option("--clients", type=click.IntRange(min=1), metavar="N",
              help="Concurrent clients to price for (default: the trace's threads that call CUDA).")
@click.option("--train", is_flag=True, help="The trace is a training loop: price step time, not queries/s.")
@click.option("--units", type=click.IntRange(min=1), metavar="N",
              help="Queries (steps) in the window (default: the 'query'/'step' NVTX ranges, else the "
                   "device-to-host copies).")
@click.option("--nvtx", metavar="NAME", help="Price only the span of the NVTX ranges named NAME.")
@click.option("--start", metavar="TIME", help="Start of the window on the trace's clock (e.g. 1.5s, 200ms).")
@click.option("--end", metavar="TIME", help="End of the window (e.g. 2s).")
@click.option("--bucket-costs", "bucket_costs", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Measured GPU time of one batch per bucket size, JSON in us: {\"1\": 221.0, \"2\": 267.0, "
                   "...} (profile --apply's bucket_gpu_us.json, json.dumps(served.bucket_gpu_us())), or an "
                   "object with it under \"bucket_gpu_us\". Batching plans are then priced from it.")
@click.option("--json", "as_json", is_flag=True, help="Print the stats and every prediction as JSON.")
def whatif_cmd(trace: Path, clients: int | None, train: bool, units: int | None, nvtx: str | None,
               start: str | None, end: str | None, bucket_costs: Path | None, as_json: bool) -> None:
    """Price every candidate plan (stream groups x merged copy streams x CUDA graphs, and
    dynamic batching) for TRACE by the what-if estimate that profile --apply ranks with;
    nothing is run, no GPU needed.

    \b
        recsys-doctor whatif serve.sqlite --clients 32
        recsys-doctor whatif serve.sqlite --clients 32 --bucket-costs run/bucket_gpu_us.json

    The estimate, its constants and the bucket-costs file: docs/profile.md ("whatif",
    and step 3 of "--apply").
    """
    from ..diagnose.whatif_trace import whatif_trace

    if train and bucket_costs is not None:
        raise BadInputError("--bucket-costs prices dynamic batching, which a training loop does not have")
    costs = costs_with_buckets(bucket_costs)
    res = whatif_trace(trace, kind="train" if train else "serve", clients=clients, units=units, nvtx=nvtx,
                       start_ns=parse_time(start, "--start"), end_ns=parse_time(end, "--end"), costs=costs)
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=1, default=json_default))
        return
    from rich.console import Console

    render_whatif(res, Console())


def render_whatif(res: Any, console: Any) -> None:
    """One row per plan the estimate tells apart (the shared-pool twin of a plan prices the
    same and is left out), best first."""
    from rich.table import Table

    st = res.stats
    train = st.kind == "train"
    what = "step" if train else "query"
    console.print(f"What-if: {res.path}, {st.units} {'steps' if train else 'queries'} ({st.unit_source})"
                  + ("" if train else f", {res.clients} clients"), soft_wrap=True, markup=False, highlight=False)
    t = Table()
    t.caption = f"host us and GPU us: per {what}"
    cols = (["plan", "step ms"] if train else ["plan", "q/s", "p50 ms"]) + ["bound", "host us", "GPU us", "notes"]
    for c in cols:  # only the plan wraps (at its spaces): the numbers stay whole on 80 columns
        t.add_column(c, no_wrap=c != "plan", justify="left" if c in ("plan", "bound", "notes") else "right")
    notes = Footnotes()
    for p in res.predictions:
        if not p.candidate.per_stream_allocator and not train:
            continue
        nums = [fixed(p.step_ms, "", 3)] if train else [fixed(p.qps, "", 1), fixed(p.p50_ms, "", 3)]
        t.add_row(p.candidate.label, *nums, p.bound, fixed(p.host_ns / 1e3, "", 1), fixed(p.gpu_ns / 1e3, "", 1),
                  notes.cite(p.notes))
    console.print(t)
    notes.print(console)
    if not train:
        console.print("batching priced from " + (f"the measured bucket costs in {res.bucket_source}"
                      if res.bucket_source else "the constant fit on the H100 (--bucket-costs FILE: from measured "
                      "ones)") + "; p99 is not priced (a trace tells no latency tail)")
