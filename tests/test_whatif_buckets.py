"""Batching priced from measured bucket costs: the estimate on the hand-built trace of
``test_apply`` (every number worked out by hand in the comments), the bucket the runtime
would run (cross-checked with the runtime's own table), the ``--bucket-costs`` file and
its errors, the ``whatif`` command end to end on the shipped sample trace (its per-query
numbers taken by SQL from the same file), and what ``profile --apply`` writes of them."""

from __future__ import annotations

import gzip
import io
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from _sql import sql_rows
from test_apply import _trace
from recsys_doctor.applying.apply import write_bucket_costs
from recsys_doctor.applying.report import ApplyResult, CandidateResult
from recsys_doctor.cli import main
from recsys_doctor.cli.profile import render_apply
from recsys_doctor.errors import BadInputError
from recsys_doctor.planning.io import read_bucket_costs
from recsys_doctor.planning.whatif import Candidate, Prediction, WhatIfCosts, estimate, trace_stats

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "recsys_doctor" / "data" / "demo_wdl_serial_q4.sqlite.gz"
SWEEP_INFO = ROOT / "bench" / "results" / "serving_sweep_h100_info.json"

#: the hand trace's one graphed query with these costs: kernels 60 + 2 kernels x 5 gap +
#: packed copies 2 directions x 4 + 1010 B / 101 = 88 ns (as in test_apply)
HAND = dict(graph_node_gap_ns=5, copy_fixed_ns=4, copy_bytes_per_ns=101, batch_host_ns=10, batch_fill=0.5,
            serial_share=1 / 3, batch_marginal_share=5.0)  # a share no measured cost may ever use
BUCKETS_NS = {1: 44.0, 2: 55.0, 4: 66.0, 8: 110.0}  # bucket 1 is half the trace's 88 ns: factor 2


def _est(clients: int, groups: int, max_batch: int = 32):
    st = trace_stats(_trace())
    costs = WhatIfCosts(**HAND, bucket_gpu_ns=BUCKETS_NS, bucket_source="hand.json")
    return estimate(st, Candidate(groups, batching=True, max_batch=max_batch), clients=clients, costs=costs)


def test_a_batch_costs_its_measured_bucket_scaled_to_the_trace_by_hand():
    # 6 clients x fill 0.5 = a mean batch of 3, run in bucket 4 (the smallest >= 3):
    # 66 ns measured x 88 / 44 = 132 ns a batch of 3 queries
    # groups busy: min(4, ceil(6 / 3)) = 2, overlap 2 / (1 + 1/3) = 1.5
    # limits: host 1e9 / 10 = 1e8; gpu 1e9 x 1.5 x 3 / 132 = 3.409e7; clients 6e9 / 142 = 4.225e7
    p = _est(clients=6, groups=4)
    x = 1e9 * 1.5 * 3 / 132
    assert p.bound == "gpu" and p.qps == pytest.approx(x)
    assert p.overlap == pytest.approx(1.5) and p.gpu_ns == pytest.approx(132 / 3) and p.host_ns == 10
    assert p.p50_ms == pytest.approx(6 / x * 1e3)  # Little's law
    assert "mean batch 3 of 6 clients, bucket 4: " in p.notes[0] and "hand.json" in p.notes[0]


def test_a_batch_of_a_bucket_size_and_host_bound_by_hand():
    # 8 clients x 0.5 = 4, bucket 4: 132 ns a batch of 4; 2 groups busy of 4 (8 / 4), overlap 1.5
    # host 1e9 / 10 = 1e8; gpu 1e9 x 1.5 x 4 / 132 = 4.545e7; clients 8e9 / 142 = 5.634e7
    p = _est(clients=8, groups=4)
    assert p.bound == "gpu" and p.qps == pytest.approx(1e9 * 6 / 132)
    # with 100 ns of host a query: host 1e7 < gpu 4.545e7, clients 8e9 / 232 = 3.4e7: host-bound
    st = trace_stats(_trace())
    costs = WhatIfCosts(**{**HAND, "batch_host_ns": 100}, bucket_gpu_ns=BUCKETS_NS)
    q = estimate(st, Candidate(4, batching=True), clients=8, costs=costs)
    assert q.bound == "host" and q.qps == pytest.approx(1e7) and q.p50_ms == pytest.approx(8 / 1e7 * 1e3)


def test_past_the_largest_bucket_the_batch_is_capped_there_by_hand():
    # 64 clients x 0.5 = 32 (max_batch 16 caps it at 16), beyond the largest measured bucket 8:
    # the runtime makes no larger batch than its largest bucket, so 8 a batch: 110 x 2 = 220 ns
    # groups busy: min(8, ceil(64 / 8)) = 8, overlap 8 / (1 + 7/3) = 2.4
    # host 1e8; gpu 1e9 x 2.4 x 8 / 220 = 8.727e7; clients 64e9 / 230 = 2.78e8
    p = _est(clients=64, groups=8, max_batch=16)
    assert p.overlap == pytest.approx(2.4) and p.bound == "gpu"
    assert p.qps == pytest.approx(1e9 * 2.4 * 8 / 220) and p.gpu_ns == pytest.approx(220 / 8)
    assert "mean batch 8 of 64 clients, bucket 8, capped at the largest measured bucket 8" in p.notes[0]


def test_without_measured_costs_the_constant_prices_the_batch():
    # the same 6 clients with no buckets: 88 x (1 + 2 x 5.0) = 968 ns a batch of 3
    st = trace_stats(_trace())
    p = estimate(st, Candidate(4, batching=True), clients=6, costs=WhatIfCosts(**HAND))
    assert p.gpu_ns == pytest.approx(968 / 3) and "the H100 fit" in p.notes[0]


def test_the_bucket_is_the_one_the_runtime_runs():
    """For every batch size up to the largest bucket, the bucket priced is the runtime's
    own choice (``runtime._batched.bucket_table``), read back from the note."""
    pytest.importorskip("torch")
    from recsys_doctor.runtime._batched import bucket_table

    sizes = (1, 2, 4, 8, 16, 32)
    table = bucket_table(sizes)
    st = trace_stats(_trace())
    costs = WhatIfCosts(**{**HAND, "batch_fill": 1.0}, bucket_gpu_ns={b: float(b) for b in sizes})
    for n in range(1, 33):
        p = estimate(st, Candidate(1, batching=True, max_batch=32), clients=n, costs=costs)
        assert f"mean batch {n} of {n} clients, bucket {table[n]}:" in p.notes[0]
        assert p.gpu_ns == pytest.approx(88 * table[n] / 1 / n)


def test_costs_without_bucket_one_are_refused():
    st = trace_stats(_trace())
    with pytest.raises(BadInputError, match="no bucket 1"):
        estimate(st, Candidate(1, batching=True), clients=2, costs=WhatIfCosts(bucket_gpu_ns={2: 1.0}))


# ------------------------------------------------------------------------------ the file

def test_read_bucket_costs_takes_a_mapping_or_a_row(tmp_path):
    flat = tmp_path / "b.json"
    flat.write_text('{"1": 221.0, "2": 267, "16": 503.5}')
    assert read_bucket_costs(flat) == {1: 221_000.0, 2: 267_000.0, 16: 503_500.0}
    # a row of the committed serving sweep's info file: {"config": ..., "bucket_gpu_us": {...}}
    row = next(r for r in json.loads(SWEEP_INFO.read_text())["configs"] if r["bucket_gpu_us"])
    p = tmp_path / "row.json"
    p.write_text(json.dumps(row))
    assert read_bucket_costs(p) == {int(k): v * 1e3 for k, v in row["bucket_gpu_us"].items()}


BAD = [
    (None, "no such bucket-costs file"),
    ("{not json", "not JSON"),
    ("[1, 2]", "non-empty JSON object"),
    ("{}", "non-empty JSON object"),
    ('{"bucket_gpu_us": {}}', "non-empty JSON object"),
    ('{"1": 200, "0": 100}', "bucket size '0' is not a positive whole number"),
    ('{"1": 200, "-2": 100}', "bucket size '-2'"),
    ('{"1": 200, "two": 100}', "bucket size 'two'"),
    ('{"1": 200, "2.5": 100}', "bucket size '2.5'"),
    ('{"1": 0}', "bucket 1 must be a positive number of us, got 0"),
    ('{"1": -5.0}', "got -5.0"),
    ('{"1": "fast"}', "got 'fast'"),
    ('{"1": true}', "got True"),
    ('{"1": null}', "got None"),
    ('{"2": 100, "4": 120}', "no bucket 1"),
]


@pytest.mark.parametrize("text,msg", BAD)
def test_a_bad_bucket_costs_file_is_one_line_and_exit_2(tmp_path, text, msg):
    f = tmp_path / "b.json"
    if text is not None:
        f.write_text(text)
    r = CliRunner().invoke(main, ["whatif", str(DEMO), "--bucket-costs", str(f)])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recsys-doctor: error: ") and msg in lines[0], r.output
    assert "Traceback" not in r.output


def test_whatif_train_refuses_bucket_costs(tmp_path):
    f = tmp_path / "b.json"
    f.write_text('{"1": 100}')
    r = CliRunner().invoke(main, ["whatif", str(DEMO), "--train", "--bucket-costs", str(f)])
    assert r.exit_code == 2 and "a training loop does not have" in r.output and "Traceback" not in r.output


def test_profile_apply_reads_the_file_before_running_anything(tmp_path):
    f = tmp_path / "b.json"
    f.write_text('{"2": 100}')
    r = CliRunner().invoke(main, ["profile", str(ROOT / "examples" / "wdl_workload.py"), "--apply",
                                  "--bucket-costs", str(f), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "no bucket 1" in r.output and not (tmp_path / "out").exists()
    r = CliRunner().invoke(main, ["profile", str(ROOT / "examples" / "wdl_workload.py"), "--bucket-costs", str(f)])
    assert r.exit_code == 2 and "go with --apply" in r.output


# ------------------------------------------------------------------------------ the command

def _demo_one_query_ns(tmp_path) -> tuple[int, float]:
    """The sample trace's query count and one graphed query's GPU ns, by SQL over the same
    file: kernels a query + 200 ns a kernel (graph node gap) + the copies packed into 2
    transfers (2 x 2,000 ns + bytes / 20 B/ns), the WhatIfCosts defaults."""
    db = tmp_path / "demo.sqlite"
    with gzip.open(DEMO) as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    (units,), = sql_rows(db, "SELECT COUNT(*) FROM NVTX_EVENTS WHERE text = 'query'")
    (nk, kns), = sql_rows(db, "SELECT COUNT(*), SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    (nm, nbytes), = sql_rows(db, "SELECT COUNT(*), SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    (ns,), = sql_rows(db, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMSET")
    assert (nm + ns) / units >= 2  # both directions packed
    return units, kns / units + nk / units * 200 + 2 * 2_000 + nbytes / units / 20


def _row(output: str, label: str) -> list[str]:
    rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in output.splitlines() if ln.startswith("│")]
    return next(r for r in rows if r[0] == label)


def test_whatif_command_prices_batching_from_the_file_by_hand(tmp_path):
    units, one = _demo_one_query_ns(tmp_path)
    costs = tmp_path / "bucket_gpu_us.json"
    costs.write_text(json.dumps({"1": 240.0, "2": 290.0, "4": 330.0, "8": 400.0}))
    # 8 clients x 0.2 = 1.6: a mean batch of 2, bucket 2. g1 batched, one group, overlap 1:
    #   measured: 290 / 240 x one a batch; constant: (1 + 1 x 0.069) x one a batch
    #   gpu limit 1e9 x 2 / batch; clients 8e9 / (49,550 + batch); host 1e9 / 49,550
    measured, constant = one * 290 / 240, one * (1 + 1 * 0.069)
    x_meas = min(1e9 / 49_550, 1e9 * 2 / measured, 8e9 / (49_550 + measured))
    x_const = min(1e9 / 49_550, 1e9 * 2 / constant, 8e9 / (49_550 + constant))
    assert x_meas == pytest.approx(1e9 * 2 / measured) and x_meas < x_const  # GPU-bound, and slower
    label = "g1 merged own-pool graphs batched<=16"
    runs = {}
    for name, extra in (("constant", []), ("measured", ["--bucket-costs", str(costs)])):
        r = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["whatif", str(DEMO), "--clients", "8", *extra])
        assert r.exit_code == 0, r.output
        runs[name] = r.output
    assert f"{units} queries (query ranges), 8 clients" in runs["measured"]
    row_m, row_c = _row(runs["measured"], label), _row(runs["constant"], label)
    assert row_m[1] == f"{x_meas:,.1f}" and row_c[1] == f"{x_const:,.1f}"
    assert row_m[2] == f"{8 / x_meas * 1e3:,.3f}" and row_m[3] == "gpu"
    assert f"measured bucket costs in {costs}" in runs["measured"]
    # the same numbers in --json, unrounded
    r = CliRunner().invoke(main, ["whatif", str(DEMO), "--clients", "8", "--bucket-costs", str(costs), "--json"])
    d = json.loads(r.output)
    p = next(p for p in d["predictions"] if p["label"] == label)
    assert p["qps"] == pytest.approx(x_meas) and p["gpu_ns"] == pytest.approx(measured / 2)
    assert p["p50_ms"] == pytest.approx(8 / x_meas * 1e3) and d["bucket_costs"] == str(costs)
    # unbatched plans are priced as before: the same row either way
    assert _row(runs["measured"], "g4 merged own-pool graphs") == _row(runs["constant"], "g4 merged own-pool graphs")


# ------------------------------------------------------------------------------ profile --apply

def _cand(c: Candidate, qps: float | None, buckets: dict | None) -> CandidateResult:
    r = CandidateResult(Prediction(c, 1.0, 1.0, 1.0, "gpu", qps=1.0))
    if qps is not None:
        r.measured = {"qps": qps, "p50_ms": 1.0, "p99_ms": 2.0}
    if buckets is not None:
        r.info["bucket_gpu_us"] = buckets
    return r


def test_apply_writes_the_bucket_costs_it_measured(tmp_path):
    g4b, g8b, g4 = Candidate(4, batching=True), Candidate(8, batching=True), Candidate(4)
    cands = [_cand(g4, 9_000.0, None), _cand(g4b, 8_000.0, {"1": 240.0, "2": 290.0}),
             _cand(g8b, 8_500.0, {"1": 250.0, "2": 300.0})]
    # the chosen plan does not batch: the fastest measured batching one's costs (g8: 8,500 q/s)
    res = ApplyResult("serve", "w.py", g4, {}, None, cands, {})
    path = write_bucket_costs(res, tmp_path)
    assert json.loads(path.read_text()) == {"1": 250.0, "2": 300.0}
    assert res.files["bucket_costs"] == str(tmp_path / "bucket_gpu_us.json")
    assert res.to_dict()["bucket_costs_of"] == g8b.label
    # the written file (and apply.json's own key) are what --bucket-costs reads
    assert read_bucket_costs(path) == {1: 250_000.0, 2: 300_000.0}
    aj = tmp_path / "apply.json"
    aj.write_text(json.dumps(res.to_dict()))
    assert read_bucket_costs(aj) == {1: 250_000.0, 2: 300_000.0}
    # the chosen plan batches: its own costs, though slower
    res2 = ApplyResult("serve", "w.py", g4b, {}, None, cands, {})
    write_bucket_costs(res2, tmp_path)
    assert res2.bucket_gpu_us == {"1": 240.0, "2": 290.0}
    # the printed summary names the file and how to feed it back
    buf = io.StringIO()
    render_apply(res2.to_dict(), Console(file=buf, width=300, color_system=None))
    assert f"bucket costs: {tmp_path / 'bucket_gpu_us.json'}" in buf.getvalue()
    assert f"--bucket-costs {tmp_path / 'bucket_gpu_us.json'}" in buf.getvalue()


def test_apply_without_measured_bucket_costs_writes_none(tmp_path):
    cands = [_cand(Candidate(4), 9_000.0, None), _cand(Candidate(4, batching=True), None, {"1": 1.0})]
    res = ApplyResult("serve", "w.py", Candidate(4), {}, None, cands, {})
    assert write_bucket_costs(res, tmp_path) is None and not (tmp_path / "bucket_gpu_us.json").exists()
    assert "bucket_costs" not in res.files and res.to_dict()["bucket_gpu_us"] is None
    buf = io.StringIO()
    render_apply(res.to_dict(), Console(file=buf, width=300, color_system=None))
    assert "bucket costs" not in buf.getvalue()
