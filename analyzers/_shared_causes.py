"""Each idle gap counted once: when several findings claim the same GPU idle time, the
finding that names the root cause (:data:`ROOT_CAUSE_ORDER`) keeps it and the others say
that they share its cause (docs/findings.md, "Shared causes"). Runs after every analyzer."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..findings import Finding
from ..options import Options
from ._recoverable import finish

__all__ = ["settle_shared_causes", "ROOT_CAUSE_ORDER", "SHARED_EVIDENCE_UNITS"]

#: the units of the evidence this module adds to any finding (``shared_idle_ns`` holds
#: ``{also_counted_by | counted_under: {finding id: ns}}``: the ids take its unit)
SHARED_EVIDENCE_UNITS = {"shared_idle_ns": "ns"}

#: Which finding names the root cause when several count the same idle gap: the first in
#: this order keeps the shared time, the others only what is left. The specific causes come
#: first (memory management, input loading, syncs and copies that make the host wait for
#: the GPU, threads on one stream, one slow step, the optimizer's and the embedding
#: lookups' many launches), the general symptom (the GPU waits for launches) after
#: them, and the remedies for that symptom (graphs, fewer short kernels) last. A gap that
#: only a blocking copy's return leaves idle goes to ``memcpy-ping-pong`` before
#: ``sync-api`` (the copy is the cause; see ``sync_api._claims``).
ROOT_CAUSE_ORDER = ("allocator-churn", "input-stall", "sync-api", "memcpy-ping-pong", "stream-contention",
                    "gil-handoffs", "step-variance", "optimizer-unfused", "embedding-bound", "launch-bound", "graph-candidate",
                    "short-kernels")


def settle_shared_causes(findings: list[Finding], window_ns: int, options: Options) -> None:
    """Count every idle gap once. Each gap's idle time is handed out in
    :data:`ROOT_CAUSE_ORDER` (a claim with a ``root`` ranks just after that finding), each
    finding taking what it claims of the gap up to what is left of it. A finding that gets
    less than it claimed shares a cause with the one that took the gap first: both say so
    (``evidence["shared_cause_with"]``, the shared idle ns, a sentence in the
    recommendation), and its recoverable time keeps only what it got (plus its part that is
    not idle time, e.g. the copy time saved by merging copies); its severity follows again.
    The recoverable times of the idle findings then add up to at most the idle time."""
    claimers = [f for f in findings if f.claims is not None and len(f.claims)]
    if len(claimers) >= 2:
        wanted, got, lost = _hand_out(claimers)
        for i, f in enumerate(claimers):
            if lost[i]:
                _share_cause(f, claimers, lost[i], int(wanted[i]), int(got[i]), window_ns, options)
    for f in findings:
        f.claims = None
        _say_shared(f)


def _hand_out(claimers: list[Finding]) -> tuple[np.ndarray, np.ndarray, list[dict[int, int]]]:
    """Hand every claimed gap out in root-cause order: per claimer, the idle ns it claimed,
    the ns it got, and the ns it lost to each claimer that took a gap first. Dense arrays
    over the distinct gaps, one pass per (finding, root) group: no loop per gap."""
    order = {fid: i for i, fid in enumerate(ROOT_CAUSE_ORDER)}
    device, start, full_ns, want_all = (np.concatenate([f.claims[c].to_numpy(np.int64) for f in claimers])
                                        for c in ("device", "start", "full", "want"))
    code, n_gaps = _gap_codes(device, start)
    full = np.zeros(n_gaps, np.int64)
    full[code] = full_ns
    groups: list[tuple[float, int, np.ndarray]] = []
    at = 0
    for i, f in enumerate(claimers):
        n = len(f.claims)
        own = order.get(f.id, len(order))
        if "root" not in f.claims:  # one group, at the finding's own rank
            groups.append((own, i, at + np.arange(n)))
        else:
            rc, roots = pd.factorize(f.claims["root"].to_numpy(object))  # -1: the finding's own rank
            for k in np.unique(rc):
                rank = own if k < 0 else order.get(str(roots[k]), own - 1) + 0.5
                groups.append((rank, i, at + np.flatnonzero(rc == k)))
        at += n
    left, first = full.copy(), np.full(full.size, -1, np.int64)
    wanted, got = np.zeros(len(claimers), np.int64), np.zeros(len(claimers), np.int64)
    lost: list[dict[int, int]] = [{} for _ in claimers]
    for _, i, rows in sorted(groups, key=lambda g: (g[0], g[1])):
        gid, inv, by = _group_by_code(code[rows])  # (a gap claimed twice by one finding: once)
        w = np.minimum(np.bincount(inv, weights=want_all[rows][by]).astype(np.int64), full[gid])
        g = np.minimum(w, left[gid])
        left[gid] -= g
        short = w > g
        for o, ns in zip(*_sums(first[gid][short], (w - g)[short])):
            lost[i][o] = lost[i].get(o, 0) + ns
        first[gid[(first[gid] < 0) & (g > 0)]] = i
        wanted[i] += int(w.sum())
        got[i] += int(g.sum())
    return wanted, got, lost


def _gap_codes(device: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, int]:
    """A code per claim for its gap (``device``, ``start``), ``0..n_gaps-1`` in gap order,
    and the number of distinct gaps. A sort, not a hash: each finding's claims come in gap
    order, so the stable sort only merges a few sorted runs."""
    if device.size == 0:
        return device, 0
    o = np.lexsort((start, device))
    d, s = device[o], start[o]
    new = np.empty(o.size, dtype=bool)
    new[0] = True
    new[1:] = (d[1:] != d[:-1]) | (s[1:] != s[:-1])
    code = np.empty(o.size, np.int64)
    code[o] = np.cumsum(new) - 1
    return code, int(np.count_nonzero(new))


def _group_by_code(code: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct codes (ascending), each row's index among them (in the order ``o``) and
    that order: a stable sort of the rows by code (quick on codes that come ascending)."""
    o = np.argsort(code, kind="stable")
    c = code[o]
    new = np.empty(c.size, dtype=bool)
    new[:1] = True
    new[1:] = c[1:] != c[:-1]
    return c[new], np.cumsum(new) - 1, o


def _sums(keys: np.ndarray, values: np.ndarray) -> tuple[list[int], list[int]]:
    """Sum of ``values`` per distinct ``key``."""
    u, inv = np.unique(keys, return_inverse=True)
    return u.tolist(), np.bincount(inv, weights=values, minlength=u.size).astype(np.int64).tolist()


def _share_cause(f: Finding, claimers: list[Finding], lost: dict[int, int], wanted: int, got: int,
                 window_ns: int, options: Options) -> None:
    """``f`` claimed idle time that other claimers counted first (``lost``: claimer index
    -> ns): record it on both sides (:func:`_say_shared` words it) and take that time out of
    ``f``'s recoverable time."""
    rec = int(f.recoverable_ns or 0)
    other = max(0, rec - wanted)  # the part that is not these gaps (e.g. copy time)
    for o, ns in lost.items():
        first = claimers[o]
        for a, b, key in ((first, f, "also_counted_by"), (f, first, "counted_under")):
            ev = a.evidence
            ev["shared_cause_with"] = sorted(set(ev.get("shared_cause_with", [])) | {b.id})
            d = ev.setdefault("shared_idle_ns", {}).setdefault(key, {})
            d[b.id] = int(d.get(b.id, 0)) + int(ns)
    finish(f, other + min(rec - other, got), window_ns, options)


def _say_shared(f: Finding) -> None:
    """One sentence on the finding's shared cause, at the end of its recommendation."""
    sh = f.evidence.get("shared_idle_ns") or {}
    parts = []
    under = sh.get("counted_under") or {}
    if under:
        parts.append(f"{sum(under.values()) / 1e6:.2f} ms of what it claimed is counted under " + ", ".join(sorted(under)))
    also = sh.get("also_counted_by") or {}
    if also:  # (each of those claims part of the same time: their largest, not their sum)
        parts.append(f"up to {max(also.values()) / 1e6:.2f} ms of its own is also claimed by " + ", ".join(sorted(also)))
    if parts:
        f.recommendation = (f"{f.recommendation.rstrip()} Shared cause with {', '.join(f.evidence['shared_cause_with'])}: "
                            f"the same idle gaps, each counted once, under the finding that names the root cause ("
                            + "; ".join(parts) + ").")
