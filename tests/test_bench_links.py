"""Every benchmark number in README.md and docs/ names its result file, and the file is there.

The links from README.md, docs/*.md and the benchmarks' own READMEs into ``bench/`` must all
resolve; every kept result file must have a row in ``bench/results/README.md`` (the index of
which result backs which claim); and a handful of headline numbers are recomputed here from
the JSON their paragraph links (the speed table, the apply speedups, the serving sweep table,
the runtime's 8-client figures, the engine table, the 64-rank times), so a number that drifts
from its file, or a cited file that is deleted, fails."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: a code span that is a bench path (no spaces, no glob or brace patterns)
SPAN = re.compile(r"`(bench/[\w./-]+)`")


def _bench_targets(md: Path) -> list[tuple[str, Path]]:
    """``(link as written, resolved path)`` for every link of ``md`` that lands in bench/."""
    out = []
    for target in LINK.findall(md.read_text()):
        if "://" in target or target.startswith("#"):
            continue
        p = (md.parent / target.split("#")[0]).resolve()
        if p == BENCH or BENCH in p.parents:
            out.append((target, p))
    return out


def _exists(p: Path) -> bool:
    return p.is_file() or (p.is_dir() and any(p.iterdir()))


def _bench_mds() -> list[Path]:
    return sorted(BENCH.rglob("README.md"))


def test_every_link_into_bench_resolves():
    missing, n = [], 0
    for md in DOCS + _bench_mds():
        for target, p in _bench_targets(md):
            n += 1
            if not _exists(p):
                missing.append(f"{md.relative_to(ROOT)}: {target}")
    assert not missing, "links into bench/ that lead nowhere:\n" + "\n".join(missing)
    assert n > 80  # README and docs cite dozens of result files: a parser that finds none is broken


def test_every_bench_path_named_in_the_docs_exists():
    """A path written as code (`bench/...`) outside a link must exist too: a moved or
    removed benchmark file leaves no stale name behind."""
    missing = [f"{md.relative_to(ROOT)}: {s}" for md in DOCS for s in SPAN.findall(md.read_text())
               if not _exists(ROOT / s.rstrip("/"))]
    assert not missing, "\n".join(missing)


def _result_files() -> list[Path]:
    """Every kept result: under a benchmark's ``results/`` and in ``bench/results/`` itself."""
    found = [*BENCH.glob("*/results/**/*"), *(BENCH / "results").glob("*")]
    return sorted({p for p in found if p.is_file() and p.name != "README.md"})


def test_every_kept_result_has_a_row_in_the_index():
    index = BENCH / "results" / "README.md"
    rows = {p for _, p in _bench_targets(index)}
    files = _result_files()
    assert len(files) > 50
    orphans = [str(f.relative_to(ROOT)) for f in files
               if f not in rows and not any(d in rows for d in f.parents)]
    assert not orphans, "result files the index does not map to a claim:\n" + "\n".join(orphans)


def test_the_fixed_result_paths_stay():
    """Issue 24 fixes the serving sweep's path (issue 25's suite will sit beside it)."""
    assert (BENCH / "results" / "serving_sweep_h100.json").is_file()
    readme = (BENCH / "serving" / "README.md").read_text()
    assert "../results/serving_sweep_h100.json" in readme


# --- headline numbers, recomputed from the JSON their paragraph links -------------------


def _paragraph(md: Path, needle: str) -> str:
    """The paragraph (blank-line separated block) of ``md`` that contains ``needle``."""
    paras = [p for p in re.split(r"\n\s*\n", md.read_text()) if needle in p]
    assert len(paras) == 1, f"{needle!r} in {len(paras)} paragraphs of {md.name}"
    return paras[0]


def _linked_json(md: Path, text: str, name_part: str) -> dict | list:
    """The one JSON linked from ``text`` whose path contains ``name_part``, loaded."""
    hits = {(md.parent / t).resolve() for t in LINK.findall(text) if t.endswith(".json") and name_part in t}
    assert len(hits) == 1, f"{name_part!r}: {hits}"
    return json.loads(hits.pop().read_text())


def _x(v: float, nd: int = 1) -> str:
    return f"{v:.{nd}f}x"


def _mb(v: float) -> str:
    return f"{int(v + 0.5)} MB"


def _table_after(md: Path, header_start: str) -> list[list[str]]:
    """The body rows of the markdown table whose header line starts with ``header_start``."""
    lines = md.read_text().splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_readme_speed_table_is_the_linked_run():
    readme = ROOT / "README.md"
    doc = _linked_json(readme, _paragraph(readme, "Latest run:"), "scale_")
    table = _table_after(readme, "| activity rows | export | recsys-doctor")
    by_rows = {f"{r['activity_rows'] / 1e6:.1f}M": r for r in doc["results"]}
    assert len(table) == len(by_rows) + 1  # + the Kineto row
    for cells in table[:-1]:
        r = by_rows[cells[0]]
        ours, before = r["recsys_doctor"], r["recsys_doctor_before"]
        assert cells[2] == f"{ours['seconds']:.3f} s / {_mb(ours['peak_rss_mb'])}"
        assert cells[3] == f"{before['seconds']:.3f} s / {_mb(before['peak_rss_mb'])}"
        cold = (r.get("nsys_ai") or {}).get("cold")
        if cold:
            assert cells[4].startswith(f"{cold['seconds']:.3f} s / {_mb(cold['peak_rss_mb'])}")
        else:
            assert cells[4] == "not run"
    k = doc["kineto"]
    assert table[-1][2] == (f"{k['advise']['seconds']:.3f} s / {_mb(k['advise']['peak_rss_mb'])} (load alone "
                            f"{k['load_only']['seconds']:.3f} s / {_mb(k['load_only']['peak_rss_mb'])})")
    ten = by_rows["9.9M"]
    ratio = ten["nsys_ai"]["cold"]["seconds"] / ten["recsys_doctor"]["seconds"]
    assert f"{ratio:.2f}x faster than nsys-ai cold" in readme.read_text()


def test_readme_apply_speedups_are_the_linked_run():
    readme = ROOT / "README.md"
    par = _paragraph(readme, "the wide&deep workload with 8 threads goes from")
    runs = _linked_json(readme, par, "apply_h100_summary")["runs"]
    flat = " ".join(par.split())
    wdl = runs["wdl"]["table"]
    qb, qa = wdl["qps"]["before"], wdl["qps"]["after"]
    p99 = wdl["p99_ms"]["after"] / wdl["p99_ms"]["before"]
    assert f"{qb:,.0f} to {qa:,.0f} queries/s ({_x(qa / qb)}, p99 {p99:.3f}x)" in flat
    s, cli = runs["script"]["table"]["qps"], runs["script_apply_cli"]
    assert f"script {_x(s['after'] / s['before'])} ({_x(cli['after_qps'] / cli['before_qps'])} through `apply`)" in flat
    m = runs["mmoe"]["table"]["step_ms"]
    assert f"from {m['before']:.2f} to {m['after']:.2f} ms ({_x(m['before'] / m['after'], 2)})" in flat


def test_serving_sweep_table_is_the_linked_run():
    md = ROOT / "docs" / "runtime.md"
    rows = _linked_json(md, _paragraph(md, "**Measured** ("), "serving_sweep_h100")
    qps = {(r["config"], r["Q"]): r for r in rows}
    header = _table_after(md, "| Q | handroll_prepacked")
    head = next(line for line in md.read_text().splitlines() if line.startswith("| Q | handroll_prepacked"))
    configs = [c.strip() for c in head.strip("|").split("|")][1:]
    configs = [c if c.startswith("handroll") or c.startswith("runtime") else "runtime_" + c for c in configs]
    assert len(header) == 5
    for cells in header:
        q = int(cells[0])
        hand = qps[("handroll_prepacked", q)]
        assert cells[1].startswith(f"{hand['qps']:,.0f}")
        if "p99" in cells[1]:
            assert f"p99 {hand['p99_ms']:.1f} ms" in cells[1]
        for config, cell in zip(configs[1:], cells[2:]):
            r = qps[(config, q)]
            assert cell.startswith(_x(r["qps"] / hand["qps"], 2)), (config, q, cell)
            if "(" in cell and "," in cell:
                assert f"({r['qps']:,.0f}" in cell
    # the README's summary of the same run
    readme = ROOT / "README.md"
    par = " ".join(_paragraph(readme, "in one H100 sweep").split())
    assert _linked_json(readme, par, "serving_sweep_h100") == rows
    r64, r128 = (qps[("runtime_batched_call", q)]["qps"] / qps[("handroll_prepacked", q)]["qps"] for q in (64, 128))
    assert f"at {_x(r64, 2)} / {_x(r128, 2)} the pre-packed" in par
    assert max(r["max_abs_err"] for r in rows if not r["errors"]) <= 1e-5


def test_runtime_headline_is_the_linked_run():
    readme = ROOT / "README.md"
    par = " ".join(_paragraph(readme, "client threads: ").split())
    doc = _linked_json(readme, par, "runtime_bench_h100")
    q8 = {r["config"]: r for r in doc["serving"] if r["Q"] == 8}
    best = max((r for c, r in q8.items() if c.startswith("runtime_")), key=lambda r: r["qps"])
    eager, shared = q8["eager_1stream"], q8["graph_shared"]
    assert (f"{best['qps']:,.0f} queries/s against {eager['qps']:,.0f} for eager PyTorch on one stream "
            f"({_x(best['qps'] / eager['qps'])}, p99 {best['p99_ms']:.2f} ms vs {eager['p99_ms']:.1f} ms)") in par
    vs_shared = _x(best["qps"] / shared["qps"], 2)
    assert f"{shared['qps']:,.0f} for one CUDA graph per thread on a shared stream ({vs_shared})" in par


def test_engine_table_and_ranks_are_the_linked_runs():
    readme = ROOT / "README.md"
    doc = _linked_json(readme, _paragraph(readme, "one engine per"), "engines_")
    got = {r["engine"]: r for r in doc["results"]}
    table = _table_after(readme, "| engine | seconds | peak RSS |")
    assert len(table) == len(got) == 5
    for cells, name in zip(table, ["sqlite3", "adbc", "connectorx", "polars", "duckdb"]):
        assert cells[1:] == [f"{got[name]['seconds']:.3f}", _mb(got[name]["peak_rss_mb"])], name
    par = " ".join(_paragraph(readme, "A directory of 64 rank traces").split())
    ranks = _linked_json(readme, par, "ranks_")
    assert ranks["same_combined_result"] is True
    assert (f"takes {ranks['local_processes']['seconds']:.3f} s with 2 local processes and "
            f"{ranks['dask_localcluster']['seconds']:.3f} s on a") in par


@pytest.mark.parametrize("script", ["scale/scale_trace.py", "scale/kineto_scale.py"])
def test_scale_benches_import_each_other_one_way(script):
    """The scale benches share their timing through ``_timing.py``; kineto_scale never
    imports scale_trace (the circle the two used to form)."""
    src = (BENCH / script).read_text()
    assert "from _timing import" in src
    if script.endswith("kineto_scale.py"):
        assert "scale_trace" not in re.sub(r'""".*?"""', "", src, flags=re.S).replace("bench/scale/scale_trace.py", "")
