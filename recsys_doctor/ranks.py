"""Many rank traces at once: ``advise DIR_OR_GLOB`` and ``advise ... --dask``.

A multi-GPU job writes one trace per rank. Each rank is diagnosed on its own (the same
loader, summary and analyzers as ``advise``) by a worker: a local process by default, or a
Dask worker (``--dask ADDRESS`` for a running scheduler, ``--dask local`` for a
``LocalCluster`` on this machine). A worker returns only a small :class:`RankSummary`
(numbers and finding ids, a few KB), never the trace, so the combined view of 1,000 ranks
fits in the memory of the machine that asked.

The combined :class:`MultiRankResult` lists the ranks worst first (lowest GPU
utilization), the findings side by side, the stragglers and, where the traces hold NCCL
kernels, each rank's communication/compute overlap.

Definitions (per rank, over all its devices):

``compute_ns``
    union length of the kernels that are not NCCL kernels (name contains ``nccl``,
    any case) plus CUDA-graph executions.
``comm_ns``
    union length of the NCCL kernels.
``overlap_share``
    ``|compute ∩ comm| / comm_ns``: the share of communication hidden under compute
    (None without NCCL kernels).
straggler
    a rank whose ``compute_ns`` exceeds the median over ranks by more than
    ``straggler_share`` (default :data:`STRAGGLER_SHARE`) of the median: the others wait
    for it at every collective.
"""

from __future__ import annotations

import glob
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .analyzers._arrays import merge_intervals
from .errors import BadInputError
from .options import Options

__all__ = ["RankSummary", "MultiRankResult", "expand_traces", "is_multi_target", "analyze_rank",
           "advise_ranks", "combine", "STRAGGLER_SHARE"]

#: A rank is a straggler when its compute time exceeds the median rank's by more than this
#: share (10%: well above the run-to-run noise of identical ranks, which is a few percent,
#: and small enough that the wait it causes on every collective is worth a look).
STRAGGLER_SHARE = 0.10

#: file names ``advise DIR`` picks up in a directory (content is still checked on load)
TRACE_SUFFIXES = (".sqlite", ".sqlite.gz", ".json", ".json.gz", ".nsys-rep", ".qdrep")

_NCCL = re.compile("nccl", re.IGNORECASE)
_GLOB_CHARS = re.compile(r"[*?\[]")


def is_multi_target(arg: str | os.PathLike[str]) -> bool:
    """True for a directory or a glob pattern (``*``, ``?``, ``[``) naming many traces."""
    s = str(arg)
    return Path(s).is_dir() or (bool(_GLOB_CHARS.search(s)) and not Path(s).exists())


def expand_traces(arg: str | os.PathLike[str]) -> list[Path]:
    """The trace files of a directory (by suffix, not recursive) or a glob, sorted by name;
    :class:`BadInputError` when there are none."""
    s = str(arg)
    if Path(s).is_dir():
        files = [p for p in sorted(Path(s).iterdir()) if p.is_file() and p.name.endswith(TRACE_SUFFIXES)]
        if not files:
            raise BadInputError(f"{s}: no trace files in this directory "
                                f"(looked for {', '.join(TRACE_SUFFIXES)})")
        return files
    files = [Path(p) for p in sorted(glob.glob(s)) if Path(p).is_file()]
    if not files:
        raise BadInputError(f"{s}: the pattern matches no file")
    return files


@dataclass
class RankSummary:
    """What a worker brings back about one rank: small, JSON-serializable."""

    rank: int
    path: str
    format: str
    summary: dict[str, Any]
    #: ``[{"id", "severity", "title"}]`` in advise's order (most severe first)
    findings: list[dict[str, Any]]
    #: device -> utilization
    devices: dict[str, Any]
    compute_ns: int
    comm_ns: int
    overlap_ns: int
    nccl_kernels: int
    seconds: float = 0.0
    #: what ``analyze_rank``'s ``finish`` made of the rank's full result on the worker
    #: (its HTML section, its history row); not part of the JSON
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def overlap_share(self) -> float | None:
        return self.overlap_ns / self.comm_ns if self.comm_ns else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["overlap_share"] = self.overlap_share
        return d


@dataclass
class MultiRankResult:
    """The combined view over ranks (every renderer takes this object)."""

    ranks: list[RankSummary]  # worst first
    stragglers: list[dict[str, Any]]
    finding_ids: list[str]
    engine: str
    straggler_share: float = STRAGGLER_SHARE
    totals: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1, "kind": "multi-rank", "engine": self.engine, "totals": self.totals,
            "straggler_share": self.straggler_share, "stragglers": self.stragglers,
            "finding_ids": self.finding_ids,
            "ranks": [{k: v for k, v in r.to_dict().items() if k not in ("seconds", "extras")} for r in self.ranks],
        }


def _rank_of(meta: dict[str, Any], path: Path, index: int) -> int:
    """The rank a trace says it is (Kineto ``distributedInfo.rank``), else the last number
    in its file name (``rank-3.json``, ``worker3_...``), else its position."""
    r = meta.get("rank")
    if isinstance(r, int) or (isinstance(r, str) and r.isdigit()):
        return int(r)
    nums = re.findall(r"(?:rank|worker)[-_]?(\d+)", path.name, re.IGNORECASE) or re.findall(r"(\d+)", path.name)
    return int(nums[-1]) if nums and len(nums[-1]) < 7 else index


def analyze_rank(path: str, options: Options | None = None, index: int = 0,
                 finish: Callable[[Any], dict[str, Any]] | None = None) -> RankSummary:
    """Diagnose one rank's trace and keep only the small summary (runs on a worker);
    ``finish(result)``, when given, keeps a little more of the full result in ``extras``."""
    import time

    from .advise import advise
    from .analyzers._util import str_contains

    t0 = time.perf_counter()
    res = advise(path, options)
    tr = res.trace
    assert tr is not None
    k = tr.kernels
    nccl = str_contains(k["name"], _NCCL).to_numpy() if len(k) else np.zeros(0, dtype=bool)
    ks, ke = k["start"].to_numpy(np.int64), k["end"].to_numpy(np.int64)
    g = tr.graphs
    cs = np.concatenate([ks[~nccl], g["start"].to_numpy(np.int64)])
    ce = np.concatenate([ke[~nccl], g["end"].to_numpy(np.int64)])
    comp = merge_intervals(cs, ce)
    comm = merge_intervals(ks[nccl], ke[nccl])
    both = merge_intervals(np.concatenate([comp[0], comm[0]]), np.concatenate([comp[1], comm[1]]))
    c_ns, m_ns = int((comp[1] - comp[0]).sum()), int((comm[1] - comm[0]).sum())
    overlap = c_ns + m_ns - int((both[1] - both[0]).sum())
    util = res.analyses.get("utilization", {}).get("devices", {})
    return RankSummary(
        rank=_rank_of(tr.meta, Path(path), index), path=str(path), format=tr.format,
        summary=res.summary,
        findings=[{"id": f.id, "severity": f.severity, "title": f.title} for f in res.findings],
        devices={d: {"utilization": v.get("utilization"), "steady_utilization": v.get("steady_utilization")}
                 for d, v in util.items()},
        compute_ns=c_ns, comm_ns=m_ns, overlap_ns=int(overlap), nccl_kernels=int(nccl.sum()),
        seconds=round(time.perf_counter() - t0, 3), extras=finish(res) if finish else {},
    )


def _sort_key(r: RankSummary) -> tuple[int, float, int]:
    u = r.summary.get("gpu_utilization")
    return (u is None, u if u is not None else 0.0, r.rank)


def combine(ranks: list[RankSummary], engine: str, straggler_share: float = STRAGGLER_SHARE) -> MultiRankResult:
    """The combined view: ranks worst first, stragglers, finding ids in first-seen order
    over the ranks sorted by rank (so the result does not depend on who finished first)."""
    by_rank = sorted(ranks, key=lambda r: (r.rank, r.path))
    comp = np.array([r.compute_ns for r in by_rank], dtype=float)
    med = float(np.median(comp)) if len(comp) else 0.0
    stragglers = []
    if med > 0:
        for r in by_rank:
            excess = (r.compute_ns - med) / med
            if excess > straggler_share:
                stragglers.append({"rank": r.rank, "compute_ns": r.compute_ns, "median_compute_ns": int(med),
                                   "excess_share": round(excess, 4)})
        stragglers.sort(key=lambda s: -s["excess_share"])
    ids: list[str] = []
    for r in by_rank:
        for f in r.findings:
            if f["id"] not in ids:
                ids.append(f["id"])
    utils = [r.summary.get("gpu_utilization") for r in by_rank if r.summary.get("gpu_utilization") is not None]
    comm = sum(r.comm_ns for r in by_rank)
    totals = {
        "ranks": len(by_rank),
        "utilization_min": min(utils) if utils else None,
        "utilization_median": float(np.median(utils)) if utils else None,
        "utilization_max": max(utils) if utils else None,
        "kernels": int(sum(r.summary.get("kernels", 0) for r in by_rank)),
        "comm_ns": int(comm),
        "overlap_share": (sum(r.overlap_ns for r in by_rank) / comm) if comm else None,
    }
    return MultiRankResult(ranks=sorted(by_rank, key=_sort_key), stragglers=stragglers, finding_ids=ids,
                           engine=engine, straggler_share=straggler_share, totals=totals)


def _run_local(paths: list[Path], options: Options, workers: int | None,
               on_done: Callable[[RankSummary], None], finish: Any = None) -> list[RankSummary]:
    n = max(1, min(workers or os.cpu_count() or 1, len(paths)))
    if n == 1:
        out = []
        for i, p in enumerate(paths):
            out.append(analyze_rank(str(p), options, i, finish))
            on_done(out[-1])
        return out
    with ProcessPoolExecutor(max_workers=n) as pool:
        futs = [pool.submit(analyze_rank, str(p), options, i, finish) for i, p in enumerate(paths)]
        out = []
        for f in futs:
            out.append(f.result())
            on_done(out[-1])
        return out


def _run_dask(paths: list[Path], options: Options, address: str, workers: int | None,
              on_done: Callable[[RankSummary], None], finish: Any = None) -> list[RankSummary]:
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:  # pragma: no cover - a dependency of the package
        raise BadInputError("--dask needs the 'distributed' package (pip install distributed)") from None
    cluster = None
    try:
        if address == "local":
            n = max(1, min(workers or os.cpu_count() or 1, len(paths)))
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
            client = Client(cluster)
        else:
            try:
                client = Client(address, timeout="20s")
            except (OSError, TimeoutError) as e:
                raise BadInputError(f"--dask {address}: cannot reach the Dask scheduler ({e})") from None
        with client:
            futs = client.map(analyze_rank, [str(p) for p in paths], [options] * len(paths),
                              list(range(len(paths))), [finish] * len(paths), pure=False)
            out = []
            for f in as_completed(futs):
                out.append(f.result())
                on_done(out[-1])
            return out
    finally:
        if cluster is not None:
            cluster.close()


def advise_ranks(paths: list[Path], options: Options | None = None, *, dask: str | None = None,
                 workers: int | None = None, progress: bool = False,
                 straggler_share: float = STRAGGLER_SHARE, finish: Any = None) -> MultiRankResult:
    """Diagnose every rank trace in ``paths`` in parallel and combine the results.

    ``dask``: None for local processes (``workers`` of them, default one per CPU), ``"local"``
    for a Dask ``LocalCluster`` of ``workers`` processes, or a scheduler address
    (``tcp://host:8786``) whose workers can read the same paths. ``finish``: see
    :func:`analyze_rank` (a module-level function or a ``partial`` of one: it travels to
    the workers).
    """
    from .progress import progress as progress_bar

    options = options or Options()
    paths = [Path(p) for p in paths]
    with progress_bar("analyzing ranks", total=len(paths), enabled=None if progress else False) as bar:
        def done(r: RankSummary) -> None:
            bar.update(description=f"analyzing ranks: rank {r.rank} done")
            bar.advance()

        if dask is None:
            ranks = _run_local(paths, options, workers, done, finish)
            engine = "local processes"
        else:
            ranks = _run_dask(paths, options, dask, workers, done, finish)
            engine = "dask " + ("LocalCluster" if dask == "local" else dask)
    return combine(ranks, engine, straggler_share)
