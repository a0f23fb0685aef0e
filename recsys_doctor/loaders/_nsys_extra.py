"""The small tables of an nsys export: thread names, GPU descriptions, and the call site
of each CUDA call in ``--cudabacktrace`` exports."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ._nsys_columns import as_int, as_str, distinct_threads
from ._nsys_gil import releasers
from ._nsys_schema import K, PID_SQL, TID_SQL, Schema

__all__ = ["Extras", "OS_WAIT_CALLS"]

#: OS runtime calls in which a thread waits for a lock held by another thread: a mutex,
#: a condition variable (CPython's GIL is a mutex plus a condition waited on with
#: ``pthread_cond_timedwait``), a reader/writer lock or a spin lock
OS_WAIT_CALLS = ("pthread_mutex_lock", "pthread_cond_wait", "pthread_cond_timedwait", "pthread_rwlock_rdlock",
                 "pthread_rwlock_wrlock", "pthread_rwlock_timedrdlock", "pthread_rwlock_timedwrlock",
                 "pthread_spin_lock")

#: libraries whose frames are not the program's own call site
_RUNTIME_LIB = re.compile(r"^(lib(cuda|cudart|cupti|nvidia|nvToolsExt|c10_cuda|torch_cuda|cublas|cudnn)|libc[-.])")
#: CUDA API wrappers (the runtime's templates inlined into the program)
_CUDA_SYMBOL = re.compile(r"\bcu(da)?[A-Z]\w*")
_API_SUFFIX = re.compile(r"_v\d+$")


class Extras(Schema):
    """Threads, devices and call sites, read after the activity tables."""

    def attach_callsites(self, df: pd.DataFrame) -> pd.DataFrame:
        """``--cudabacktrace`` exports: each call's ``callsite`` (see :meth:`callsites`),
        joined on ``(pid, correlation)``; other exports are returned as they are."""
        t = K + "RUNTIME"
        if not (len(df) and "callchainId" in self.cols(t) and "CUDA_CALLCHAINS" in self.tables and self.has_strings):
            return df
        gt = self.col(t, "r", "globalTid")
        name, join = self.string(t, "r", "nameId", "sn")
        bt = self.query(  # duplicate rows carry the chain, same correlation
            f"SELECT {PID_SQL.format(col=gt)} AS pid, {self.col(t, 'r', 'correlationId', '0')} AS correlation, "
            f"r.callchainId AS chain, {name} AS name FROM {t} r {join} WHERE r.callchainId IS NOT NULL")
        if not len(bt):
            return df
        return df.merge(self.callsites(bt), on=["pid", "correlation"], how="left")

    def callsites(self, bt: pd.DataFrame) -> pd.DataFrame:
        """``--cudabacktrace`` exports: per backtraced call ``(pid, correlation)``, the first
        frame in the program's own code (resolved, outside the CUDA/profiler libraries, not
        a CUDA API wrapper), as ``symbol (module)``. The call's ``callchainId`` is 0-based
        in some exports and equal to ``CUDA_CALLCHAINS.id`` in others: the offset whose
        chains contain the call's own API name more often wins."""
        rows = self.con.execute(
            "SELECT c.id, s.value, m.value, c.unresolved FROM CUDA_CALLCHAINS c "
            "JOIN StringIds s ON s.id = c.symbol JOIN StringIds m ON m.id = c.module "
            "ORDER BY c.id, c.stackDepth").fetchall()
        site: dict[int, str] = {}
        syms: dict[int, set[str]] = {}
        for cid, sym, mod, unresolved in rows:
            syms.setdefault(int(cid), set()).add(str(sym))
            if int(cid) in site or unresolved or not isinstance(sym, str):
                continue
            base = str(mod).rsplit("/", 1)[-1]
            if _RUNTIME_LIB.search(base) or _CUDA_SYMBOL.search(sym):
                continue
            site[int(cid)] = f"{sym} ({base})"
        chain = bt["chain"].to_numpy(np.int64)
        api = [_API_SUFFIX.sub("", str(n)) for n in bt["name"]]
        best = max((0, 1), key=lambda off: sum(a in syms.get(int(c) + off, ()) for c, a in zip(chain, api)))
        out = pd.DataFrame({"pid": bt["pid"].to_numpy(np.int64), "correlation": bt["correlation"].to_numpy(np.int64),
                            "callsite": [site.get(int(c) + best) for c in chain]})
        return out.drop_duplicates(["pid", "correlation"])

    def threads(self, api: pd.DataFrame | None, ranges: pd.DataFrame | None) -> pd.DataFrame:
        t = "ThreadNames"
        if t in self.tables and "globalTid" in self.cols(t):
            name, join = self.string(t, "tn", "nameId", "sn")
            # a thread renamed during the capture has several rows: keep the last one
            df = self.query(
                f"SELECT {PID_SQL.format(col='tn.globalTid')} AS pid, {TID_SQL.format(col='tn.globalTid')} AS tid, "
                f"{name} AS name FROM {t} tn {join} "
                f"WHERE tn.rowid IN (SELECT max(rowid) FROM {t} GROUP BY globalTid)"
            )
        else:
            df = pd.DataFrame({"pid": pd.Series(dtype="int64"), "tid": pd.Series(dtype="int64"),
                               "name": pd.Series(dtype=object)})
        # threads that call CUDA or NVTX but were never named (Windows captures, some
        # OpenACC runs) still get a row, with name None
        df = df.dropna(subset=["pid", "tid"])
        seen = [distinct_threads(x) for x in (api, ranges) if x is not None and len(x)]
        if seen:
            act = pd.concat(seen).dropna().astype("int64").drop_duplicates()
            known = pd.MultiIndex.from_frame(df[["pid", "tid"]].astype("int64"))
            missing = act[~pd.MultiIndex.from_frame(act.astype("int64")).isin(known)]
            if len(missing):
                self.repairs.append(f"{len(missing)} active threads missing from ThreadNames: added with no name")
                df = pd.concat([df, missing.assign(name=None)], ignore_index=True)
        return df.sort_values(["pid", "tid"], ignore_index=True)

    # --- OS lock waits --------------------------------------------------------------------
    def os_waits(self) -> pd.DataFrame | None:
        """Calls in which a thread blocks on a lock or condition (``OSRT_API`` rows of
        :data:`OS_WAIT_CALLS`, with ``--trace osrt``); None where the export has none.
        ``gil_by``: for a wait in which a thread takes the GIL back (its call stack, where
        the export has OS-runtime backtraces, goes through ``PyEval_RestoreThread``), the
        native call that had given it up (:mod:`._nsys_gil`); else missing."""
        t = "OSRT_API"
        if t not in self.tables or not self.has_strings or not {"globalTid", "nameId"} <= self.cols(t):
            return None
        names = ", ".join(f"'{n}'" for n in OS_WAIT_CALLS)
        chains = "callchainId" in self.cols(t) and {"id", "symbol", "module", "stackDepth"} <= self.cols(
            "OSRT_CALLCHAINS")
        df = self.query(
            f"SELECT o.start AS start, o.end AS end, {PID_SQL.format(col='o.globalTid')} AS pid, "
            f"{TID_SQL.format(col='o.globalTid')} AS tid, s.value AS name"
            f"{', o.callchainId AS chain' if chains else ''} FROM {t} o "
            f"JOIN StringIds s ON s.id = o.nameId WHERE s.value IN ({names})")
        if not len(df):
            return None
        by = self._gil_releasers() if chains else {}
        chain = pd.to_numeric(df.pop("chain"), errors="coerce") if chains else None
        df["gil_by"] = chain.map(by) if chain is not None and by else None
        return df

    def _gil_releasers(self) -> dict[int, str]:
        """``{call stack id: who gave the GIL up}`` for the condition waits' call stacks
        (:func:`._nsys_gil.releasers`), innermost frame first."""
        conds = "'pthread_cond_timedwait', 'pthread_cond_wait'"
        cur = self.con.execute(
            "SELECT c.id, s.value, m.value FROM OSRT_CALLCHAINS c JOIN StringIds s ON s.id = c.symbol "
            "JOIN StringIds m ON m.id = c.module WHERE c.id IN (SELECT DISTINCT o.callchainId FROM OSRT_API o "
            f"JOIN StringIds n ON n.id = o.nameId WHERE n.value IN ({conds})) ORDER BY c.id, c.stackDepth")
        return releasers(cur)

    # --- devices ------------------------------------------------------------------------
    def devices(self, tables: dict[str, pd.DataFrame | None]) -> pd.DataFrame | None:
        """The CUDA devices that any GPU activity row names (``deviceId``), described
        from whichever GPU table the export has."""
        src = {"kernels": K + "KERNEL", "memcpys": K + "MEMCPY", "memsets": K + "MEMSET",
               "syncs": K + "SYNCHRONIZATION", "graphs": K + "GRAPH_TRACE"}
        seen = [pd.unique(pd.to_numeric(df["device"]).dropna()) for k, t in src.items()
                if (df := tables.get(k)) is not None and "deviceId" in self.cols(t)]
        if not seen:
            return None
        used = sorted({int(d) for arr in seen for d in arr})
        info = self._device_info()
        rows = []
        for d in used:
            name, sm = info.get(d, (None, None))
            rows.append({"device": d, "name": name, "sm_count": sm})
        if used and not info:
            self.repairs.append("no GPU description table: device names unknown")
        return pd.DataFrame(rows)

    def _device_info(self) -> dict[int, tuple[str | None, int | None]]:
        """CUDA device index -> (name, SM count), from whichever table this export has.

        ``TARGET_INFO_GPU`` lists every GPU of the machine (also iGPUs and the Windows
        basic render driver) and its ``id`` may differ from the CUDA index ``cuDevice``;
        the activity tables' ``deviceId`` is the CUDA index. 2025.1+ also maps them
        explicitly in ``TARGET_INFO_CUDA_DEVICE(gpuId, cudaId)``."""
        out: dict[int, tuple[str | None, int | None]] = {}
        g = "TARGET_INFO_GPU"
        gcols = self.cols(g)
        gpu = None
        if g in self.tables and "name" in gcols:
            id_col = "id" if "id" in gcols else ("deviceId" if "deviceId" in gcols else None)
            if id_col is not None:
                gpu = self.query(
                    f'SELECT "{id_col}" AS id, {self.col(g, "t", "cuDevice")} AS cu, name, '
                    f'{self.col(g, "t", "smCount")} AS sm FROM {g} t'
                )
        cd = "TARGET_INFO_CUDA_DEVICE"
        if gpu is not None and cd in self.tables and {"gpuId", "cudaId"} <= self.cols(cd):
            for cuda_id, gpu_id, nsm in self.con.execute(
                f"SELECT DISTINCT cudaId, gpuId, {self.col(cd, 'c', 'numMultiprocessors')} FROM {cd} c"
            ).fetchall():
                hit = gpu[gpu["id"] == gpu_id]
                if len(hit) and cuda_id is not None:
                    sm = as_int(hit["sm"].iloc[0])
                    out.setdefault(int(cuda_id), (as_str(hit["name"].iloc[0]), sm or as_int(nsm)))
        if gpu is not None and len(gpu):
            gpu = gpu.assign(sm_pos=(pd.to_numeric(gpu["sm"], errors="coerce").fillna(0) > 0))
            for cu in set(pd.to_numeric(gpu["cu"], errors="coerce").dropna().astype(int)) | set(
                    pd.to_numeric(gpu["id"], errors="coerce").dropna().astype(int)):
                if cu in out:
                    continue
                # prefer a CUDA-capable GPU whose cuDevice is this index (several rows
                # share cuDevice 0 on Windows), then the row whose id is the index
                cands = gpu[gpu["cu"] == cu].sort_values(["sm_pos", "id"], ascending=[False, True], key=_bool_key)
                if not len(cands):
                    cands = gpu[gpu["id"] == cu]
                if len(cands):
                    r = cands.iloc[0]
                    out[cu] = (as_str(r["name"]), as_int(r["sm"]))
        cg = "TARGET_INFO_CUDA_GPU"  # <= 2021.1
        if cg in self.tables and {"deviceId", "name"} <= self.cols(cg):
            for dev, name, nsm in self.con.execute(
                f"SELECT deviceId, name, {self.col(cg, 'c', 'numMultiprocessors')} FROM {cg} c"
            ).fetchall():
                prev = out.get(int(dev))
                if prev is None or prev[1] is None:
                    out[int(dev)] = (as_str(name) or (prev[0] if prev else None), as_int(nsm))
        return out


# --------------------------------------------------------------------------------------


def _bool_key(s: pd.Series) -> pd.Series:
    return s.astype("int64") if s.dtype == bool else s
