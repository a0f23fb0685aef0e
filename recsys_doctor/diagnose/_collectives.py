"""Collectives matched across ranks: who arrives last, and how long the others wait.

Every rank of a collective leaves it together (an all-reduce or all-to-all ends only when
the last rank's data has arrived), but each enters when its own work before it is done.
The rank that arrives last waits for no one: its kernel is the shortest. Every other rank's
kernel runs longer by the time it spent waiting for that rank. So, per collective,

* ``wait(r) = duration(r) - min over ranks of duration`` - the time rank ``r`` waited;
* the **late rank** is the one with the shortest kernel (``wait = 0``).

This is **end alignment**: it needs no common clock, only the fact that the ranks finish a
collective together (checked where the traces are on one clock: ``end_spread_ns``, how far
apart the ranks' ends are on their own timestamps, should be far below the waits).

Collectives are matched across ranks by their position: the n-th kernel of a collective
kind (``AllReduce``, ``SendRecv``...) on a rank's k-th communication stream (streams
ordered by their first collective), which is the order NCCL runs them in per process group.
A key present on fewer than two ranks is unmatched (counted, not used).

A **straggler** is a rank the others wait for: summed over the collectives where it
arrives last, the mean wait of the other ranks reaches ``straggler_share`` of the median
rank's window.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

__all__ = ["collective_records", "match_collectives"]


def collective_records(stream: np.ndarray, kind: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[str, list]:
    """One rank's collectives as small lists (what a worker sends back): each with its
    stream ordinal, kind, occurrence index and start/end (ns, the trace's clock)."""
    if len(start) == 0:
        return {"stream": [], "kind": [], "n": [], "start": [], "end": []}
    df = pd.DataFrame({"stream": np.asarray(stream, np.int64), "kind": np.asarray(kind, object),
                       "start": np.asarray(start, np.int64), "end": np.asarray(end, np.int64)})
    df = df.sort_values(["start", "end"], kind="stable")
    first = df.groupby("stream", sort=False)["start"].transform("min")
    df["stream"] = pd.factorize(first.rank(method="dense").astype(np.int64), sort=True)[0]
    df["n"] = df.groupby(["stream", "kind"], sort=False).cumcount()
    return {c: df[c].tolist() for c in ("stream", "kind", "n", "start", "end")}


def _table(ranks: list[dict[str, Any]]) -> pd.DataFrame:
    parts = []
    for r in ranks:
        c = r["collectives"]
        if not c or not c["start"]:
            continue
        d = pd.DataFrame({k: c[k] for k in ("stream", "kind", "n", "start", "end")})
        d["rank"] = r["rank"]
        origin = r.get("origin_ns_epoch")
        d["abs_end"] = (d["end"] + origin) if isinstance(origin, int) else np.nan
        parts.append(d)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def match_collectives(ranks: list[dict[str, Any]], window_ns: float, straggler_share: float) -> dict[str, Any]:
    """Match the ranks' collectives; return the per-rank waits, the stragglers and how
    the ranks were aligned (see the module docstring). ``ranks``: ``{"rank",
    "collectives" (from :func:`collective_records`), "origin_ns_epoch"}`` each."""
    t = _table(ranks)
    empty = {"matched": 0, "unmatched": 0, "alignment": "end", "end_spread_ns": None, "largest_skews": [],
             "per_rank": {}, "stragglers": []}
    if not len(t) or t["rank"].nunique() < 2:
        return empty
    key = ["stream", "kind", "n"]
    t["dur"] = t["end"] - t["start"]
    size = t.groupby(key)["rank"].transform("nunique")
    unmatched = int(t.loc[size < 2].drop_duplicates(key).shape[0])
    t = t[size >= 2].copy()
    if not len(t):
        return {**empty, "unmatched": unmatched}
    g = t.groupby(key, sort=False)
    t["wait"] = t["dur"] - g["dur"].transform("min")
    t["cid"] = g.ngroup()
    late = t.loc[t.groupby("cid")["dur"].idxmin(), ["cid", "rank"]].set_index("cid")["rank"]
    t["late"] = t["cid"].map(late)
    per_rank = _per_rank(t)
    spread = None
    if t["abs_end"].notna().all():
        es = g["abs_end"].agg(lambda s: s.max() - s.min())
        spread = {"median": int(es.median()), "max": int(es.max())}
    return {"matched": int(t["cid"].nunique()), "unmatched": unmatched, "alignment": "end",
            "end_spread_ns": spread, "largest_skews": _largest_skews(t), "per_rank": per_rank,
            "stragglers": _stragglers(t, window_ns, straggler_share)}


def _largest_skews(t: pd.DataFrame, n: int = 5) -> list[dict[str, Any]]:
    """The ``n`` collectives with the largest arrival skew (the longest wait of a rank for
    the late one): which rank came late and how long the others waited."""
    g = t.groupby("cid").agg(skew=("wait", "max"), total=("wait", "sum"), late=("late", "first"))
    out = []
    for cid, row in g.sort_values("skew", ascending=False, kind="stable").head(n).iterrows():
        first = t[t["cid"] == cid].iloc[0]
        out.append({"collective": _name(first), "late_rank": int(row["late"]), "skew_ns": int(row["skew"]),
                    "others_waited_ns": int(row["total"])})
    return out


def _per_rank(t: pd.DataFrame) -> dict[int, dict[str, int]]:
    """Each rank's own wait, how often it arrived last and the others' wait it caused."""
    caused = t.groupby("late")["wait"].sum()
    out = {}
    for rank, g in t.groupby("rank"):
        out[int(rank)] = {"waited_ns": int(g["wait"].sum()),
                          "arrived_last": int((g["late"] == rank).sum()),
                          "others_waited_ns": int(caused.get(rank, 0))}
    return out


def _name(row: Any) -> str:
    return f"{row.kind} #{int(row.n) + 1}" + (f" (comm stream {int(row.stream) + 1})" if row.stream else "")


def _stragglers(t: pd.DataFrame, window_ns: float, straggler_share: float) -> list[dict[str, Any]]:
    others = t[t["rank"] != t["late"]]
    if not len(others) or window_ns <= 0:
        return []
    per_coll = others.groupby(["late", "cid"]).agg(total=("wait", "sum"), mean=("wait", "mean"),
                                                   first_start=("start", "min"))
    out = []
    for late, g in per_coll.groupby(level="late"):
        mean_wait = float(g["mean"].sum())
        if mean_wait < straggler_share * window_ns:
            continue
        colls = []
        for (_, cid), row in g.sort_values("total", ascending=False).head(10).iterrows():
            c = t[t["cid"] == cid]
            colls.append({"collective": _name(c.iloc[0]), "others_waited_ns": int(row["total"]),
                          "waited_ns": {str(int(r)): int(w) for r, w in zip(c["rank"], c["wait"]) if r != late}})
        out.append({"rank": int(late), "others_waited_ns": int(g["total"].sum()),
                    "mean_wait_per_rank_ns": int(mean_wait), "share_of_window": round(mean_wait / window_ns, 4),
                    "collectives_arrived_last": int(len(g)), "collectives": colls})
    return sorted(out, key=lambda s: -s["others_waited_ns"])
