"""Many rank traces at once: ``advise DIR_OR_GLOB`` and ``advise ... --dask``.

A multi-GPU job writes one trace per rank. Each rank is diagnosed on its own (the same
loader, summary and analyzers as ``advise``) by a worker: a local process by default, or a
Dask worker (``--dask ADDRESS`` for a running scheduler, ``--dask local`` for a
``LocalCluster`` on this machine). A worker returns only a small :class:`RankSummary`
(numbers and finding ids, a few KB), never the trace, so the combined view of 1,000 ranks
fits in the memory of the machine that asked.

The combined :class:`MultiRankResult` lists the ranks worst first (lowest GPU
utilization), the findings side by side, the stragglers and, where the traces hold NCCL
kernels, each rank's communication/compute overlap and exposed communication.

Definitions (per rank, over all its devices; the communication kernels and the overlap are
those of the ``comm-exposed`` analyzer, :mod:`recsys_doctor.analyzers._comm`):

``compute_ns``
    union length of the kernels that are not communication kernels plus CUDA-graph
    executions.
``comm_ns``
    union length of the communication (NCCL) kernels.
``overlap_share``
    ``|compute ∩ comm| / comm_ns``: the share of communication hidden under compute
    (None without NCCL kernels); ``exposed_ns = comm_ns - overlap_ns``.
rank
    the trace's own (Kineto ``distributedInfo.rank``, the ``MPI Rank N`` thread name of an
    nsys MPI trace; ``rank_source`` "trace"), else
    ``rank<N>`` in the file name ("file name"), else the file's position ("order").
    ``warnings`` says when the files do not look like the ranks of one job.
straggler
    a rank the others wait for at the collectives (:mod:`recsys_doctor.diagnose._collectives`:
    collectives matched across ranks, aligned on their ends): the other ranks' mean wait
    for it, summed over the collectives it arrives at last, reaches ``straggler_share``
    (default :data:`STRAGGLER_SHARE`) of the median rank's window.
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

from ._collectives import collective_records, match_collectives
from ..errors import BadInputError
from ..options import Options

__all__ = ["RankSummary", "MultiRankResult", "expand_traces", "is_multi_target", "analyze_rank",
           "advise_ranks", "combine", "STRAGGLER_SHARE"]

#: A rank is a straggler when the other ranks' mean wait for it at the collectives reaches
#: this share of the median rank's window (10%: well above the run-to-run jitter of the
#: collectives' arrival on identical ranks, and a wait worth rebalancing the work for).
STRAGGLER_SHARE = 0.10

#: file names ``advise DIR`` picks up in a directory (content is still checked on load)
TRACE_SUFFIXES = (".sqlite", ".sqlite.gz", ".json", ".json.gz", ".nsys-rep", ".qdrep")

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
    #: where ``rank`` comes from: "trace", "file name" or "order"
    rank_source: str = "order"
    world_size: int | None = None
    #: this rank's collectives (``_collectives.collective_records``), for matching across ranks
    collectives: dict[str, list] = field(default_factory=dict)
    origin_ns_epoch: int | None = None
    #: the most frequent kernel names (telling the ranks of one job from unrelated traces)
    top_kernels: list[str] = field(default_factory=list)
    #: filled by :func:`combine`: this rank's wait at the collectives, how often it arrived
    #: last and how long the others waited for it there
    waits: dict[str, int] = field(default_factory=dict)

    @property
    def overlap_share(self) -> float | None:
        return self.overlap_ns / self.comm_ns if self.comm_ns else None

    @property
    def exposed_ns(self) -> int:
        return self.comm_ns - self.overlap_ns

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("collectives", "origin_ns_epoch", "top_kernels"):
            d.pop(k)
        d["overlap_share"] = self.overlap_share
        d["exposed_ns"] = self.exposed_ns
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
    #: how the ranks' collectives were matched and aligned (:func:`~._collectives.match_collectives`)
    collectives: dict[str, Any] = field(default_factory=dict)
    #: why these files may not be the ranks of one job (one line each)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1, "kind": "multi-rank", "engine": self.engine, "totals": self.totals,
            "straggler_share": self.straggler_share, "stragglers": self.stragglers,
            "collectives": self.collectives, "warnings": self.warnings,
            "finding_ids": self.finding_ids,
            "ranks": [{k: v for k, v in r.to_dict().items() if k not in ("seconds", "extras")} for r in self.ranks],
        }


_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
#: the thread name Nsight Systems gives an MPI process's threads when it traces MPI
_MPI_RANK_THREAD = re.compile(r"^MPI Rank (\d+)$")


def _rank_of(meta: dict[str, Any], threads: Any, path: Path) -> tuple[int | None, str]:
    """The rank a trace says it is - Kineto ``distributedInfo.rank``, or the ``MPI Rank N``
    thread name of an nsys MPI trace (one N) - else ``rank<N>`` in its file name;
    ``(None, "order")`` when none says (:func:`combine` numbers those)."""
    r = meta.get("rank")
    if isinstance(r, int) or (isinstance(r, str) and r.isdigit()):
        return int(r), "trace"
    names = {m.group(1) for n in threads["name"].dropna().astype(str).unique() if (m := _MPI_RANK_THREAD.match(n))}
    if len(names) == 1:
        return int(names.pop()), "trace"
    found = _RANK_IN_NAME.findall(path.name)
    return (int(found[-1]), "file name") if found else (None, "order")


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, int) or (isinstance(v, str) and v.isdigit()) else None


def analyze_rank(path: str, options: Options | None = None, index: int = 0,
                 finish: Callable[[Any], dict[str, Any]] | None = None) -> RankSummary:
    """Diagnose one rank's trace and keep only the small summary (runs on a worker);
    ``finish(result)``, when given, keeps a little more of the full result in ``extras``."""
    import time

    from .advise import advise
    from ..analyzers._comm import collective_kinds, comm_mask, overlap

    t0 = time.perf_counter()
    res = advise(path, options)
    tr = res.trace
    assert tr is not None
    k = tr.kernels
    comm = comm_mask(tr)
    ks, ke = k["start"].to_numpy(np.int64), k["end"].to_numpy(np.int64)
    g = tr.graphs
    o = overlap(np.concatenate([ks[~comm], g["start"].to_numpy(np.int64)]),
                np.concatenate([ke[~comm], g["end"].to_numpy(np.int64)]), ks[comm], ke[comm])
    rows = np.flatnonzero(comm)
    streams = k["device"].to_numpy(np.int64)[rows] * (1 << 32) + k["stream"].to_numpy(np.int64)[rows]
    util = res.analyses.get("utilization", {}).get("devices", {})
    rank, source = _rank_of(tr.meta, tr.threads, Path(path))
    names = k["name"].value_counts().head(20).index if len(k) else []
    return RankSummary(
        rank=index if rank is None else rank, path=str(path), format=tr.format,
        summary=res.summary,
        findings=[{"id": f.id, "severity": f.severity, "title": f.title} for f in res.findings],
        devices={d: {"utilization": v.get("utilization"), "steady_utilization": v.get("steady_utilization")}
                 for d, v in util.items()},
        compute_ns=o.compute_ns, comm_ns=o.comm_ns, overlap_ns=o.hidden_ns, nccl_kernels=int(comm.sum()),
        seconds=round(time.perf_counter() - t0, 3), rank_source=source,
        extras=finish(res) if finish else {},
        world_size=_int_or_none(tr.meta.get("world_size")),
        collectives=collective_records(streams, collective_kinds(tr, rows), ks[rows], ke[rows]),
        origin_ns_epoch=_int_or_none(tr.meta.get("origin_ns_epoch")),
        top_kernels=[str(n) for n in names],
    )


def _sort_key(r: RankSummary) -> tuple[int, float, int]:
    u = r.summary.get("gpu_utilization")
    return (u is None, u if u is not None else 0.0, r.rank)


def combine(ranks: list[RankSummary], engine: str, straggler_share: float = STRAGGLER_SHARE) -> MultiRankResult:
    """The combined view: ranks worst first, stragglers (from the collectives matched
    across ranks), warnings when the files are not the ranks of one job, finding ids in
    first-seen order over the ranks sorted by rank (so the result does not depend on who
    finished first)."""
    warnings = _job_warnings(ranks)
    by_rank = sorted(ranks, key=lambda r: (r.rank, r.path))
    windows = [r.summary.get("window_ns") or 0 for r in by_rank]
    coll = match_collectives([{"rank": r.rank, "collectives": r.collectives, "origin_ns_epoch": r.origin_ns_epoch}
                              for r in by_rank], float(np.median(windows)) if windows else 0.0, straggler_share)
    for r in by_rank:
        r.waits = coll["per_rank"].get(r.rank, {})
    stragglers = coll.pop("stragglers")
    coll.pop("per_rank")
    world = {r.world_size for r in by_rank if r.world_size}
    if coll["matched"] and len(world) == 1 and (w := next(iter(world))) > len(by_rank):
        coll["note"] = (f"{len(by_rank)} of the job's {w} ranks are here: the rank the others wait for may be "
                        "one not given (waits are counted from the latest rank present)")
    ids: list[str] = []
    for r in by_rank:
        for f in r.findings:
            if f["id"] not in ids:
                ids.append(f["id"])
    utils = [u for r in by_rank if (u := r.summary.get("gpu_utilization")) is not None]
    comm = sum(r.comm_ns for r in by_rank)
    totals = {
        "ranks": len(by_rank),
        "world_size": world.pop() if len(world) == 1 else None,
        "utilization_min": min(utils) if utils else None,
        "utilization_median": float(np.median(utils)) if utils else None,
        "utilization_max": max(utils) if utils else None,
        "kernels": int(sum(r.summary.get("kernels", 0) for r in by_rank)),
        "comm_ns": int(comm),
        "exposed_ns": int(sum(r.exposed_ns for r in by_rank)),
        "overlap_share": (sum(r.overlap_ns for r in by_rank) / comm) if comm else None,
    }
    return MultiRankResult(ranks=sorted(by_rank, key=_sort_key), stragglers=stragglers, finding_ids=ids,
                           engine=engine, straggler_share=straggler_share, totals=totals, collectives=coll,
                           warnings=warnings)


def _job_warnings(ranks: list[RankSummary]) -> list[str]:
    """Why the files may not be the ranks of one job: no rank in them (numbered by their
    order instead), the same rank twice, different world sizes, or different workloads
    (fewer than half of the most frequent kernel names shared with the first rank)."""
    out = []
    none = [r for r in ranks if r.rank_source == "order"]
    if none:
        out.append(f"{len(none)} of {len(ranks)} traces say no rank (no distributedInfo, no rank<N> in the name): "
                   "numbered by their order")
    seen = [r.rank for r in ranks]
    if len(set(seen)) < len(seen):
        out.append("several traces claim the same rank (" + ", ".join(
            str(x) for x in sorted({x for x in seen if seen.count(x) > 1})) + "): not the ranks of one job")
    world = sorted({r.world_size for r in ranks if r.world_size})
    if len(world) > 1:
        out.append(f"the traces have different world sizes ({', '.join(map(str, world))}): not the ranks of one job")
    ref = set(ranks[0].top_kernels) if ranks else set()
    odd = [r for r in ranks[1:] if ref and len(ref & set(r.top_kernels)) < 0.5 * min(len(ref), len(r.top_kernels))]
    if odd or len({r.format for r in ranks}) > 1:
        out.append("the traces run different kernels (different workloads?): compare them as ranks with care")
    return out


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
    from .._util.progress import progress as progress_bar

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
