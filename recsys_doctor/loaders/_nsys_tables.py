"""The activity tables of an nsys export, one ``SELECT`` and one whole-column decoding each.

Each table method returns a :data:`Job`: the ``SELECT`` (run by an engine in a worker
thread, in rowid chunks for the big tables) and ``post``, which turns one chunk's raw
integer columns into the canonical ones with numpy. String columns come out of ``post``
as :data:`~._nsys_columns.Codes` (codes into an array of values) and become categoricals
once, when the chunks are joined.

RUNTIME holds runtime (``eventClass`` 0) and driver (1) calls and, in some exports,
duplicate backtrace rows (67): only classes 0 and 1 are kept. NVTX ranges are push/pop
(59) and start/end (60) events; marks and naming events are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from ._nsys_columns import Codes, coalesce, enum_codes, nesting_depth, text_codes
from ._nsys_schema import K, Schema

__all__ = ["TableJobs", "Job", "COPY_KIND_CODES", "MEM_KIND_CODES", "SYNC_TYPE_CODES"]

#: one chunk of a table: column -> numpy array, pandas Series, or string Codes
Chunk = dict[str, Any]
#: what a table method hands the engine: the SELECT, and the whole-column decoding
Job = tuple[str, "Callable[[pd.DataFrame], Chunk]"]

#: ``ENUM_CUDA_MEMCPY_OPER`` (the same numbers in exports older than the enum table)
COPY_KIND_CODES: dict[int, str] = {
    1: "h2d", 2: "d2h", 3: "array", 4: "array", 5: "array", 6: "array", 7: "array",
    8: "d2d", 9: "h2h", 10: "p2p", 11: "uvm_h2d", 12: "uvm_d2h", 13: "uvm_d2d",
}  # anything else (0 unknown, new codes) -> "other"
#: ``ENUM_CUDA_MEM_KIND``; "static" device/managed memory is still device/managed memory.
#: Note nsys numbers these from 0 = pageable, unlike CUPTI's own enum (1 = pageable).
MEM_KIND_CODES: dict[int, str] = {
    0: "pageable", 1: "pinned", 2: "device", 3: "array", 4: "managed",
    5: "device", 6: "managed", 7: "unknown",
}
#: ``ENUM_CUPTI_SYNC_TYPE``
SYNC_TYPE_CODES: dict[int, str] = {1: "event", 2: "stream_wait_event", 3: "stream", 4: "context"}
#: ``ENUM_NSYS_EVENT_TYPE`` codes of NVTX ranges (59 push/pop, 60 start/end). Marks (34),
#: thread naming (39) and domain creation (75) are not ranges and are skipped.
NVTX_RANGE_TYPES = (59, 60)
NVTX_MARK_TYPE = 34
_API_SUFFIX = re.compile(r"_v\d+$")
_DIMS = (("gridX", "grid_x"), ("gridY", "grid_y"), ("gridZ", "grid_z"),
         ("blockX", "block_x"), ("blockY", "block_y"), ("blockZ", "block_z"))


def _plain(df: pd.DataFrame) -> Chunk:
    return {c: df[c] for c in df.columns}


class TableJobs(Schema):
    """The ``SELECT`` and decoding of each activity table this export has."""

    def jobs(self) -> dict[str, Job]:
        self.strings()  # read here, once: the decoding runs in worker threads
        made = {"kernels": self.kernels(), "memcpys": self.memcpys(), "memsets": self.memsets(),
                "api": self.api(), "syncs": self.syncs(), "graphs": self.graphs(), "ranges": self.ranges()}
        return {k: j for k, j in made.items() if j is not None}

    def kernels(self) -> Job | None:
        t = K + "KERNEL"
        if t not in self.tables:
            return None
        dims = ", ".join(f"{self.col(t, 'k', c)} AS {o}" for c, o in _DIMS)
        sql = (f"SELECT {self.gpu_common(t, 'k')}, {self.string_cols(t, 'k', 'demangledName', 'dn')}, "
               f"{self.string_cols(t, 'k', 'shortName', 'sn')}, {dims}, {self.in_graph(t, 'k')} AS ig_raw FROM {t} k")
        strings = self.strings()

        def post(df: pd.DataFrame) -> Chunk:
            name = coalesce(strings.resolve(df.pop("dn")), strings.resolve(df.pop("sn")))
            return _plain(df) | {"name": name}

        return sql, post

    def memcpys(self) -> Job | None:
        t = K + "MEMCPY"
        if t not in self.tables:
            return None
        sql = (f"SELECT {self.gpu_common(t, 'm')}, {self.col(t, 'm', 'bytes', '0')} AS bytes, "
               f"{self.col(t, 'm', 'copyKind')} AS kind, {self.col(t, 'm', 'srcKind')} AS src_mem, "
               f"{self.col(t, 'm', 'dstKind')} AS dst_mem, {self.in_graph(t, 'm')} AS ig_raw FROM {t} m")
        enums = {"kind": ("copyKind", COPY_KIND_CODES, "other"), "src_mem": ("srcKind", MEM_KIND_CODES, None),
                 "dst_mem": ("dstKind", MEM_KIND_CODES, None)}
        has = {out: self.col(t, "m", src) != "NULL" for out, (src, _, _) in enums.items()}

        def post(df: pd.DataFrame) -> Chunk:
            coded = {out: enum_codes(df.pop(out) if has[out] else None, names, default, len(df))
                     for out, (_, names, default) in enums.items()}
            return _plain(df) | coded

        return sql, post

    def memsets(self) -> Job | None:
        t = K + "MEMSET"
        if t not in self.tables:
            return None
        return (f"SELECT {self.gpu_common(t, 's')}, {self.col(t, 's', 'bytes', '0')} AS bytes, "
                f"{self.in_graph(t, 's')} AS ig_raw FROM {t} s"), _plain

    def syncs(self) -> Job | None:
        t = K + "SYNCHRONIZATION"
        if t not in self.tables:
            return None
        st = self.col(t, "y", "syncType")
        if st == "NULL":  # only the deprecated column (never seen, but cheap to handle)
            st = self.col(t, "y", "deprecatedSyncType")

        def post(df: pd.DataFrame) -> Chunk:
            raw = df.pop("sync_type")
            return _plain(df) | {"sync_type": enum_codes(raw if st != "NULL" else None, SYNC_TYPE_CODES,
                                                         "unknown", len(df))}

        return f"SELECT {self.gpu_common(t, 'y')}, {st} AS sync_type FROM {t} y", post

    def graphs(self) -> Job | None:
        t = K + "GRAPH_TRACE"
        if t not in self.tables:
            return None
        return f"SELECT {self.gpu_common(t, 'g')}, {self.col(t, 'g', 'graphId')} AS graph_id FROM {t} g", _plain

    def api(self) -> Job | None:
        t = K + "RUNTIME"
        if t not in self.tables:
            return None
        ec = self.col(t, "r", "eventClass")
        sql = (f'SELECT r.start AS start, r."end" AS "end", {self.col(t, "r", "globalTid")} AS gt_raw, '
               f"{self.col(t, 'r', 'correlationId', '0')} AS correlation, "
               f"{self.string_cols(t, 'r', 'nameId', 'nm')}, {ec} AS event_class FROM {t} r")
        strings = self.strings()
        # the nsys version suffix (cudaLaunchKernel_v7000) goes, once per distinct string
        stripped = _strip_suffix(strings.values)

        def post(df: pd.DataFrame) -> Chunk:
            codes, values = strings.resolve(df.pop("nm"))
            values = stripped if values is strings.values else _strip_suffix(values)
            cls = df.pop("event_class")
            if ec == "NULL":  # no class column: the driver API is the cu* namespace
                return _plain(df) | {"name": (codes, values), "api_class": _driver_by_name(codes, values)}
            keep = cls.isin([0, 1]).to_numpy()
            if not keep.all():  # e.g. eventClass 67: backtrace duplicates of the same calls
                with self.lock:
                    self.meta["api_rows_skipped"] = self.meta.get("api_rows_skipped", 0) + int((~keep).sum())
                df, codes, cls = df[keep].reset_index(drop=True), codes[keep], cls[keep]
            return _plain(df) | {"name": (codes, values),
                                 "api_class": enum_codes(cls, {0: "runtime", 1: "driver"}, None, len(df))}

        return sql, post

    def ranges(self) -> Job | None:
        t = "NVTX_EVENTS"
        if t not in self.tables:
            return None
        sql = (f'SELECT n.start AS start, n."end" AS "end", {self.col(t, "n", "globalTid")} AS gt_raw, '
               f"{self.col(t, 'n', 'text')} AS tx_txt, {self.string_cols(t, 'n', 'textId', 'ti')}, "
               f"{self.col(t, 'n', 'eventType')} AS event_type FROM {t} n")
        return sql, self._ranges_post

    def _ranges_post(self, df: pd.DataFrame) -> Chunk:
        """NVTX events -> ranges (the whole table at once: nesting needs every range)."""
        et = df.pop("event_type")
        n_marks = int((et == NVTX_MARK_TYPE).sum())
        if n_marks:
            self.meta["nvtx_marks_skipped"] = n_marks
        # a range still open when collection stopped lasted at least to the last NVTX
        # timestamp seen (of any NVTX event, ranges or not)
        last = pd.to_numeric(df["end"]).fillna(pd.to_numeric(df["start"])).max()
        df = df[et.isin(list(NVTX_RANGE_TYPES)).to_numpy()].reset_index(drop=True)
        open_ended = int(df["end"].isna().sum())
        if open_ended:
            df["end"] = df["end"].fillna(last)
            self.repairs.append(f"{open_ended} NVTX ranges had no end: closed at the last NVTX timestamp")
        name = coalesce(text_codes(df.pop("tx_txt")), self.strings().resolve(df.pop("ti")))
        out = _plain(df) | {"name": name, "source": (np.zeros(len(df), np.int64), np.array(["nvtx"], object))}
        if len(df):
            out["depth"] = nesting_depth(df)
        return out


def _strip_suffix(values: np.ndarray) -> np.ndarray:
    return np.array([_API_SUFFIX.sub("", u) if isinstance(u, str) else u for u in values], dtype=object)


def _driver_by_name(codes: np.ndarray, values: np.ndarray) -> Codes:
    """``api_class`` where the export has no ``eventClass``: ``cu*`` names (not ``cuda*``)
    are the driver API, everything else (unnamed calls too) the runtime."""
    drv = np.array([isinstance(v, str) and v.startswith("cu") and not v.startswith("cuda") for v in values], bool)
    is_drv = np.append(drv, False)[codes]
    return np.where(is_drv, 0, 1), np.array(["driver", "runtime"], dtype=object)
