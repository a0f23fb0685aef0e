"""The labeled set: what each real trace must and must not be diagnosed with.

Every label is written from how the workload was built (its README / the script that
made it), never from recsys-doctor's output. ``must``: finding id -> the lowest severity
acceptable; ``must_not``: finding id -> the highest severity acceptable (``None``: the
finding must be absent). ``top_not``: ids the verdict's main problem must not be;
``action_not``: words the first action must not contain.

Paths starting with ``shared:`` are under ``../shared/traces`` (skipped where absent);
the others ship with the project (``tests/data``, the package's demo trace).
"""

from __future__ import annotations

SEVERITY_RANK = {"note": 0, "low": 1, "medium": 2, "high": 3}

_EAGER_SMALL_KERNELS = {"launch-bound": "medium", "short-kernels": "note"}
#: Every idle gap is counted once (issue 23, docs/findings.md "Shared causes"): the idle
#: before a short kernel of a repeated eager sequence is a launch wait, so ``short-kernels``
#: and ``graph-candidate`` are present but leave that time to ``launch-bound`` - or to the
#: root cause that takes it first (threads contending for one stream, syncs, copies).
_LAUNCH_FAMILY_SHARED = {"launch-bound": "note", "short-kernels": "note", "graph-candidate": "note"}

LABELS: dict[str, dict] = {
    # --- injected pathologies made on the H100 (bench/pathologies/pathologies.py) ---------------------
    "tests/data/patho_large_kernels/large_kernels.sqlite.gz": {
        "why": "300 back-to-back 8192^3 bf16 matmuls, one sync at the end: a well-utilized job",
        "must": {},
        "must_not": {"launch-bound": "note", "short-kernels": None, "graph-candidate": "note",
                     "stream-contention": None, "memcpy-ping-pong": None, "small-grid": None,
                     "no-gpu-activity": None, "sync-api": "note"},
        "no_high": True,
    },
    "tests/data/patho_sync_per_query/sync_per_query.sqlite.gz": {
        "why": "one thread, torch.cuda.synchronize() after each of 400 eager MLP queries",
        "must": {"sync-api": "low", **_EAGER_SMALL_KERNELS},
        "must_not": {"stream-contention": None, "no-gpu-activity": None},
    },
    "tests/data/patho_pingpong/pingpong.sqlite.gz": {
        "why": "one thread, 400 x (pageable H2D, 3 tiny kernels, blocking pageable D2H)",
        "must": {"memcpy-ping-pong": "medium", "sync-api": "low"},
        "must_not": {"stream-contention": None, "no-gpu-activity": None},
    },
    "tests/data/patho_threads8_one_stream/threads8_one_stream.sqlite.gz": {
        "why": "8 client threads launching eager queries into ONE shared stream, no NVTX",
        "must": {"stream-contention": "high", **_LAUNCH_FAMILY_SHARED},
        "must_not": {"no-gpu-activity": None},
    },
    "tests/data/patho_graphs_in_use/graphs_in_use.sqlite.gz": {
        "why": "2 threads, each replaying its own captured CUDA graph on its own stream",
        "must": {},
        "must_not": {"graph-candidate": "note", "stream-contention": None, "short-kernels": "note",
                     "no-gpu-activity": None},
        "top_not": {"graph-candidate", "short-kernels"},
        "action_not": ("capture",),
    },
    # --- the project's own fixtures (examples/wdl_serving.py on the H200) -----------------
    "tests/data/wdl_graphs_q4/wdl_graphs_q4.sqlite.gz": {
        "why": "4 threads, one stream and one captured CUDA graph each (--mode graphs --streams per-thread)",
        "must": {},
        "must_not": {"graph-candidate": "note", "stream-contention": None, "short-kernels": "note",
                     "no-gpu-activity": None},
        "top_not": {"graph-candidate", "short-kernels"},
        "action_not": ("capture",),
    },
    "tests/data/wdl_eager_q2_kineto/wdl_eager_q2.pt.trace.json.gz": {
        "why": "2 eager wide&deep client threads on one shared stream (torch.profiler)",
        "must": {"stream-contention": "low", **_EAGER_SMALL_KERNELS, "graph-candidate": "note"},
        "must_not": {"no-gpu-activity": None},
    },
    "tests/data/procs2_pool/procs2_pool.sqlite.gz": {
        "why": "2 spawn Pool worker processes on one GPU, each scoring on its main thread in its own CUDA context",
        "must": {"processes-share-gpu": "note", "launch-bound": "note"},
        # (each process launches into its own stream 7: not one stream shared by threads)
        "must_not": {"stream-contention": None, "no-gpu-activity": None, "streams-never-overlap": None},
    },
    "tests/data/cuda_python_q4/cuda_python_q4.sqlite.gz": {
        "why": ("no framework: NVRTC kernels launched through cuda-python by 4 client threads on ONE shared "
                "stream, 24 tiny kernels a query, pageable copies, a cuStreamSynchronize a query"),
        "must": {"stream-contention": "low", "launch-bound": "low", "sync-api": "note", "memcpy-ping-pong": "note",
                 "graph-candidate": "note", "short-kernels": "note"},
        "must_not": {"no-gpu-activity": None, "processes-share-gpu": None, "optimizer-unfused": None,
                     "input-stall": None, "streams-never-overlap": None},
    },
    "recsys_doctor/data/demo_wdl_serial_q4.sqlite.gz": {
        "why": "4 eager wide&deep client threads on ONE shared stream (--mode eager --streams shared)",
        # (no OS runtime trace in this export: the lock waits are not seen, only slower launches)
        "must": {"stream-contention": "low", **_LAUNCH_FAMILY_SHARED, "launch-bound": "high"},
        "must_not": {"no-gpu-activity": None},
    },
    # --- shared H100 traces (../shared/traces/h100/README.md) ----------------------------
    "shared:h100/wdl_serial_q4_h100.sqlite": {
        "why": "4 eager wide&deep client threads launching into ONE shared stream",
        "must": {"stream-contention": "high", **_LAUNCH_FAMILY_SHARED},
        "must_not": {"no-gpu-activity": None},
    },
    "shared:h100/wdl_graphs_q4_h100.sqlite": {
        "why": "4 threads, each with its own stream and captured CUDA graph",
        "must": {},
        "must_not": {"graph-candidate": "note", "stream-contention": None, "short-kernels": "note",
                     "no-gpu-activity": None},
        "top_not": {"graph-candidate", "short-kernels"},
        "action_not": ("capture",),
    },
    "shared:h100/torch_matmul_2threads_h100.sqlite": {
        "why": "2 threads x 100 (256x256 matmul, relu, sum, .cpu()): a pageable D2H and a sync every step",
        # (the sync of each .cpu() is the copy's own: its idle is memcpy-ping-pong's, once)
        "must": {"sync-api": "note", "memcpy-ping-pong": "low", "stream-contention": "low"},
        "must_not": {"no-gpu-activity": None},
    },
    "shared:h100/mmoe_4streams_h100.pt.trace.json.gz": {
        "why": "eager MMoE training steps (3 steps), the experts spread over 4 side streams by one thread",
        "must": {"launch-bound": "medium", "short-kernels": "note"},
        "must_not": {"stream-contention": None, "no-gpu-activity": None},
    },
}
