"""CUDA-graph candidates: the same kernel sequence launched eagerly again and again.

A serving loop or a training step launches the same kernels in the same order every
time; capturing that sequence once in a CUDA graph replaces N launch calls by one.

Detection is hashing, not pairwise comparison: eager kernels (not ``in_graph`` and not
launched by a ``cudaGraphLaunch``) are ordered per launching thread ``(pid, tid)`` (by
launch-call start; kernels without a launch call fall back to their stream, by GPU
start), their names are factorized to integers, and every window of
``Options.graph_min_kernels`` consecutive kernels gets a 64-bit polynomial hash (K
vectorized multiply-adds). A window whose hash occurs at least ``Options.graph_min_repeats``
times is a repeated sequence; the kernels covered by such windows are the candidates.
The loop body length is the smallest distance at which most repeated windows recur
(see :func:`_period`). O(n K) numpy work in total.

Work already in CUDA graphs (``graphs`` rows, ``kernels.in_graph``, kernels correlated
with a graph-launch call) is recognized and its share of GPU busy time reported, so a
graphed trace gets a ``note`` instead of advice it already follows.
Reported when the candidates' busy time (union of their intervals) reaches
``Options.report_min_share`` of the GPU busy time (union of kernels and graph executions).
Recoverable time: the steady-state GPU idle gaps that end with a candidate kernel - the
launch gaps one graph launch would close. Eager warm-up before the graphs were captured
is start-up and does not count. Severity follows from it (docs/findings.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._attribution import any_region, attribute, where_shares
from ._framework import framework, idiom
from ._ops import cached
from ._recoverable import allocator_gap, examples, finish, idle_gaps, report, steady_window
from ._util import (GRAPH_LAUNCH_RE, group_codes, launches, merge_intervals, r, str_contains, take_str,
                    thread_label)

__all__ = ["analyze", "repeated_windows"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "graph-candidate": {
        "candidate_kernel_time_us": "us", "candidate_kernels": "number", "candidate_share_of_busy": "share",
        "candidate_share_of_eager": "share", "eager_kernels": "number", "graph_executions": "number",
        "graph_launch_calls": "number", "graphed_busy_share": "share", "idle_before_candidates_ns": "ns",
        "in_graph_kernels": "number", "kernels": "number", "min_kernels": "number", "min_repeats": "number",
        "sequence_length": "number", "sequence_repeats": "number", "share": "share",
        "sync_points_per_sequence": "number", "syncs_inside_sequence": "number", "loop_body_kernels": "number",
        "inner_period_kernels": "number",
    },
}

_W = np.random.default_rng(20261121).integers(1, 2**63 - 1, size=4096, dtype=np.int64).astype(np.uint64) | np.uint64(1)


def repeated_windows(ids: np.ndarray, group: np.ndarray, k: int, min_repeats: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a sequence of integer ids split into groups (``group`` non-decreasing),
    return ``(covered, hashes, valid)``: a bool mask of positions covered by a window of
    ``k`` ids whose content occurs at least ``min_repeats`` times (within any group), the
    window hashes and whether each window lies inside one group."""
    n = ids.size
    covered = np.zeros(n, dtype=bool)
    if n < k or k < 1:
        return covered, np.zeros(0, np.uint64), np.zeros(0, bool)
    m = n - k + 1
    u = ids.astype(np.uint64)
    w = _W[np.arange(k) % _W.size]
    h = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(k):
            h = h * np.uint64(1099511628211) + u[i:i + m] * w[i]
    valid = group[:m] == group[k - 1:]
    if not valid.any():
        return covered, h, valid
    hv = h[valid]
    uniq, inv, cnt = np.unique(hv, return_inverse=True, return_counts=True)
    rep = np.zeros(m, dtype=bool)
    rep[np.flatnonzero(valid)] = cnt[inv] >= min_repeats
    if rep.any():
        diff = np.zeros(n + 1, dtype=np.int64)
        st = np.flatnonzero(rep)
        np.add.at(diff, st, 1)
        np.add.at(diff, st + k, -1)
        covered = np.cumsum(diff[:n]) > 0
    return covered, h, valid & rep


def _period(h: np.ndarray, rep: np.ndarray, grp: np.ndarray) -> tuple[int, int, int]:
    """Loop-body length of the repeated windows: the smallest candidate distance ``p``
    (taken from the distances between consecutive occurrences of equal windows) at which
    at least 80% of repeated windows reappear ``p`` later; plus how many times the body
    repeats (repeated windows / p) and where its first occurrence starts."""
    pos = np.flatnonzero(rep)
    hp = h[pos]
    o = np.lexsort((pos, hp))
    po = pos[o]
    same = (hp[o][1:] == hp[o][:-1]) & (grp[po[1:]] == grp[po[:-1]])
    d = (po[1:] - po[:-1])[same]
    if d.size == 0:
        return 1, int(pos.size), int(pos[0])
    vals, cnts = np.unique(d, return_counts=True)
    cands = np.sort(vals[np.argsort(-cnts, kind="stable")[:20]])
    best = int(vals[np.argmax(cnts)])
    m = h.size
    for p in cands:
        p = int(p)
        a = pos[pos + p < m]
        ok = grp[a] == grp[a + p]
        if ok.any() and float((h[a][ok] == h[a + p][ok]).mean()) >= 0.8:
            best = p
            break
    return best, max(int(pos.size // best), 1), int(pos[0])


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="graph-candidate")
    k, g = trace.kernels, trace.graphs
    n_graph_launch = int(str_contains(trace.api["name"], GRAPH_LAUNCH_RE).sum())
    if len(k) == 0 and len(g) == 0:
        res.data = {"kernels": 0, "graph_launch_calls": n_graph_launch}
        return res
    j = launches(trace, ("kernel",))
    in_graph, busy, graphed_share = _graphed(k, g, j)
    seq = _eager_sequence(k, in_graph, j)
    K, R = int(options.graph_min_kernels), int(options.graph_min_repeats)
    data: dict = {
        "kernels": int(len(k)), "eager_kernels": int(len(seq)), "in_graph_kernels": int(in_graph.sum()),
        "graph_executions": int(len(g)), "graph_launch_calls": n_graph_launch,
        "graphed_busy_share": r(graphed_share), "min_kernels": K, "min_repeats": R}
    res.data = data
    found = _candidates(seq, k, busy, data, options) if len(seq) >= K else None
    if found is not None:
        _step_between_syncs(trace, seq, k, found, data)
    if found is not None and found["share"] >= options.report_min_share:
        _report_candidates(res, trace, k, seq, found, graphed_share, options)
    elif graphed_share or n_graph_launch:
        f = report(
            res, "graph-candidate",
            title=(f"CUDA graphs already in use: {graphed_share or 0:.0%} of GPU busy time runs in "
                   f"graphs ({len(g)} graph executions, {n_graph_launch} graph launch calls)"),
            evidence=data, where=[],
            recommendation=("Nothing to capture: the repeated work is already graphed. Keep one graph "
                            "per stream group so concurrent requests do not share a stream."),
            action="nothing to capture: the repeated work already runs in CUDA graphs")
        finish(f, 0, steady_window(trace, options), options)
    return res


def _graphed(k: pd.DataFrame, g: pd.DataFrame, j: pd.DataFrame) -> tuple[np.ndarray, int, float | None]:
    """Kernels already in graphs (recorded in a graph, or launched by a graph launch
    call), the GPU busy time, and the share of it spent in graphs."""
    in_graph = k["in_graph"].to_numpy(bool).copy()
    if len(j):
        gl = str_contains(j["api_name"], GRAPH_LAUNCH_RE).to_numpy()
        in_graph[j["row"].to_numpy()[gl]] = True
    ks, ke = k["start"].to_numpy(np.int64), k["end"].to_numpy(np.int64)
    gs, ge = g["start"].to_numpy(np.int64), g["end"].to_numpy(np.int64)
    ms, me = merge_intervals(np.concatenate([gs, ks[in_graph]]), np.concatenate([ge, ke[in_graph]]))
    bs, be = merge_intervals(np.concatenate([gs, ks]), np.concatenate([ge, ke]))
    busy = int((be - bs).sum())
    return in_graph, busy, (int((me - ms).sum()) / busy if busy else None)


def _eager_sequence(k: pd.DataFrame, in_graph: np.ndarray, j: pd.DataFrame) -> pd.DataFrame:
    """Eager kernels in the order they were issued: per launching thread ``(pid, tid)`` by
    launch-call start, or, without a launch call, per stream by GPU start. Groups are
    ordered by their key text (``t<pid>/<tid>``, ``s<pid>/<device>/<stream>``)."""
    n = len(k)
    tid = np.full(n, -1, dtype=np.int64)
    api_start = k["start"].to_numpy(np.int64).copy()
    if len(j):
        rows = j["row"].to_numpy()
        keep = ~in_graph[rows]
        tid[rows[keep]] = j["tid"].to_numpy(np.int64)[keep]
        api_start[rows[keep]] = j["api_start"].to_numpy(np.int64)[keep]
    eager = np.flatnonzero(~in_graph)
    pid, dev, st = (k[c].to_numpy(np.int64)[eager] for c in ("pid", "device", "stream"))
    by_thread = tid[eager] >= 0
    code, keys = group_codes(by_thread, pid, np.where(by_thread, tid[eager], dev), np.where(by_thread, 0, st))
    text = [f"t{p}/{x}" if b else f"s{p}/{x}/{y}" for b, p, x, y in keys]
    rank = np.empty(len(text), dtype=np.int64)
    rank[sorted(range(len(text)), key=text.__getitem__)] = np.arange(len(text))
    order = np.lexsort((api_start[eager], rank[code])) if eager.size else eager
    gkey = np.array(text, dtype=object)
    return pd.DataFrame({"row": eager[order], "t": api_start[eager][order], "pid": pid[order],
                         "tid": tid[eager][order], "api_start": api_start[eager][order],
                         "grp": rank[code][order], "gkey": gkey[code[order]] if eager.size else gkey[:0]})


def _candidates(seq: pd.DataFrame, k: pd.DataFrame, busy: int, data: dict, options: Options) -> dict | None:
    """Kernels covered by repeated windows, their share of the busy time and the loop body
    (into ``data``); the covered rows and period, or None when nothing repeats."""
    K, R = int(options.graph_min_kernels), int(options.graph_min_repeats)
    names = k["name"]
    codes = names.cat.codes.to_numpy().astype(np.int64)[seq["row"].to_numpy()]
    cats = list(names.cat.categories)
    codes = np.where(codes < 0, cats.index("?") if "?" in cats else len(cats), codes)
    ids = pd.factorize(codes)[0].astype(np.int64) + 1
    grp = seq["grp"].to_numpy()
    covered, h, rep = repeated_windows(ids, grp, K, R)
    cov_rows = seq["row"].to_numpy()[covered]
    cs_, ce_ = merge_intervals(k["start"].to_numpy(np.int64)[cov_rows], k["end"].to_numpy(np.int64)[cov_rows])
    cand_time = int((ce_ - cs_).sum())  # union: kernels overlapping on several streams count once
    data.update({"candidate_kernels": int(covered.sum()), "candidate_kernel_time_us": r(cand_time / 1000, 3),
                 "candidate_share_of_busy": r(cand_time / busy if busy else 0.0),
                 "candidate_share_of_eager": r(covered.sum() / len(seq))})
    if not rep.any():
        return None
    raw, _, p0 = _period(h, rep, grp)
    # a loop body shorter than the minimum window is reported as the smallest
    # multiple of it that is a sequence of at least graph_min_kernels kernels
    period = max(raw, 1) * int(np.ceil(K / max(raw, 1)))
    body = take_str(names, seq["row"].to_numpy()[p0: p0 + max(period, 1)]).astype(str).tolist()
    data.update({"sequence_length": period, "sequence_repeats": max(int(covered.sum()) // period, 1),
                 "sequence_head": body[:10]})
    return {"covered": covered, "rows": cov_rows, "period": period, "raw_period": max(raw, 1),
            "share": cand_time / busy if busy else 0.0}


def _report_candidates(res: AnalysisResult, trace: Trace, k: pd.DataFrame, seq: pd.DataFrame, found: dict,
                       graphed_share: float | None, options: Options) -> None:
    data, period, rows = res.data, found["period"], found["rows"]
    gaps = idle_gaps(trace, options)
    is_cand = np.zeros(len(k), bool)
    is_cand[rows] = True
    gc = (gaps[(gaps["what"] == "kernel") & gaps["steady"].astype(bool) & ~allocator_gap(trace, options)]
          if len(gaps) else gaps)
    gc = gc[is_cand[gc["row"].to_numpy(np.int64)]] if len(gc) else gc
    rec = int(gc["ns"].sum()) if len(gc) else 0
    data["idle_before_candidates_ns"] = rec
    already = f"; {graphed_share:.0%} of GPU work already runs in graphs" if graphed_share else ""
    # per loop body (which may be shorter than the reported sequence: a graph of one body is enough)
    body = data["loop_body_kernels"] = int(found["raw_period"])
    points = data["sync_points_per_sequence"] = _sync_points(trace, seq, found)
    inside = data["syncs_inside_sequence"] = max(points - 1, 0)
    syncs = f"{inside} host synchronization{'s' if inside != 1 else ''}"
    recommendation = (f"Capture the repeated sequence once per stream group in a CUDA graph "
                      f"({idiom(trace, 'graph')}) and replay it with one cudaGraphLaunch per request/step.")
    pytorch = framework(trace)["name"] == "pytorch"
    action = f"capture the repeated {period}-kernel sequence once in a CUDA graph and replay it"
    if inside:
        recommendation = (
            f"The repeated sequence waits for the GPU at {points} points of each repetition of its "
            f"{body}-kernel loop body (a "
            f"synchronizing call between two of its kernels: a value read back with {idiom(trace, 'host_read')}, "
            f"a data-dependent branch" + (", or PyTorch code that reads a tensor, such as nn.TransformerEncoder's "
                                          "nested-tensor fast path" if pytorch else "") +
            f"); one graph holds at most one such point at "
            f"its edge, so {inside} fall inside a graph of one body and its capture fails. Remove "
            f"those reads (see sync-api for where they are)"
            + (f", or capture the {points} segments between them separately" if body >= 2 * points else "")
            + ". " + recommendation)
        action = f"remove the {syncs} inside the repeated {body}-kernel loop body, then capture it in a CUDA graph"
    f = report(
        res, "graph-candidate",
        title=(f"A {period}-kernel sequence{_step_words(data)} repeats {data['sequence_repeats']}x eagerly; repeated eager "
               f"sequences hold {found['share']:.0%} of GPU busy time{already}"
               + (f"; {syncs} inside each {body}-kernel loop body" if inside else "")),
        evidence=data, where=_where(trace, k, seq, found, options),
        recommendation=recommendation, action=action)
    if len(gc):
        f.examples = examples(trace, start=gc["start"], end=gc["end"], pid=gc["pid"], device=gc["device"],
                              stream=gc["stream"], what="GPU idle before a kernel of the repeated sequence",
                              n=options.examples_per_finding)
    finish(f, rec, steady_window(trace, options), options, claims=gc)


def _syncs_by_thread(trace: Trace) -> dict[tuple[int, int], np.ndarray]:
    """Each thread's host synchronizations (:func:`.sync_api.sync_calls`), their start times
    sorted, by ``(pid, tid)``; once a trace (the step and the sync points both ask)."""
    from .sync_api import sync_calls

    def make() -> dict[tuple[int, int], np.ndarray]:
        m, _ = sync_calls(trace)
        if not m.any():
            return {}
        s = trace.api.loc[m, ["pid", "tid", "start"]].sort_values("start", kind="stable")
        return {(int(p), int(t)): g["start"].to_numpy(np.int64) for (p, t), g in s.groupby(["pid", "tid"], sort=False)}

    return cached(trace, "graph_candidate.syncs_by_thread", make)  # type: ignore[no-any-return]


def _step_words(data: dict) -> str:
    """What a sequence found from the host synchronizations is (empty for a plain loop body)."""
    inner = data.get("inner_period_kernels")
    return (f" (what a thread launches between two of its host synchronizations; a {inner}-kernel block "
            "repeats inside it)"
            if inner else "")


def _step_between_syncs(trace: Trace, seq: pd.DataFrame, k: pd.DataFrame, found: dict, data: dict) -> None:
    """Where the launching threads' host synchronizations recur every ``D`` kernels, ``D`` a
    multiple of the loop body longer than it (the same block of kernels repeated inside one query
    or step: identical layers, a Python loop over a block), the sequence is the step of ``D``
    kernels, not one block: ``found`` and ``data`` are set to it (``inner_period_kernels``: the
    block), and :func:`_sync_points` then finds its synchronizations (one at its edge: a graph of
    the step; more: segments). The numbers of kernels a thread launches between two of its
    synchronizations repeat with the smallest period ``q`` (1 to 4) that holds for 80% of them;
    ``D`` is the most common sum of ``q`` consecutive ones, where at least half of the sums are it."""
    P = int(found["raw_period"])
    syncs = _syncs_by_thread(trace)
    grp, tid, pid, t = (seq[c].to_numpy(np.int64) for c in ("grp", "tid", "pid", "api_start"))
    if not syncs or not (tid >= 0).any():
        return
    per_thread: list[np.ndarray] = []
    groups = np.unique(grp[tid >= 0])
    none = np.zeros(0, np.int64)
    for g in groups:
        sel = np.flatnonzero(grp == g)
        mine = syncs.get((int(pid[sel[0]]), int(tid[sel[0]])), none)
        # each sync's place in the thread's kernel sequence: how many kernels were launched before it
        at = np.unique(np.searchsorted(t[sel], mine, "left"))
        at = at[(at > 0) & (at < sel.size)]
        per_thread.append(np.diff(at))
    step = _sync_step(per_thread)
    if step is None or step[0] <= P or step[0] % P:
        return
    D, q = step
    cov = found["covered"]
    # the repetitions: each thread whose synchronizations recur every D kernels, its covered kernels / D
    stepping = [g for g, gaps in zip(groups, per_thread) if gaps.size >= q and
            (np.convolve(gaps, np.ones(q, np.int64), "valid") == D).any()]
    found.update(period=D, raw_period=D)
    first = int(np.flatnonzero(cov & (grp == stepping[0]))[0])
    body = take_str(k["name"], seq["row"].to_numpy()[first: first + D]).astype(str).tolist()
    data.update({"sequence_length": D, "sequence_head": body[:10], "inner_period_kernels": P,
                 "sequence_repeats": max(sum(int((cov & (grp == g)).sum()) // D for g in stepping), 1)})


def _sync_step(per_thread: list[np.ndarray]) -> tuple[int, int] | None:
    """The kernels of one repetition of the threads' synchronization pattern and the gaps it
    spans (see :func:`_step_between_syncs`), or None where the gaps between synchronizations do
    not repeat."""
    for q in range(1, 5):
        same = [g[q:] == g[:-q] for g in per_thread if g.size > q]
        if sum(x.size for x in same) < 2 or float(np.concatenate(same).mean()) < 0.8:
            continue
        sums = np.concatenate([np.convolve(g, np.ones(q, np.int64), "valid") for g in per_thread if g.size >= q])
        vals, cnts = np.unique(sums, return_counts=True)
        return (int(vals[np.argmax(cnts)]), q) if 2 * int(cnts.max()) >= sums.size else None
    return None


def _sync_points(trace: Trace, seq: pd.DataFrame, found: dict) -> int:
    """At how many points of its loop body the repeated sequence waits for the GPU: the host
    synchronizations (:func:`.sync_api.sync_calls`) a launching thread makes between two
    consecutive kernels of one repeated run, by their position in the body (the pair's offset
    from the run's start, modulo the body's length); a position counts where at least half of
    its pairs hold one. A graph of the body can start right after one such point (a request's
    read-back at its end); every other point falls inside it."""
    P = int(found["raw_period"])
    cov, grp = found["covered"], seq["grp"].to_numpy()
    tid, pid, t = (seq[c].to_numpy(np.int64) for c in ("tid", "pid", "api_start"))
    pair = np.flatnonzero(cov[:-1] & cov[1:] & (grp[:-1] == grp[1:]) & (tid[:-1] >= 0))
    syncs = _syncs_by_thread(trace)
    if not pair.size or not syncs:
        return 0
    held = np.zeros(pair.size, dtype=bool)
    none = np.zeros(0, np.int64)
    for p_, t_ in set(zip(pid[pair].tolist(), tid[pair].tolist())):
        mine = syncs.get((p_, t_), none)
        sel = (pid[pair] == p_) & (tid[pair] == t_)
        lo, hi = t[pair[sel]], t[pair[sel] + 1]
        held[sel] = np.searchsorted(mine, hi, "left") > np.searchsorted(mine, lo, "right")
    # each pair's offset from the start of its covered run
    starts = np.flatnonzero(cov & ~np.concatenate([[False], cov[:-1] & (grp[:-1] == grp[1:])]))
    phase = (pair - starts[np.searchsorted(starts, pair, "right") - 1]) % P
    n = np.bincount(phase, minlength=P)
    hit = np.bincount(phase[held], minlength=P)
    return int(((hit > 0) & (2 * hit >= n)).sum())


def _where(trace: Trace, k: pd.DataFrame, seq: pd.DataFrame, found: dict, options: Options) -> list[dict]:
    """Code regions, then threads (or streams, for kernels without a launch call)."""
    cs = seq[found["covered"]]
    kd = (k["end"] - k["start"]).to_numpy(np.int64)[found["rows"]]
    reg = attribute(trace, cs["pid"], cs["tid"], cs["api_start"])
    where = where_shares(reg, kd, key="nvtx", top=options.top_n) if any_region(reg) else []
    code, groups = pd.factorize(cs["grp"].to_numpy())
    first = np.zeros(len(groups), dtype=np.int64)
    first[code[::-1]] = np.arange(len(code))[::-1]
    gk, pid, tid = cs["gkey"].to_numpy(object), cs["pid"].to_numpy(), cs["tid"].to_numpy()
    labels = np.array([thread_label(trace, pid[i], tid[i]) if gk[i][0] == "t" else f"stream {gk[i][1:]}"
                       for i in first], dtype=object)
    return where + where_shares((code, labels), kd, key="thread", top=options.top_n)
