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

from ..findings import AnalysisResult, Finding
from ..model import Trace
from ..options import Options
from ._attribution import any_region, attribute, where_shares
from ._recoverable import steady_window, examples, finish, idle_gaps
from ._util import GRAPH_LAUNCH_RE, launches, merge_intervals, r, str_contains, thread_labels

__all__ = ["analyze", "repeated_windows"]

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
    k = trace.kernels
    g = trace.graphs
    n_graph_launch = int(str_contains(trace.api["name"], GRAPH_LAUNCH_RE).sum())
    if len(k) == 0 and len(g) == 0:
        res.data = {"kernels": 0, "graph_launch_calls": n_graph_launch}
        return res
    j = launches(trace, ("kernel",))
    by_graph_launch = np.zeros(len(k), dtype=bool)
    if len(j):
        gl = str_contains(j["api_name"], GRAPH_LAUNCH_RE).to_numpy()
        by_graph_launch[j["row"].to_numpy()[gl]] = True
    in_graph = k["in_graph"].to_numpy(bool) | by_graph_launch
    kd = (k["end"] - k["start"]).to_numpy(np.int64)

    # share of GPU work already in graphs
    gs = np.concatenate([g["start"].to_numpy(np.int64), k["start"].to_numpy(np.int64)[in_graph]])
    ge = np.concatenate([g["end"].to_numpy(np.int64), k["end"].to_numpy(np.int64)[in_graph]])
    ms, me = merge_intervals(gs, ge)
    graph_busy = int((me - ms).sum())
    bs, be = merge_intervals(np.concatenate([g["start"].to_numpy(np.int64), k["start"].to_numpy(np.int64)]),
                             np.concatenate([g["end"].to_numpy(np.int64), k["end"].to_numpy(np.int64)]))
    busy = int((be - bs).sum())
    graphed_share = graph_busy / busy if busy else None

    # eager kernels, ordered per launching thread (or stream when not joinable)
    eager = np.flatnonzero(~in_graph)
    seq = pd.DataFrame({"row": eager, "name": k["name"].to_numpy(object)[eager],
                        "t": k["start"].to_numpy(np.int64)[eager],
                        "gkey": [f"s{p}/{d}/{s}" for p, d, s in zip(k["pid"].to_numpy()[eager],
                                                                      k["device"].to_numpy()[eager],
                                                                      k["stream"].to_numpy()[eager])]})
    seq["pid"] = k["pid"].to_numpy()[eager]
    seq["tid"] = -1
    seq["api_start"] = seq["t"]
    if len(j) and len(seq):
        jj = j[~in_graph[j["row"].to_numpy()]].set_index("row")
        hit = seq["row"].isin(jj.index).to_numpy()
        rows = seq["row"].to_numpy()[hit]
        seq.loc[hit, "tid"] = jj.loc[rows, "tid"].to_numpy()
        seq.loc[hit, "api_start"] = jj.loc[rows, "api_start"].to_numpy()
        seq.loc[hit, "t"] = seq.loc[hit, "api_start"]
        seq.loc[hit, "gkey"] = ["t" + str(p) + "/" + str(t) for p, t in zip(seq.loc[hit, "pid"], seq.loc[hit, "tid"])]
    seq = seq.sort_values(["gkey", "t"], kind="stable").reset_index(drop=True)
    K, R = int(options.graph_min_kernels), int(options.graph_min_repeats)
    data: dict = {"kernels": int(len(k)), "eager_kernels": int(eager.size),
                  "in_graph_kernels": int(in_graph.sum()), "graph_executions": int(len(g)),
                  "graph_launch_calls": n_graph_launch, "graphed_busy_share": r(graphed_share),
                  "min_kernels": K, "min_repeats": R}
    cand_share = 0.0
    if len(seq) >= K:
        ids = pd.factorize(seq["name"].astype(object).fillna("?"))[0].astype(np.int64) + 1
        grp = pd.factorize(seq["gkey"])[0]
        covered, h, rep = repeated_windows(ids, grp, K, R)
        cov_rows = seq["row"].to_numpy()[covered]
        ks_, ke_ = k["start"].to_numpy(np.int64)[cov_rows], k["end"].to_numpy(np.int64)[cov_rows]
        cs_, ce_ = merge_intervals(ks_, ke_)
        cand_time = int((ce_ - cs_).sum())  # union: kernels overlapping on several streams count once
        cand_share = cand_time / busy if busy else 0.0
        data.update({"candidate_kernels": int(covered.sum()), "candidate_kernel_time_us": r(cand_time / 1000, 3),
                     "candidate_share_of_busy": r(cand_share),
                     "candidate_share_of_eager": r(covered.sum() / len(seq))})
        if rep.any():
            period, n_rep, p0 = _period(h, rep, grp)
            # a loop body shorter than the minimum window is reported as the smallest
            # multiple of it that is a sequence of at least graph_min_kernels kernels
            period = max(period, 1) * int(np.ceil(K / max(period, 1)))
            n_rep = max(int(covered.sum()) // period, 1)
            cnt = np.array([n_rep])
            body = seq["name"].iloc[p0: p0 + max(period, 1)].astype(str).tolist()
            data.update({"sequence_length": period, "sequence_repeats": int(cnt.max()),
                         "sequence_head": body[:10]})
            res.data = data
            reg = attribute(trace, seq["pid"][covered], seq["tid"][covered], seq["api_start"][covered])
            where: list[dict] = []
            if any_region(reg):
                where = where_shares(reg, kd[cov_rows], key="nvtx", top=options.top_n)
            cs = seq[covered]
            tl = thread_labels(trace, cs["pid"], cs["tid"])
            labels = [lab if t >= 0 else f"stream {gk[1:]}" for lab, t, gk in zip(tl, cs["tid"], cs["gkey"])]
            where += where_shares(labels, kd[cov_rows], key="thread", top=options.top_n)
            if cand_share >= options.report_min_share:
                sev = "note"
                gaps = idle_gaps(trace, options)
                is_cand = np.zeros(len(k), bool)
                is_cand[cov_rows] = True
                gc = gaps[(gaps["what"] == "kernel") & gaps["steady"].astype(bool)] if len(gaps) else gaps
                gc = gc[is_cand[gc["row"].to_numpy(np.int64)]] if len(gc) else gc
                rec = int(gc["ns"].sum()) if len(gc) else 0
                data["idle_before_candidates_ns"] = rec
                already = (f"; {graphed_share:.0%} of GPU work already runs in graphs"
                           if graphed_share else "")
                res.findings.append(Finding(
                    id="graph-candidate", severity=sev,
                    title=(f"A {period}-kernel sequence repeats {int(cnt.max())}x eagerly; repeated eager "
                           f"sequences hold {cand_share:.0%} of GPU busy time{already}"),
                    evidence=data,
                    recommendation=(
                        "Capture the repeated sequence once per stream group in a CUDA graph "
                        "(torch.cuda.graphs / make_graphed_callables, static input buffers filled by "
                        "one pinned copy) and replay it with one cudaGraphLaunch per request/step."),
                    where=where))
                f = res.findings[-1]
                f.action = f"capture the repeated {period}-kernel sequence once in a CUDA graph and replay it"
                if len(gc):
                    f.examples = examples(trace, start=gc["start"], end=gc["end"], pid=gc["pid"],
                                          device=gc["device"], stream=gc["stream"],
                                          what="GPU idle before a kernel of the repeated sequence",
                                          n=options.examples_per_finding)
                finish(f, rec, steady_window(trace, options), options)
                return res
    res.data = data
    if graphed_share or n_graph_launch:
        res.findings.append(Finding(
            id="graph-candidate", severity="note",
            title=(f"CUDA graphs already in use: {graphed_share or 0:.0%} of GPU busy time runs in "
                   f"graphs ({len(g)} graph executions, {n_graph_launch} graph launch calls)"),
            evidence=data,
            recommendation=("Nothing to capture: the repeated work is already graphed. Keep one graph "
                            "per stream group so concurrent requests do not share a stream."),
            where=[]))
        res.findings[-1].action = "nothing to capture: the repeated work already runs in CUDA graphs"
        finish(res.findings[-1], 0, steady_window(trace, options), options)
    return res
