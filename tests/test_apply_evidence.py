"""The after-state evidence of ``profile --apply`` on a script, without a GPU (issue 25):

* the hook writes its ``stats()`` at exit to ``$RECSYS_DOCTOR_HOOK_STATS`` (after the script's
  threads and its own ``atexit`` functions, never breaking the program; a child interpreter
  whose threads the hook placed, a ``multiprocessing`` worker, writes its own beside it and the
  reader merges them), and the in-process hook of the torch backend does the same when stopped;
* syncs per query (step) and GPU busy before and after, on real Nsight Systems exports made on
  the GPU machine, against SQL of our own over the same files;
* the terminal and HTML renderings of the evidence and of the hook's call-site table.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from _sql import sql_rows
from recsys_doctor.applying.evidence import profiled_units, sync_evidence
from recsys_doctor.applying.report import before_after_rows
from recsys_doctor.applying.script_hook import read_hook_stats, script_env, script_treatment
from recsys_doctor.capture.profiling import ProfileResult
from recsys_doctor.cli.advise import demo_trace_path
from recsys_doctor.diagnose.advise import advise_trace
from recsys_doctor.loaders import load
from recsys_doctor.planning.io import write_plan
from recsys_doctor.planning.whatif import Candidate
from recsys_doctor.reports.apply_evidence import MAX_SITES, evidence_view, render_evidence
from test_summary_real import nsys_expected

ADVISED = {"schema": 1, "kind": "serving", "stream_groups": {"count": 4, "because": [], "reason": "x"},
           "merge_copy_compute": {"enabled": True, "because": [], "reason": "x"},
           "per_stream_allocators": {"enabled": False, "because": [], "reason": "x"},
           "cuda_graphs": {"enabled": True, "because": [], "reason": "x"}, "findings": []}


def _plan(tmp_path: Path, groups: int = 3) -> Path:
    return write_plan(tmp_path / "plan.json", ADVISED, Candidate(groups, True, False, True))


# ------------------------------------------------------------------------------ the hook's stats file

# A plain program that records call sites through the hook's own accounting, from threads it
# never joins, from a thread pool it never shuts down, from its own atexit function, and from a
# child interpreter (which inherits the hook and must not replace the parent's file).
_SCRIPT = r'''
import atexit, concurrent.futures, os, subprocess, sys, threading, time
acc = sys.modules["_recsys_doctor_autoapply.accounting"]

def late(k):
    time.sleep(0.2)  # still running when the main thread returns
    acc.taken_over("model", f"late.py:{k}", 10)
    acc.fell_back("h2d", "late.py:99", "pageable source", 2)

for k in range(3):
    threading.Thread(target=late, args=(k,)).start()
concurrent.futures.ThreadPoolExecutor(2).submit(lambda: (time.sleep(0.2), acc.taken_over("d2h", "pool.py:7", 5)))
atexit.register(lambda: acc.fell_back("h2d", "late.py:99", "no graph for this shape"))
child = ("import sys; a = sys.modules['_recsys_doctor_autoapply.accounting']; "
         "a.taken_over('model', 'child.py:1', 1000)")
subprocess.run([sys.executable, "-c", child], check=True)
print("done")
'''


def test_hook_writes_its_stats_at_exit_after_the_threads(tmp_path):
    stats_path = tmp_path / "out" / "hook_stats.json"
    stats_path.parent.mkdir()
    stats_path.write_text('{"stale": true}')  # left by an earlier run: removed by script_env
    env = script_env(_plan(tmp_path), hook_dir=tmp_path / "hook", stats_path=stats_path)
    assert not stats_path.exists()
    script = tmp_path / "s.py"
    script.write_text(_SCRIPT)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "done"
    st = read_hook_stats(stats_path)
    assert st is not None and st["active"] is True and st["groups"] == 3 and st["graphs"] is True
    assert st["not_applied"] is None
    sites = {(s["kind"], s["site"]): s for s in st["sites"]}
    # 3 unjoined threads, 10 calls each; the pool's 5; the atexit function's fallback; no child's
    assert set(sites) == {("model", "late.py:0"), ("model", "late.py:1"), ("model", "late.py:2"),
                          ("h2d", "late.py:99"), ("d2h", "pool.py:7")}
    assert all(sites[("model", f"late.py:{k}")]["taken_over"] == 10 for k in range(3))
    h2d = sites[("h2d", "late.py:99")]
    assert h2d["taken_over"] == 0 and h2d["fallback"] == 3 * 2 + 1
    assert h2d["reasons"] == {"pageable source": 6, "no graph for this shape": 1}
    assert sites[("d2h", "pool.py:7")]["taken_over"] == 5
    assert [p.name for p in stats_path.parent.iterdir()] == ["hook_stats.json"]  # no temp file left


# Two worker processes of the program whose threads the hook placed, each recording its calls: one
# with two threads in plan groups (counted in ``started``, as the hook counts a thread it gives a
# plan group), one serving on its main thread (a group of its own: ``late_threads``); and the
# program's own.
_WORKERS = r'''
import multiprocessing as mp, sys

def work(k):
    state = sys.modules["_recsys_doctor_autoapply._common"]._state
    state["started" if k == 0 else "late_threads"] += 2 if k == 0 else 1
    acc = sys.modules["_recsys_doctor_autoapply.accounting"]
    acc.taken_over("model", "w.py:10", 100 + k)
    acc.fell_back("model", "w.py:10", "warming up", 2)
    acc.taken_over("h2d", f"w.py:{20 + k}", 7)

if __name__ == "__main__":
    sys.modules["_recsys_doctor_autoapply.accounting"].taken_over("model", "w.py:10", 1)
    ps = [mp.get_context("spawn").Process(target=work, args=(k,)) for k in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    print("done")
'''


def test_worker_processes_stats_are_merged_with_the_programs(tmp_path):
    stats_path = tmp_path / "hook_stats.json"
    stale = tmp_path / "hook_stats.json.proc-1.json"
    stale.write_text('{"threads": 99}')  # a worker's file left by an earlier run: removed by script_env
    env = script_env(_plan(tmp_path), hook_dir=tmp_path / "hook", stats_path=stats_path)
    assert not stale.exists()
    script = tmp_path / "w.py"
    script.write_text(_WORKERS)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "done", p.stderr
    assert len(list(tmp_path.glob("hook_stats.json.proc-*.json"))) == 2
    st = read_hook_stats(stats_path)
    assert st["processes"] == 3 and st["threads"] == 2 and st["late_threads"] == 1 and st["groups"] == 3
    sites = {(s["kind"], s["site"]): s for s in st["sites"]}
    assert set(sites) == {("model", "w.py:10"), ("h2d", "w.py:20"), ("h2d", "w.py:21")}
    m = sites[("model", "w.py:10")]
    assert (m["taken_over"], m["fallback"], m["reasons"]) == (1 + 100 + 101, 4, {"warming up": 4})
    assert sites[("h2d", "w.py:20")]["taken_over"] == sites[("h2d", "w.py:21")]["taken_over"] == 7


def test_merged_stats_add_counters_and_batch_sizes():
    from recsys_doctor.applying.script_hook import merge_hook_stats

    main = {"groups": 2, "graphs": True, "active": True, "replays": 5, "threads": 0, "batch_sizes": {"2": 1},
            "fallbacks": ["a"], "sites": []}
    child = {"groups": 2, "active": True, "replays": 30, "threads": 2, "captured": 3, "batch_sizes": {"2": 4, "8": 1},
             "fallbacks": ["a", "b"], "sites": [{"kind": "model", "site": "x.py:1", "taken_over": 30, "fallback": 0,
                                                  "reasons": {}, "batched": 8, "batch_sizes": {"2": 4}}]}
    st = merge_hook_stats(main, [child, dict(child, late_threads=1)])
    assert (st["replays"], st["threads"], st["captured"], st["processes"]) == (65, 4, 6, 3)
    assert st["late_threads"] == 1
    assert st["batch_sizes"] == {"2": 9, "8": 2} and st["fallbacks"] == ["a", "b"]
    assert st["sites"] == [{"kind": "model", "site": "x.py:1", "taken_over": 60, "fallback": 0, "reasons": {},
                            "batched": 16, "batch_sizes": {"2": 8}}]
    assert merge_hook_stats(main, []) == {**main, "processes": 1}


def test_a_stats_file_that_cannot_be_written_is_one_line(tmp_path):
    env = script_env(_plan(tmp_path), hook_dir=tmp_path / "hook", stats_path=tmp_path / "no" / "such" / "s.json")
    p = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "ran\n"
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("recsys-doctor apply: could not write the hook's stats to ")


def test_a_plan_not_applied_is_in_the_stats(tmp_path):
    stats_path = tmp_path / "s.json"
    env = script_env(_plan(tmp_path), hook_dir=tmp_path / "hook", stats_path=stats_path)
    Path(env["RECSYS_DOCTOR_PLAN"]).write_text('{"runtime": {"groups": 0}}')
    p = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "ran\n"
    st = read_hook_stats(stats_path)
    assert st is not None and st["active"] is False and "groups" in st["not_applied"]
    assert st["sites"] == []


def test_in_process_hook_writes_its_stats_when_stopped(tmp_path):
    """The torch backend runs the script in this process: stopping the treatment writes the file."""
    stats_path = tmp_path / "after" / "hook_stats.json"
    stats_path.parent.mkdir()
    stop = script_treatment(_plan(tmp_path, groups=2), stats_path=stats_path).activate()  # type: ignore[misc]
    try:
        sys.modules["_recsys_doctor_autoapply.accounting"].taken_over("model", "inproc.py:3", 7)
    finally:
        stop()
    st = read_hook_stats(stats_path)
    assert st is not None and st["groups"] == 2
    assert [(s["site"], s["taken_over"]) for s in st["sites"]] == [("inproc.py:3", 7)]


def test_read_hook_stats_without_a_file(tmp_path):
    assert read_hook_stats(tmp_path / "none.json") is None
    (tmp_path / "bad.json").write_text("{half")
    assert read_hook_stats(tmp_path / "bad.json") is None


# ------------------------------------------------------------------------------ syncs per query, GPU busy

#: the sync-api analyzer's definition (analyzers/sync_api.py), written out as SQL: every runtime or
#: driver call named *Synchronize*, every copy call without Async, and every call that launched a
#: device-to-host copy into pageable memory (nsys numbers memory kinds from 0 = pageable; copyKind 2
#: is DtoH), each call once; correlation ids are per process (pid = globalTid >> 24)
SYNC_SQL = """
select count(*) from CUPTI_ACTIVITY_KIND_RUNTIME r join StringIds s on s.id = r.nameId
left join (select distinct globalPid >> 24 as pid, correlationId as corr from CUPTI_ACTIVITY_KIND_MEMCPY
           where copyKind = 2 and dstKind = 0) pg on pg.corr = r.correlationId and pg.pid = r.globalTid >> 24
where s.value like '%Synchronize%'
   or ((s.value like 'cudaMemcpy%' or s.value like 'cuMemcpy%' or s.value like 'hipMemcpy%')
       and s.value not like '%Async%')
   or pg.corr is not null
"""


def _gunzip(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name.removesuffix(".gz")
    with gzip.open(src) as f, open(dst, "wb") as g:
        shutil.copyfileobj(f, g)
    return dst


def _profiled(db: Path, out: Path, line: dict) -> ProfileResult:
    """A script's profile as ``profile`` leaves it: the diagnosis of its trace, and its
    program.log (nsys's own lines around the script's last JSON line)."""
    out.mkdir()
    (out / "program.log").write_text("Collecting data...\n" + json.dumps(line) + "\nGenerated:\n    trace.nsys-rep\n")
    return ProfileResult(advise=advise_trace(load(db)), capture={}, out_dir=out)


def _nvtx_count(db: Path, name: str) -> int:
    return sql_rows(db, f"select count(*) from NVTX_EVENTS where text = '{name}'")[0][0]


def test_syncs_per_query_before_and_after_match_sql(tmp_path, project_data):
    """Before: the demo trace (4 eager threads on one stream); after: 4 threads each with its own
    stream and CUDA graph - the same wide&deep serving program on the GPU machine (README of
    tests/data). The queries are the NVTX ``query`` ranges, as the script would report them."""
    before_db = _gunzip(demo_trace_path(), tmp_path)
    after_db = _gunzip(project_data / "wdl_graphs_q4" / "wdl_graphs_q4.sqlite.gz", tmp_path)
    qb, qa = _nvtx_count(before_db, "query"), _nvtx_count(after_db, "query")
    sb, sa = sql_rows(before_db, SYNC_SQL)[0][0], sql_rows(after_db, SYNC_SQL)[0][0]
    assert (qb, qa, sb, sa) == (109, 897, 175, 967)  # the README's counts; each sync counted in the CLI check
    before = _profiled(before_db, tmp_path / "before", {"qps": 500.0, "queries": qb, "threads": 4})
    after = _profiled(after_db, tmp_path / "after", {"qps": 4000.0, "queries": qa, "threads": 4})
    ev = sync_evidence(before, after)
    assert ev["unit"] == "query"
    assert ev["syncs"] == {"before": sb, "after": sa} and ev["units"] == {"before": qb, "after": qa}
    assert ev["syncs_per_unit"]["before"] == pytest.approx(sb / qb, abs=1e-4)
    assert ev["syncs_per_unit"]["after"] == pytest.approx(sa / qa, abs=1e-4)
    for side, db in (("before", before_db), ("after", after_db)):
        busy = nsys_expected(db)["gpu_utilization"]  # SQL windows, hand-written interval union
        assert ev["gpu_busy_pct"][side] == pytest.approx(100 * busy, abs=0.01)
    assert ev["gpu_busy_pct"]["after"] > ev["gpu_busy_pct"]["before"]


def test_pageable_read_backs_count_as_syncs_per_step(tmp_path, project_data):
    """A loop that reads a scalar back with ``.cpu()`` into pageable memory: the async copy
    blocks like a sync, so it counts (the pingpong fixture: 400 steps)."""
    db = _gunzip(project_data / "patho_pingpong" / "pingpong.sqlite.gz", tmp_path)
    pageable = sql_rows(db, "select count(*) from CUPTI_ACTIVITY_KIND_MEMCPY where copyKind = 2 and dstKind = 0")[0][0]
    named = sql_rows(db, "select count(*) from CUPTI_ACTIVITY_KIND_RUNTIME r join StringIds s on s.id = r.nameId "
                         "where s.value like '%Synchronize%'")[0][0]
    syncs = sql_rows(db, SYNC_SQL)[0][0]
    assert pageable > 0 and syncs == named + pageable
    steps = _nvtx_count(db, "step")
    prof = _profiled(db, tmp_path / "p", {"step_ms": 1.5, "steps": steps})
    assert profiled_units(prof) == (steps, "step")
    ev = sync_evidence(prof, None)
    assert ev["unit"] == "step" and ev["syncs"]["before"] == syncs
    assert ev["syncs_per_unit"] == {"before": pytest.approx(syncs / steps, abs=1e-4), "after": None}


def test_units_of_a_profile(tmp_path):
    class P:
        measurement = None

        def __init__(self, out: Path) -> None:
            self.out_dir = out

    def units(text: str) -> tuple:
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        (d / "program.log").write_text(text)
        return profiled_units(P(d))

    assert units('{"qps": 10, "queries": 40}\n') == (40, "query")
    assert units('{"qps": 10, "calls": 12}\n') == (12, "query")
    assert units('{"step_ms": 2.0, "steps": 30}\n') == (30, "step")
    assert units('{"qps": 10}\n') == (None, "query")  # no count: no syncs per query
    assert units("no measurement\n") == (None, "query")
    assert profiled_units(P(tmp_path / "missing")) == (None, "query")
    # a script printing no q/s (measured by the hook's meter): its last JSON line's own count
    assert units('{"served": 3000, "queries": 3000, "checksum": 1.5}\nINFO done\n') == (3000, "query")
    assert units('{"calls": 7}\n{"note": "x"}\n') == (None, "query")  # (the last JSON line only)
    # a training loop printing no step time (examples/heldout/log_train.py): its steps, per step
    assert units('INFO step 500 loss 6.2\n{"script": "log_train", "steps": 600, "checksum": 5865.0}\n') == (600, "step")
    assert units('{"steps": 600, "queries": 3000}\n') == (3000, "query")  # (a count of queries wins)


def test_before_after_table_has_the_syncs_rows():
    rows = {r["key"]: r for r in before_after_rows({"syncs_per_query": 3.0, "trace_util": 30.0},
                                                   {"syncs_per_query": 0.75, "trace_util": 60.0})}
    assert rows["syncs_per_query"]["ratio"] == 0.25 and rows["syncs_per_query"]["metric"] == "syncs per query (trace)"
    assert rows["trace_util"]["ratio"] == 2.0 and "syncs_per_step" not in rows


# ------------------------------------------------------------------------------ the reports

STATS = {"active": True, "groups": 2, "graphs": True, "threads": 8, "captured": 2, "replays": 3984,
         "thread_graphs": 0, "thread_replays": 0, "materialized": 0, "fallbacks": [], "not_applied": None,
         "sites": [{"kind": "model", "site": "serve.py:41", "taken_over": 3984, "fallback": 16,
                    "reasons": {"warm-up before capture": 16}},
                   {"kind": "h2d", "site": "serve.py:39", "taken_over": 0, "fallback": 4000,
                    "reasons": {"pageable source [not pinned]": 3000, "other": 1000}},
                   {"kind": "d2h", "site": "serve.py:43", "taken_over": 4000, "fallback": 0, "reasons": {}}]}
EVIDENCE = {"unit": "query", "syncs": {"before": 6000, "after": 1000}, "units": {"before": 2000, "after": 4000},
            "syncs_per_unit": {"before": 3.0, "after": 0.25}, "gpu_busy_pct": {"before": 31.5, "after": 72.25},
            "hook": {"measured": STATS, "profiled": None}}


def _text(ev: dict) -> str:
    buf = io.StringIO()
    render_evidence(ev, Console(file=buf, width=140, color_system=None))
    return buf.getvalue()


def test_terminal_evidence_and_call_site_table():
    out = _text(EVIDENCE)
    assert "Synchronizing CUDA calls per query: 3 before -> 0.25 after (before: 6,000 in 2,000 queries; " \
           "after: 1,000 in 4,000 queries)" in out
    assert "GPU busy (kernels and graphs, first to last GPU operation of the trace): 31.5% before -> 72.2% after" in out
    assert "Hook (the kept plan's measured run): 8 threads in 2 stream groups; 2 graphs captured, replayed " \
           "3,984 times; 0 fallbacks" in out
    lines = out.splitlines()
    rows = [ln for ln in lines if "serve.py:" in ln]
    # most calls first (as accounting.sites() orders them), each with its words and counts
    assert [r.split("│")[1].strip() for r in rows] == ["serve.py:41", "serve.py:39", "serve.py:43"]
    cells = [[c.strip() for c in r.split("│")[1:-1]] for r in rows]
    assert cells[0] == ["serve.py:41", "model call", "3,984", "16", "warm-up before capture"]
    assert cells[1] == ["serve.py:39", "copy to GPU", "0", "4,000", "pageable source [not pinned]"]  # the top reason
    assert cells[2] == ["serve.py:43", "read back", "4,000", "0", ""]


def test_terminal_evidence_edge_cases():
    many = dict(STATS, sites=[{"kind": "h2d", "site": f"s.py:{k}", "taken_over": 1, "fallback": 0, "reasons": {}}
                              for k in range(MAX_SITES + 4)])
    view = evidence_view(dict(EVIDENCE, hook={"measured": many, "profiled": None}))
    assert view is not None and len(view["sites"]) == MAX_SITES and view["more"] == 4
    assert "and 4 more lines" in _text(dict(EVIDENCE, hook={"measured": many, "profiled": None}))
    out = _text(dict(EVIDENCE, hook={"measured": None, "profiled": None}))
    assert "Hook (the after profile): the run wrote no stats" in out
    bad = dict(STATS, active=False, not_applied="ValueError: groups must be >= 1", sites=[])
    assert "the plan was not applied: ValueError: groups must be >= 1" in _text(dict(EVIDENCE, hook={"measured": bad}))
    # a workload: no hook, no table; no count of queries: the raw sync counts
    out = _text({**EVIDENCE, "hook": None, "syncs_per_unit": {"before": None, "after": None}})
    assert "Synchronizing CUDA calls: 6,000 before -> 1,000 after (the script reported no count of queries" in out
    assert "Hook" not in out and "line" not in out
    assert evidence_view({}) is None and _text({}) == ""


def test_compare_page_shows_the_evidence(tmp_path):
    from recsys_doctor.reports.html import render_compare_html

    a = advise_trace(load(demo_trace_path()))
    evil = dict(STATS, sites=[dict(STATS["sites"][0], site="<script>x</script>.py:1")])
    m = {"kind": "serve", "chosen": "g2", "rows": [], "candidates": [],
         "evidence": dict(EVIDENCE, hook={"measured": evil, "profiled": STATS})}
    doc = render_compare_html(a, a, measured=m)
    assert "<h2>Evidence</h2>" in doc and "Synchronizing CUDA calls per query: 3 before -&gt; 0.25 after" in doc
    assert "Script lines the hook handled (the kept plan&#x27;s measured run)" in doc
    assert "&lt;script&gt;x&lt;/script&gt;.py:1" in doc and "<script>" not in doc
    assert "<td class='num'>3,984</td>" in doc and "Hook (the after profile): 8 threads" in doc
    assert "<h2>Evidence</h2>" not in render_compare_html(a, a, measured={**m, "evidence": {}})


def test_batched_calls_are_shown_per_line(tmp_path):
    """Where the plan batched (the stats as read back from the JSON file: size keys are
    strings), the hook line gives the batches and the table the batched calls per line with
    their batch sizes, largest first; a run without batches keeps the table as it was."""
    from recsys_doctor.reports.html import render_compare_html

    site = dict(STATS["sites"][0], batched=3000, batch_sizes={"8": 250, "4": 200, "2": 100})
    st = json.loads(json.dumps(dict(STATS, batching=True, max_batch=8, batches=550, batched_calls=3000,
                                    batch_sizes={"2": 100, "4": 200, "8": 250}, sites=[site, *STATS["sites"][1:]])))
    ev = dict(EVIDENCE, hook={"measured": st, "profiled": None})
    out = _text(ev)
    # 8 x 250 + 4 x 200 + 2 x 100 = 3,000 calls in 550 batches
    assert "batching up to 8: 3,000 calls in 550 batches (8 x 250, 4 x 200, 2 x 100)" in out.replace("\n", " ")
    row = next(ln for ln in out.splitlines() if "serve.py:41" in ln)
    assert [c.strip() for c in row.split("│")[1:-1]] == [
        "serve.py:41", "model call", "3,984", "16", "3,000", "8 x 250, 4 x 200, 2 x 100", "warm-up before capture"]
    h2d = next(ln for ln in out.splitlines() if "serve.py:39" in ln)
    assert [c.strip() for c in h2d.split("│")[1:-1]][4:6] == ["0", "none"]
    a = advise_trace(load(demo_trace_path()))
    doc = render_compare_html(a, a, measured={"kind": "serve", "chosen": "g2", "rows": [], "candidates": [],
                                              "evidence": ev})
    assert "<th>batched</th>" in doc and "<td class='num'>3,000</td><td>8 x 250, 4 x 200, 2 x 100</td>" in doc
    assert "batched" not in _text(EVIDENCE)


def test_profile_apply_report_shows_the_evidence_under_the_table():
    """The whole --apply part of the terminal report, from apply.json's dict."""
    from recsys_doctor.applying.report import ApplyResult
    from recsys_doctor.cli.profile import render_apply

    before = {"qps": 1000.0, "trace_util": 31.5, "syncs_per_query": 3.0}
    after = {"qps": 8000.0, "trace_util": 72.25, "syncs_per_query": 0.25}
    d = ApplyResult(kind="script", target="serve.py", chosen=Candidate(2, True, False, True), before=before,
                    after=after, candidates=[], stats={}, evidence=EVIDENCE).to_dict()
    assert json.loads(json.dumps(d))["evidence"]["hook"]["measured"]["sites"][0]["site"] == "serve.py:41"
    buf = io.StringIO()
    render_apply(d, Console(file=buf, width=140, color_system=None))
    out = buf.getvalue()
    row = next(ln for ln in out.splitlines() if ln.startswith("│ syncs per query (trace)"))
    assert [c.strip() for c in row.split("│")[1:-1]] == ["syncs per query (trace)", "3.000", "0.250", "0.083x"]
    assert out.index("Before / after") < out.index("Synchronizing CUDA calls per query") < out.index("serve.py:41")


def test_an_unpriced_batching_candidate_is_reported_as_measured_only():
    """A script's batching candidate has no estimate: the terminal table and compare.html show
    its measured numbers beside an empty prediction, its bound 'unpriced' and why."""
    from recsys_doctor.applying.report import ApplyResult, CandidateResult, measured_tables
    from recsys_doctor.cli.profile import render_apply
    from recsys_doctor.planning.whatif import estimate, trace_stats
    from recsys_doctor.reports.html import render_compare_html

    a = advise_trace(load(demo_trace_path()))
    cand = Candidate(2, True, False, True, batching=True, max_batch=32)
    pred = estimate(trace_stats(a.trace), cand, clients=8, script=True)
    r = CandidateResult(pred, measured={"qps": 4200.0, "p99_ms": 3.5})
    res = ApplyResult(kind="script", target="serve.py", chosen=cand, before={"qps": 1000.0},
                      after={"qps": 4200.0}, candidates=[r], stats={})
    buf = io.StringIO()
    render_apply(res.to_dict(), Console(file=buf, width=200, color_system=None))
    row = next(ln for ln in buf.getvalue().splitlines() if "batched<=32" in ln)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[:6] == ["g2 merged shared-pool graphs batched<=32", "-", "4,200.0", "-", "3.500", "unpriced"]
    out = buf.getvalue()
    assert cells[6] == "[1]" and "\n[1] not priced" in out  # the note below the table
    m = measured_tables(res)
    assert m["candidates"] == [{"plan": cand.label, "predicted": None, "measured": 4200.0, "p99_ms": 3.5, "error": None}]
    assert "g2 merged shared-pool graphs batched&lt;=32" in render_compare_html(a, a, measured=m)


def test_calls_served_by_the_runtime_are_in_the_hook_line():
    """A batching plan whose calls the hook handed to the runtime's batching (the route of
    ``_autoapply/served.py``): the hook line says how many, in how many of the runtime's batches,
    by size, largest first; none said where no call was served."""
    st = json.loads(json.dumps(dict(STATS, batching=True, max_batch=8, batches=2, batched_calls=8,
                                    batch_sizes={"4": 2}, served_calls=5_457,
                                    served_batch_sizes={"1": 44, "2": 136, "3": 400, "4": 555, "8": 9})))
    out = _text(dict(EVIDENCE, hook={"measured": st, "profiled": None})).replace("\n", " ")
    # 44 + 136 + 400 + 555 + 9 = 1,144 batches
    assert "5,457 calls served by the runtime's batching, in 1,144 batches (8 x 9, 4 x 555, 3 x 400, 2 x 136, 1 x 44)" in out
    none = _text(dict(EVIDENCE, hook={"measured": dict(st, served_calls=0), "profiled": None}))
    assert "served by the runtime" not in none


def test_the_hook_line_says_over_how_many_processes():
    """Stats merged from worker processes (``read_hook_stats``): the hook line names the count."""
    st = json.loads(json.dumps(dict(STATS, threads=4, processes=3)))
    out = _text(dict(EVIDENCE, hook={"measured": st, "profiled": None})).replace("\n", " ")
    assert "4 threads in " in out and " (over 3 processes)" in out
    one = _text(dict(EVIDENCE, hook={"measured": dict(st, processes=1), "profiled": None}))
    assert "processes" not in one


def test_the_hook_line_names_threads_placed_at_their_first_call():
    """A script serving from its main thread (an asyncio server calling the model inline): no
    thread placed at its start, one placed at its first model call; the hook line says so."""
    st = json.loads(json.dumps(dict(STATS, threads=0, late_threads=1)))
    out = _text(dict(EVIDENCE, hook={"measured": st, "profiled": None})).replace("\n", " ")
    assert "0 threads in " in out and ", 1 placed at their first model call (a group each)" in out
    none = _text(dict(EVIDENCE, hook={"measured": dict(st, late_threads=0), "profiled": None}))
    assert "first model call" not in none


# A worker process that a pool terminates (``with multiprocessing.Pool() as pool:`` ends in
# SIGTERM, so no atexit function runs there): once a thread of it is placed (here: its main
# thread given a group of its own, as the hook counts it), its stats are written every
# RECSYS_DOCTOR_HOOK_STATS_EVERY_S seconds, so its counts up to the last snapshot reach the report.
_TERMINATED = r'''
import multiprocessing as mp, sys, time

def work(ready):
    hook = "_recsys_doctor_autoapply"
    sys.modules[hook + "._common"]._state["late_threads"] += 1
    sys.modules[hook + ".report"].snapshots_in_child()
    sys.modules[hook + ".accounting"].taken_over("model", "pool.py:5", 42)
    ready.set()
    time.sleep(60)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=work, args=(ready,))
    p.start()
    assert ready.wait(60)
    time.sleep(1.0)  # (several snapshots)
    p.terminate()
    p.join()
    print(p.exitcode)
'''


def test_a_terminated_worker_process_keeps_its_counts_to_its_last_snapshot(tmp_path):
    stats_path = tmp_path / "hook_stats.json"
    env = script_env(_plan(tmp_path), hook_dir=tmp_path / "hook", stats_path=stats_path)
    env["RECSYS_DOCTOR_HOOK_STATS_EVERY_S"] = "0.1"
    script = tmp_path / "t.py"
    script.write_text(_TERMINATED)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "-15", p.stderr  # (killed by SIGTERM, as a pool's worker)
    assert len(list(tmp_path.glob("hook_stats.json.proc-*.json"))) == 1
    assert not list(tmp_path.glob("*.tmp"))
    st = read_hook_stats(stats_path)
    assert st["processes"] == 2 and st["late_threads"] == 1
    assert [(s["kind"], s["site"], s["taken_over"]) for s in st["sites"]] == [("model", "pool.py:5", 42)]
