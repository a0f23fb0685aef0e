"""The Nsight Systems loaders (SQLite export, .sqlite.gz, .nsys-rep through ``nsys export``).

Every expected number comes from an independent source: a direct SQL query on the file,
a table written in this test from SCHEMAS.md's enum lists, or a tiny hand-built database
whose contents are spelled out below. Nothing is copied from the loader's own output.
"""

from __future__ import annotations

import functools
import gzip
import os
import re
import shutil
import sqlite3
import stat
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import shared_files
from recsys_doctor.errors import BadInputError, NsysNotFoundError, TraceFormatError
from recsys_doctor.loaders import load
from recsys_doctor.loaders import nsysrep
from recsys_doctor.loaders.nsys import load_nsys_sqlite
from recsys_doctor.loaders.nsysrep import load_nsys_rep

SHARED_SQLITE = shared_files("nsys", ("*.sqlite",)) + shared_files("h100", ("*.sqlite",))
K = "CUPTI_ACTIVITY_KIND_"

# enum tables written out from SCHEMAS.md section 4, on purpose not imported from the loader
COPY = {1: "h2d", 2: "d2h", 3: "array", 4: "array", 5: "array", 6: "array", 7: "array", 8: "d2d",
        9: "h2h", 10: "p2p", 11: "uvm_h2d", 12: "uvm_d2h", 13: "uvm_d2d"}
MEM = {0: "pageable", 1: "pinned", 2: "device", 3: "array", 4: "managed", 5: "device", 6: "managed", 7: "unknown"}
SYNC = {1: "event", 2: "stream_wait_event", 3: "stream", 4: "context"}


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _load(path: str):
    return load_nsys_sqlite(path)


def _sql(path: Path | str, q: str, args: tuple = ()) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return con.execute(q, args).fetchall()
    finally:
        con.close()


def _has(path: Path | str, table: str) -> bool:
    return bool(_sql(path, "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)))


def _count(path: Path | str, table: str, where: str = "") -> int:
    if not _has(path, table):
        return 0
    return _sql(path, f"SELECT count(*) FROM {table} {where}")[0][0]


def _cols(path: Path | str, table: str) -> set[str]:
    return {r[1] for r in _sql(path, f"PRAGMA table_info({table})")}


def _shared(shared_traces: Path, sub: str, name: str) -> Path:
    p = shared_traces / sub / name
    if not p.exists():
        pytest.skip(f"{p} not in this copy of ../shared")
    return p


# --------------------------------------------------------------------------------------
# every shared export
# --------------------------------------------------------------------------------------
@pytest.mark.shared
@pytest.mark.parametrize("path", SHARED_SQLITE, ids=lambda p: p.name[:48])
def test_shared_counts_match_sql(shared_traces, path):
    tr = _load(str(path))
    assert tr.format == "nsys-sqlite"
    assert len(tr.kernels) == _count(path, K + "KERNEL")
    assert len(tr.memcpys) == _count(path, K + "MEMCPY")
    assert len(tr.memsets) == _count(path, K + "MEMSET")
    assert len(tr.syncs) == _count(path, K + "SYNCHRONIZATION")
    assert len(tr.graphs) == _count(path, K + "GRAPH_TRACE")
    rt = K + "RUNTIME"
    if _has(path, rt) and "eventClass" in _cols(path, rt):
        assert len(tr.api) == _count(path, rt, "WHERE eventClass IN (0, 1)")
    else:
        assert len(tr.api) == _count(path, rt)
    assert len(tr.ranges) == _count(path, "NVTX_EVENTS", "WHERE eventType IN (59, 60)")
    # missing tables are reported, present ones are not
    for t in (K + "KERNEL", K + "MEMCPY", K + "MEMSET", K + "SYNCHRONIZATION", rt, "NVTX_EVENTS"):
        assert (t in tr.meta["tables_missing"]) == (not _has(path, t))


@pytest.mark.shared
@pytest.mark.parametrize("path", SHARED_SQLITE, ids=lambda p: p.name[:48])
def test_shared_enums_and_flags_match_sql(shared_traces, path):
    tr = _load(str(path))
    if _has(path, K + "MEMCPY"):
        for col, model_col, table in (("copyKind", "kind", COPY), ("srcKind", "src_mem", MEM), ("dstKind", "dst_mem", MEM)):
            want: dict[str, int] = {}
            for code, n in _sql(path, f"SELECT {col}, count(*) FROM {K}MEMCPY GROUP BY {col}"):
                key = table.get(code, "other" if model_col == "kind" else None)
                if key is not None:
                    want[key] = want.get(key, 0) + n
            assert tr.memcpys[model_col].value_counts().to_dict() == want
    if _has(path, K + "SYNCHRONIZATION"):
        want = {}
        for code, n in _sql(path, f"SELECT syncType, count(*) FROM {K}SYNCHRONIZATION GROUP BY syncType"):
            want[SYNC.get(code, "unknown")] = want.get(SYNC.get(code, "unknown"), 0) + n
        assert tr.syncs["sync_type"].value_counts().to_dict() == want
    for attr, table in (("kernels", "KERNEL"), ("memcpys", "MEMCPY"), ("memsets", "MEMSET")):
        if _has(path, K + table):
            n = _count(path, K + table, "WHERE graphNodeId IS NOT NULL AND graphNodeId != 0")
            assert int(getattr(tr, attr)["in_graph"].sum()) == n
    # api names: the stored name with one nsys version suffix (_vNNNN) removed
    # (cudaGetDeviceProperties_v2_v12000 -> cudaGetDeviceProperties_v2, the real API name)
    rt = K + "RUNTIME"
    if _has(path, rt):
        where = "WHERE r.eventClass IN (0, 1)" if "eventClass" in _cols(path, rt) else ""
        want = {}
        for v, n in _sql(path, f"SELECT s.value, count(*) FROM {rt} r JOIN StringIds s ON s.id = r.nameId {where} GROUP BY s.value"):
            base = re.sub(r"_v[0-9]+$", "", v)
            want[base] = want.get(base, 0) + n
        assert tr.api["name"].value_counts().to_dict() == want
    # the GPU side's pids are real OS pids
    if _has(path, "PROCESSES") and len(tr.kernels):
        pids = {r[0] for r in _sql(path, "SELECT pid FROM PROCESSES")}
        assert set(tr.kernels["pid"]) <= pids
    # timestamps are the stored ones, unshifted
    if len(tr.kernels):
        lo, hi = _sql(path, f"SELECT min(start), max(\"end\") FROM {K}KERNEL")[0]
        assert tr.kernels["start"].min() == lo and tr.kernels["end"].max() == hi


@pytest.mark.shared
def test_pid_tid_decoding(shared_traces):
    path = _shared(shared_traces, "h100", "torch_matmul_2threads_h100.sqlite")
    tr = _load(str(path))
    # hand arithmetic on raw globalTids: pid = bits 24..47, tid = bits 0..23
    raw = _sql(path, f"SELECT DISTINCT globalTid FROM {K}RUNTIME WHERE eventClass IN (0, 1)")
    want = {((g >> 24) % 2**24, g % 2**24) for (g,) in raw}
    assert set(zip(tr.api["pid"], tr.api["tid"])) == want
    # the process table names the same OS pid for the GPU side
    want_pids = _sql(path, f"SELECT DISTINCT p.pid FROM PROCESSES p JOIN {K}KERNEL k ON k.globalPid = p.globalPid")
    assert set(tr.kernels["pid"]) == {r[0] for r in want_pids} and len(want_pids) == 1
    # several threads launch: more than one tid, one of them the main thread (tid == pid)
    tids = set(tr.api["tid"])
    assert len(tids) >= 2 and tr.api["pid"].iloc[0] in tids
    # thread names come from ThreadNames
    g, name = _sql(path, "SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId "
                         "ORDER BY t.rowid DESC LIMIT 1")[0]
    row = tr.threads[(tr.threads.pid == (g >> 24) % 2**24) & (tr.threads.tid == g % 2**24)]
    assert list(row["name"]) == [name]


@pytest.mark.shared
def test_windows_pid_differs_from_tid_and_device_is_the_cuda_gpu(shared_traces):
    path = _shared(shared_traces, "nsys", "Faraz-Nasir__CUDA---Recap__report1.sqlite")
    tr = _load(str(path))
    assert (tr.api["pid"] != tr.api["tid"]).all()
    # TARGET_INFO_GPU lists 2 adapters; only the CUDA GPU used by the kernels is a device
    assert _count(path, "TARGET_INFO_GPU") == 2
    assert list(tr.devices["device"]) == [0]
    name, sm = _sql(path, "SELECT name, smCount FROM TARGET_INFO_GPU WHERE smCount > 0")[0]
    assert list(tr.devices["name"]) == [name] and list(tr.devices["sm_count"]) == [sm]


@pytest.mark.shared
def test_device_maps_through_cudevice(shared_traces):
    path = _shared(shared_traces, "nsys", "yyhtbs-yye__mmagic_vsr_v2__net.sqlite")
    tr = _load(str(path))
    used = sorted(r[0] for r in _sql(path, f"SELECT DISTINCT deviceId FROM {K}KERNEL"))
    assert list(tr.devices["device"]) == used == [0]
    # in this file TARGET_INFO_GPU.id 1 is CUDA device 0
    assert _sql(path, "SELECT id FROM TARGET_INFO_GPU WHERE cuDevice = 0") == [(1,)]
    assert tr.devices["sm_count"].iloc[0] == _sql(path, "SELECT smCount FROM TARGET_INFO_GPU WHERE cuDevice = 0")[0][0]


@pytest.mark.shared
def test_devices_without_gpu_table(shared_traces):
    path = _shared(shared_traces, "nsys", "GindaChen__nsys-ai__h100_2gpu_1s.sqlite")
    tr = _load(str(path))
    assert not _has(path, "TARGET_INFO_GPU")
    assert list(tr.devices["device"]) == sorted(r[0] for r in _sql(path, f"SELECT DISTINCT deviceId FROM {K}KERNEL"))
    assert tr.devices["name"].isna().all()
    assert tr.meta["derived_from"] == _sql(path, "SELECT value FROM META_DATA_EXPORT WHERE name='DERIVED_FROM'")[0][0]


@pytest.mark.shared
def test_api_suffix_stripped_and_classes(shared_traces):
    path = _shared(shared_traces, "nsys", "hpcgroup__pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    tr = _load(str(path))
    # eventClass 67 backtrace duplicates are dropped; the rest split into runtime/driver
    by_class = dict(_sql(path, f"SELECT eventClass, count(*) FROM {K}RUNTIME GROUP BY eventClass"))
    assert by_class.get(67, 0) > 0
    assert (tr.api["api_class"] == "runtime").sum() == by_class.get(0, 0)
    assert (tr.api["api_class"] == "driver").sum() == by_class.get(1, 0)
    raw = _sql(path, f"SELECT s.value, count(*) FROM {K}RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                     "WHERE r.eventClass IN (0, 1) GROUP BY s.value")
    want: dict[str, int] = {}
    for v, n in raw:
        base = v[: v.rindex("_v")] if re.search(r"_v\d+$", v) else v
        want[base] = want.get(base, 0) + n
    assert tr.api["name"].value_counts().to_dict() == want
    assert any(v.startswith("cudaLaunchKernel_v") for v, _ in raw) and "cudaLaunchKernel" in want


@pytest.mark.shared
def test_nvtx_textid_resolved(shared_traces):
    path = _shared(shared_traces, "nsys", "YoonKyonghwan__EfficientCenterFormer__poolformer.sqlite")
    tr = _load(str(path))
    assert _count(path, "NVTX_EVENTS", "WHERE eventType IN (59, 60) AND text IS NULL AND textId IS NOT NULL") > 0
    assert tr.ranges["name"].notna().all()
    start, g, text_id = _sql(path, "SELECT start, globalTid, textId FROM NVTX_EVENTS WHERE eventType = 59 "
                                   "AND text IS NULL ORDER BY start, rowid LIMIT 1")[0]
    (value,) = _sql(path, "SELECT value FROM StringIds WHERE id = ?", (text_id,))[0]
    hit = tr.ranges[(tr.ranges.start == start) & (tr.ranges.tid == g % 2**24)]
    assert value in set(hit["name"])
    assert (tr.ranges["source"] == "nvtx").all()


@pytest.mark.shared
@pytest.mark.parametrize("name", ["YoonKyonghwan__EfficientCenterFormer__poolformer.sqlite",
                                  "LeiWang1999__memfusion_artifact__report1.sqlite"])
def test_nvtx_timestamps_kept_as_stored(shared_traces, name):
    path = _shared(shared_traces, "nsys", name)
    tr = _load(str(path))
    # the file has negative NVTX timestamps (SCHEMAS.md section 6) ...
    assert _sql(path, "SELECT min(start) FROM NVTX_EVENTS")[0][0] < 0
    # ... and every range keeps its stored start and end exactly (no shift, no clipping)
    raw = pd.DataFrame(_sql(path, 'SELECT start, "end" FROM NVTX_EVENTS WHERE eventType IN (59, 60)'),
                       columns=["start", "end"]).sort_values(["start", "end"], ignore_index=True)
    got = tr.ranges[["start", "end"]].sort_values(["start", "end"], ignore_index=True)
    assert (got.to_numpy() == raw.to_numpy()).all()


@pytest.mark.shared
def test_nvtx_depth_is_containment(shared_traces):
    path = _shared(shared_traces, "nsys", "MohanadOdema__DLProf__nsys_profile.sqlite")
    tr = _load(str(path))
    rows = _sql(path, 'SELECT start, "end", globalTid FROM NVTX_EVENTS WHERE eventType = 59')
    # brute force: depth = number of other push/pop ranges of the thread that contain it
    for s, e, g in rows[:80]:
        want = sum(1 for s2, e2, g2 in rows if g2 == g and s2 <= s and e2 >= e) - 1
        got = tr.ranges[(tr.ranges.start == s) & (tr.ranges.end == e) & (tr.ranges.tid == g % 2**24)]["depth"]
        assert want in set(got)
    assert tr.ranges["depth"].max() > 0


@pytest.mark.shared
@pytest.mark.parametrize("name,codes", [("SMcMann__cudaHW__report3.sqlite", (11,)),
                                        ("ynan1__aws_gpu__report2.sqlite", (11, 12))])
def test_uvm_copy_kinds(shared_traces, name, codes):
    path = _shared(shared_traces, "nsys", name)
    tr = _load(str(path))
    for code in codes:
        n = _count(path, K + "MEMCPY", f"WHERE copyKind = {code}")
        assert n > 0 and (tr.memcpys["kind"] == COPY[code]).sum() == n
    uvm = tr.memcpys[tr.memcpys["kind"].str.startswith("uvm")]
    assert (uvm["src_mem"] == "unknown").all() and (uvm["correlation"] == 0).all()


@pytest.mark.shared
def test_graph_trace(shared_traces):
    path = _shared(shared_traces, "h100", "wdl_graphs_q4_h100.sqlite")
    tr = _load(str(path))
    assert len(tr.graphs) == 1779 == _count(path, K + "GRAPH_TRACE")  # 1779 per h100/README.md
    want = dict(_sql(path, f"SELECT graphId, count(*) FROM {K}GRAPH_TRACE GROUP BY graphId"))
    assert tr.graphs["graph_id"].value_counts().to_dict() == want
    (launches,) = _sql(path, f"SELECT count(*) FROM {K}RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                             "WHERE s.value LIKE 'cudaGraphLaunch%'")[0]
    assert launches == 1779
    assert (tr.api["name"] == "cudaGraphLaunch").sum() == launches
    # every graph execution joins back to its launch on (pid, correlation)
    m = tr.graphs.merge(tr.api, on=["pid", "correlation"], suffixes=("", "_api"))
    assert len(m) == len(tr.graphs) and (m["name"] == "cudaGraphLaunch").all()


@pytest.mark.shared
def test_correlation_collisions_across_processes_untouched(shared_traces):
    path = _shared(shared_traces, "nsys", "NVIDIA__Fuser__report1.sqlite")
    tr = _load(str(path))
    colliding = _sql(path, f"SELECT correlationId FROM {K}RUNTIME WHERE eventClass IN (0, 1) GROUP BY correlationId "
                           "HAVING count(DISTINCT (globalTid >> 24) & 16777215) > 1")
    assert len(colliding) > 0
    per = tr.api.groupby("correlation")["pid"].nunique()
    assert sorted(per[per > 1].index) == sorted(c for (c,) in colliding)
    # the (pid, correlation) join gives what SQL gives
    (n,) = _sql(path, f"SELECT count(*) FROM {K}KERNEL k JOIN {K}RUNTIME r ON r.correlationId = k.correlationId "
                      "AND (r.globalTid >> 24) = (k.globalPid >> 24) WHERE r.eventClass IN (0, 1)")[0]
    assert len(tr.kernels.merge(tr.api, on=["pid", "correlation"])) == n


@pytest.mark.shared
def test_kernel_names_prefer_demangled(shared_traces):
    path = _shared(shared_traces, "nsys", "MohanadOdema__DLProf__nsys_profile.sqlite")
    tr = _load(str(path))
    raw = _sql(path, f"SELECT d.value, count(*) FROM {K}KERNEL k JOIN StringIds d ON d.id = k.demangledName GROUP BY d.value")
    assert tr.kernels["name"].value_counts().to_dict() == dict(raw)
    assert {"kernel_name", "long_kernel_name"} <= _cols(path, K + "KERNEL")  # DLProf's extra columns


@pytest.mark.shared
def test_versions(shared_traces):
    p = _shared(shared_traces, "nsys", "LeiWang1999__memfusion_artifact__report1.sqlite")
    kv = dict(_sql(p, "SELECT name, value FROM EXPORT_META_DATA"))
    assert _load(str(p)).meta["nsys_version"] == kv["EXPORT_PRODUCT_VERSION"]
    assert _load(str(p)).meta["export_schema_version"] == kv["EXPORT_SCHEMA_VERSION"]
    p = _shared(shared_traces, "nsys", "GindaChen__nsys-ai__mock.sqlite")
    kv = dict(_sql(p, "SELECT name, value FROM META_DATA_EXPORT"))
    assert _load(str(p)).meta["nsys_version"] == kv["EXPORT_PRODUCT_VERSION"]
    # no metadata table: from the injection library's install path in StringIds
    p = _shared(shared_traces, "nsys", "bwyogatama__Mordred-Deprecated__report1.sqlite")
    assert not _has(p, "EXPORT_META_DATA") and not _has(p, "META_DATA_EXPORT")
    assert _load(str(p)).meta["nsys_version"] == "2021.2.1"  # /opt/nvidia/nsight-systems/2021.2.1/...
    p = _shared(shared_traces, "nsys", "PolPuigPuy__OpenACC_Project_PolPuig__report12.sqlite")
    assert _load(str(p)).meta["nsys_version"] is None


@pytest.mark.shared
def test_gzip_and_dispatcher(shared_traces, tmp_path):
    src = _shared(shared_traces, "nsys", "IkerCanut__fire_spread__report1.sqlite")
    gz = tmp_path / "t.sqlite.gz"
    with open(src, "rb") as f, gzip.open(gz, "wb") as g:
        shutil.copyfileobj(f, g)
    for tr in (load_nsys_sqlite(gz), load(gz)):
        assert tr.meta.get("compressed") == "gzip"
        assert len(tr.kernels) == _count(src, K + "KERNEL") and len(tr.memsets) == _count(src, K + "MEMSET")


@pytest.mark.shared
def test_truncated_real_file(shared_traces, tmp_path):
    src = _shared(shared_traces, "h100", "wdl_serial_q4_h100.sqlite")
    bad = tmp_path / "cut.sqlite"
    bad.write_bytes(src.read_bytes()[:4096])
    with pytest.raises(TraceFormatError, match="truncated") as e:
        load_nsys_sqlite(bad)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)


# --------------------------------------------------------------------------------------
# a tiny hand-built export: runs everywhere, every number visible here
# --------------------------------------------------------------------------------------
G = lambda pid, tid: (1 << 48) | (pid << 24) | tid  # noqa: E731  globalTid as nsys builds it
GP = lambda pid: (1 << 48) | (pid << 24)  # noqa: E731


def make_tiny_export(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
        CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, "end" INTEGER, eventClass INTEGER,
            globalTid INTEGER, correlationId INTEGER, nameId INTEGER, returnValue INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, "end" INTEGER, deviceId INTEGER,
            contextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER,
            demangledName INTEGER, shortName INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER,
            blockX INTEGER, blockY INTEGER, blockZ INTEGER, graphNodeId INTEGER, extra_tool_col TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, "end" INTEGER, deviceId INTEGER,
            contextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER, bytes INTEGER,
            copyKind INTEGER, srcKind INTEGER, dstKind INTEGER, graphNodeId INTEGER);
        CREATE TABLE NVTX_EVENTS (start INTEGER, "end" INTEGER, eventType INTEGER, text TEXT,
            globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER);
        CREATE TABLE TARGET_INFO_GPU (vmId INTEGER, id INTEGER, name TEXT, smCount INTEGER, cuDevice INTEGER);
        INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel_v7000'), (2, 'cuLaunchKernel'),
            (3, 'void gemm<float>(float*)'), (4, 'gemm'), (5, 'registered range'), (6, 'main'),
            (7, 'cuGetProcAddress_v2'), (8, 'worker');
        INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_VERSION', '2099.1.0.1'), ('EXPORT_SCHEMA_VERSION', '9.9.9');
        INSERT INTO ThreadNames VALUES (6, 0, %(main)d), (8, 0, %(w)d);
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES
            (100, 120, 0, %(main)d, 5, 1, 0),
            (130, 140, 1, %(w)d, 6, 2, 0),
            (150, 151, 1, %(w)d, 0, 7, 0),
            (100, 120, 67, %(main)d, 5, 4, 0),
            (200, 210, 0, %(other)d, 5, 1, 0);
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
            (125, 160, 1, 1, 7, 5, %(gp)d, 3, 4, 8, 1, 1, 128, 1, 1, NULL, 'x'),
            (161, 170, 1, 1, 7, 6, %(gp)d, 3, 4, 8, 1, 1, 128, 1, 1, 0, 'x'),
            (171, 175, 1, 1, 7, 0, %(gp)d, 3, 4, 8, 1, 1, 128, 1, 1, 42, 'x'),
            (220, 230, 0, 1, 9, 5, %(gpo)d, 99, 4, 8, 1, 1, 128, 1, 1, NULL, 'x');
        INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES
            (10, 20, 1, 1, 7, 1, %(gp)d, 4096, 1, 0, 2, NULL),
            (20, 30, 1, 1, 7, 2, %(gp)d, 4096, 2, 2, 1, NULL),
            (30, 40, 1, 1, 0, 0, %(gp)d, 65536, 11, 7, 7, NULL),
            (40, 50, 1, 1, 7, 3, %(gp)d, 8, 0, 2, 5, 3);
        INSERT INTO NVTX_EVENTS VALUES
            (-5000, 1000, 59, 'outer', %(main)d, NULL, NULL),
            (-4000, 500, 59, NULL, %(main)d, NULL, 5),
            (-4000, -4000, 59, 'empty', %(main)d, NULL, NULL),
            (600, 700, 60, 'startend', %(main)d, %(w)d, NULL),
            (50, NULL, 34, 'a mark', %(main)d, NULL, NULL),
            (-9000, NULL, 75, 'domain', %(main)d, NULL, NULL),
            (10, 20, 59, 'other thread', %(w)d, NULL, NULL);
        INSERT INTO TARGET_INFO_GPU VALUES (0, 0, 'Render Driver', 0, 1), (0, 1, 'GPU A', 10, 0), (0, 2, 'GPU B', 20, 1);
        """ % {"main": G(1000, 1000), "w": G(1000, 1001), "other": G(2000, 2000), "gp": GP(1000), "gpo": GP(2000)}
    )
    con.commit()
    con.close()
    return path


@pytest.fixture
def tiny(tmp_path) -> Path:
    return make_tiny_export(tmp_path / "tiny.sqlite")


def test_tiny_export_tables(tiny):
    tr = load_nsys_sqlite(tiny)
    # api: the eventClass 67 row is dropped; suffixes stripped; classes from eventClass
    assert list(tr.api["name"]) == ["cudaLaunchKernel", "cuLaunchKernel", "cuGetProcAddress", "cudaLaunchKernel"]
    assert list(tr.api["api_class"]) == ["runtime", "driver", "driver", "runtime"]
    assert list(tr.api["pid"]) == [1000, 1000, 1000, 2000]
    assert list(tr.api["tid"]) == [1000, 1001, 1001, 2000]
    # kernels: demangled name, shortName when the demangled id does not resolve; graph flag
    assert list(tr.kernels["name"]) == ["void gemm<float>(float*)"] * 3 + ["gemm"]
    assert list(tr.kernels["in_graph"]) == [False, False, True, False]
    assert list(tr.kernels["pid"]) == [1000, 1000, 1000, 2000]
    assert list(tr.kernels["grid_x"]) == [8] * 4 and list(tr.kernels["block_x"]) == [128] * 4
    # correlation 5 exists in two processes: the (pid, correlation) join keeps them apart
    m = tr.kernels[tr.kernels.correlation != 0].merge(tr.api, on=["pid", "correlation"])  # 0 = no link
    assert sorted(zip(m["pid"], m["name_y"])) == sorted([(1000, "cudaLaunchKernel"), (1000, "cuLaunchKernel"),
                                                         (2000, "cudaLaunchKernel")])
    # memcpys
    assert list(tr.memcpys["kind"]) == ["h2d", "d2h", "uvm_h2d", "other"]
    assert list(tr.memcpys["src_mem"]) == ["pageable", "device", "unknown", "device"]
    assert list(tr.memcpys["dst_mem"]) == ["device", "pinned", "unknown", "device"]
    assert list(tr.memcpys["in_graph"]) == [False, False, False, True]
    # devices: only the ones used (0 and 1), by CUDA index through cuDevice
    assert tr.devices.to_dict("records") == [{"device": 0, "name": "GPU A", "sm_count": 10},
                                             {"device": 1, "name": "GPU B", "sm_count": 20}]
    # missing tables, versions
    assert set(tr.meta["tables_missing"]) >= {K + "MEMSET", K + "SYNCHRONIZATION", K + "GRAPH_TRACE"}
    assert len(tr.memsets) == len(tr.syncs) == len(tr.graphs) == 0
    assert tr.meta["nsys_version"] == "2099.1.0.1" and tr.meta["export_schema_version"] == "9.9.9"
    # threads: the two named ones plus the unnamed thread of pid 2000
    assert sorted(zip(tr.threads["pid"], tr.threads["tid"], tr.threads["name"].fillna("-"))) == [
        (1000, 1000, "main"), (1000, 1001, "worker"), (2000, 2000, "-")]


def test_tiny_export_ranges(tiny):
    tr = load_nsys_sqlite(tiny)
    r = tr.ranges.sort_values(["tid", "start", "end"], ignore_index=True)
    # marks (34) and domain creation (75) are not ranges; negative starts are kept
    assert sorted(r["name"]) == sorted(["outer", "empty", "registered range", "startend", "other thread"])
    by = dict(zip(r["name"], zip(r["start"], r["end"], r["depth"], r["tid"])))
    assert by["outer"] == (-5000, 1000, 0, 1000)
    assert by["registered range"] == (-4000, 500, 1, 1000)  # textId resolved through StringIds
    assert by["empty"] == (-4000, -4000, 2, 1000)           # zero-length, inside both
    assert by["startend"] == (600, 700, 1, 1000)            # on its starting thread
    assert by["other thread"] == (10, 20, 0, 1001)
    assert tr.meta["nvtx_marks_skipped"] == 1


def test_unterminated_nvtx_range_is_closed_and_reported(tiny):
    con = sqlite3.connect(tiny)
    con.execute("INSERT INTO NVTX_EVENTS VALUES (800, NULL, 59, 'never popped', ?, NULL, NULL)", (G(1000, 1000),))
    con.commit()
    con.close()
    tr = load_nsys_sqlite(tiny)
    row = tr.ranges[tr.ranges.name == "never popped"]
    # closed at the last NVTX timestamp in the file: the end of 'outer' (1000)
    assert list(row["end"]) == [1000] and list(row["start"]) == [800]
    assert any("no end" in r for r in tr.meta["repairs"])


def test_tiny_export_gzip(tiny, tmp_path):
    gz = tmp_path / "tiny.sqlite.gz"
    gz.write_bytes(gzip.compress(tiny.read_bytes()))
    assert len(load(gz).kernels) == 4


# --------------------------------------------------------------------------------------
# bad input: one line, the path, never an sqlite3 error
# --------------------------------------------------------------------------------------
def _one_line_error(exc_type, path: Path, match: str) -> None:
    with pytest.raises(exc_type, match=match) as e:
        load_nsys_sqlite(path)
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg
    assert not isinstance(e.value, sqlite3.Error)


def test_truncated_sqlite(tiny, tmp_path):
    big = make_tiny_export(tmp_path / "big.sqlite")
    con = sqlite3.connect(big)
    con.execute("CREATE TABLE filler (x TEXT)")
    con.executemany("INSERT INTO filler VALUES (?)", [("y" * 200,)] * 2000)
    con.commit()
    con.close()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(big.read_bytes()[:4096])
    _one_line_error(TraceFormatError, cut, "truncated")


def test_random_bytes_with_sqlite_header(tmp_path):
    p = tmp_path / "junk.sqlite"
    p.write_bytes(b"SQLite format 3\x00" + os.urandom(20000))
    _one_line_error(TraceFormatError, p, "SQLite")


def test_malformed_pages(tiny, tmp_path):
    data = bytearray(tiny.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    assert len(data) >= 3 * page
    data[page:] = b"\xa5" * (len(data) - page)  # every page after the first is garbage
    p = tmp_path / "malformed.sqlite"
    p.write_bytes(bytes(data))
    _one_line_error(TraceFormatError, p, "corrupt|malformed|SQLite")


def test_unrelated_sqlite(tmp_path):
    p = tmp_path / "other.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    con.execute("INSERT INTO customers VALUES (1, 'a')")
    con.commit()
    con.close()
    _one_line_error(TraceFormatError, p, "not an Nsight Systems export")


def test_corrupt_gzip(tiny, tmp_path):
    good = gzip.compress(tiny.read_bytes())
    p = tmp_path / "bad.sqlite.gz"
    p.write_bytes(good[: len(good) // 2])  # cut in the middle of the stream
    _one_line_error(TraceFormatError, p, "corrupt gzip")
    q = tmp_path / "bad2.sqlite.gz"
    q.write_bytes(good[:200] + bytes(b ^ 0xFF for b in good[200:400]) + good[400:])
    with pytest.raises(TraceFormatError):
        load(q)


def test_missing_path(tmp_path):
    with pytest.raises(BadInputError, match="no such file"):
        load_nsys_sqlite(tmp_path / "nope.sqlite")


# --------------------------------------------------------------------------------------
# .nsys-rep: nsys discovery, export invocation, cache
# --------------------------------------------------------------------------------------
@pytest.fixture
def no_nsys(monkeypatch, tmp_path):
    empty = tmp_path / "emptybin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("RECSYS_DOCTOR_NSYS", raising=False)
    monkeypatch.setattr(nsysrep, "NSYS_GLOBS", ())
    monkeypatch.setenv("RECSYS_DOCTOR_CACHE", str(tmp_path / "cache"))


def _report(tmp_path: Path, content: bytes = b"fake nsys report v1") -> Path:
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(content)
    return rep


def test_no_nsys(no_nsys, tmp_path):
    rep = _report(tmp_path)
    for fn in (load_nsys_rep, load):
        with pytest.raises(NsysNotFoundError) as e:
            fn(rep)
        msg = str(e.value)
        assert "nsys export --type sqlite -o trace.sqlite trace.nsys-rep" in msg and "RECSYS_DOCTOR_NSYS" in msg
        assert "\n" not in msg


def test_bad_recsys_doctor_nsys(no_nsys, tmp_path, monkeypatch):
    monkeypatch.setenv("RECSYS_DOCTOR_NSYS", str(tmp_path / "no" / "nsys"))
    with pytest.raises(NsysNotFoundError, match="RECSYS_DOCTOR_NSYS"):
        load_nsys_rep(_report(tmp_path))


def _fake_nsys(bindir: Path, body: str) -> Path:
    """A stand-in ``nsys``: logs its argv, then runs ``body`` (Python)."""
    bindir.mkdir(exist_ok=True)
    exe = bindir / "nsys"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import os, shutil, sys\n"
        "with open(os.environ['FAKE_NSYS_LOG'], 'a') as f:\n"
        "    f.write(' '.join(sys.argv[1:]) + '\\n')\n"
        "out = sys.argv[sys.argv.index('-o') + 1]\n" + body
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


COPY_BODY = "shutil.copyfile(os.environ['FAKE_NSYS_SOURCE'], out)\n"


def _export_roundtrip(no_nsys, tmp_path, monkeypatch, source: Path, how: str) -> None:
    log = tmp_path / "nsys.log"
    exe = _fake_nsys(tmp_path / "bin", COPY_BODY)
    monkeypatch.setenv("FAKE_NSYS_LOG", str(log))
    monkeypatch.setenv("FAKE_NSYS_SOURCE", str(source))
    if how == "env":
        monkeypatch.setenv("RECSYS_DOCTOR_NSYS", str(exe))
    else:
        monkeypatch.setenv("PATH", str(exe.parent))
    rep = _report(tmp_path)
    want = {t: _count(source, K + t) for t in ("KERNEL", "MEMCPY")}

    tr = load(rep)  # through the dispatcher: .nsys-rep -> nsysrep
    assert tr.path == str(rep) and tr.meta["export_reused"] is False
    assert len(tr.kernels) == want["KERNEL"] and len(tr.memcpys) == want["MEMCPY"]
    calls = log.read_text().splitlines()
    assert len(calls) == 1
    args = calls[0].split()
    assert args[:5] == ["export", "--type", "sqlite", "--force-overwrite", "true"]
    assert args[-1] == str(rep.resolve())
    exported = Path(tr.meta["export_sqlite"])
    assert exported.parent == tmp_path / "cache" / "exports" and exported.is_file()
    assert not list(exported.parent.glob("*partial*"))

    tr2 = load_nsys_rep(rep)  # unchanged report: cached export, nsys not run again
    assert tr2.meta["export_reused"] is True and len(log.read_text().splitlines()) == 1
    assert len(tr2.kernels) == want["KERNEL"]

    st = rep.stat()  # same content, new mtime: hashed again, same export reused
    os.utime(rep, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert load_nsys_rep(rep).meta["export_reused"] is True and len(log.read_text().splitlines()) == 1

    st = rep.stat()  # new content (same size), new mtime: exported again
    rep.write_bytes(b"fake nsys report v2")
    os.utime(rep, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    tr3 = load_nsys_rep(rep)
    assert tr3.meta["export_reused"] is False and len(log.read_text().splitlines()) == 2
    assert tr3.meta["export_sqlite"] != tr.meta["export_sqlite"]


@pytest.mark.parametrize("how", ["path", "env"])
def test_export_with_fake_nsys(no_nsys, tmp_path, monkeypatch, tiny, how):
    _export_roundtrip(no_nsys, tmp_path, monkeypatch, tiny, how)


@pytest.mark.shared
def test_export_with_fake_nsys_real_sqlite(shared_traces, no_nsys, tmp_path, monkeypatch):
    src = _shared(shared_traces, "nsys", "GindaChen__nsys-ai__mock.sqlite")
    _export_roundtrip(no_nsys, tmp_path, monkeypatch, src, "path")


def test_export_failure_reports_last_stderr_line(no_nsys, tmp_path, monkeypatch):
    exe = _fake_nsys(tmp_path / "bin", "sys.stderr.write('Processing...\\nERROR: the report is damaged\\n\\n')\nsys.exit(3)\n")
    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("PATH", str(exe.parent))
    rep = _report(tmp_path)
    with pytest.raises(TraceFormatError) as e:
        load_nsys_rep(rep)
    msg = str(e.value)
    assert "ERROR: the report is damaged" in msg and "exit 3" in msg and str(rep.resolve()) in msg
    assert "\n" not in msg
    assert not list((tmp_path / "cache" / "exports").glob("*.sqlite"))


def test_export_without_output_file(no_nsys, tmp_path, monkeypatch):
    exe = _fake_nsys(tmp_path / "bin", "print('nothing to export')\n")
    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("PATH", str(exe.parent))
    with pytest.raises(TraceFormatError, match="wrote no SQLite file"):
        load_nsys_rep(_report(tmp_path))


def test_install_folder_glob_newest_first(no_nsys, tmp_path, monkeypatch):
    for v in ("2023.4.1", "2025.3.2", "2024.1.1"):
        d = tmp_path / "opt" / v / "bin"
        d.mkdir(parents=True)
        (d / "nsys").write_text("#!/bin/sh\n")
        (d / "nsys").chmod(0o755)
    monkeypatch.setattr(nsysrep, "NSYS_GLOBS", (str(tmp_path / "opt" / "*" / "bin" / "nsys"),))
    assert nsysrep.find_nsys() == tmp_path / "opt" / "2025.3.2" / "bin" / "nsys"
