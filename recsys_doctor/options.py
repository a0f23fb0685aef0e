"""Every threshold the analyzers use, in one place, with where its default comes from.

One configuration mechanism: an :class:`Options` instance passed to every analyzer.
The CLI overrides fields with dedicated flags (``--short-kernel-us``) or generically with
``--set NAME=VALUE`` (see :func:`Options.with_overrides`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import BadInputError

__all__ = ["Options", "parse_set_pairs", "options_markdown"]


@dataclass(frozen=True)
class Options:
    #: A kernel shorter than this is "short". 10 us is about where a kernel stops hiding
    #: the ~2-12 us CPU cost of an eager PyTorch launch (measured on the H100: median
    #: wide&deep kernel 2.6 us, cudaLaunchKernel ~12 us with 4 threads contending);
    #: it is also the threshold in the issue's JSON contract.
    short_kernel_us: float = 10.0

    #: Number of bins of the utilization timeline (report resolution, not accuracy).
    timeline_bins: int = 100

    #: Leading share of a device's window that is treated as start-up (warm-up, graph
    #: capture, cudnn autotune) when reporting steady-state utilization. The steady state
    #: starts at the later of this cut and the first timeline bin that reaches half of the
    #: median bin utilization.
    startup_fraction: float = 0.1

    #: A GPU idle gap shorter than this between two kernels on a stream counts as a
    #: "short kernel-to-kernel gap" (launch latency territory: the ~2-5 us the driver and
    #: GPU front end need between back-to-back launches).
    short_gap_us: float = 5.0

    #: A host-wait gap whose launching thread made no CUDA call for at least this long before
    #: the launch is host work outside CUDA calls (the program's Python, preprocessing, parsing,
    #: another thread holding the GIL), which CUDA graphs do not remove: ``launch-bound`` reports
    #: its share (50 us: several eager launches' worth of CPU time, ~2-12 us each).
    host_work_us: float = 50.0

    #: Former severity cut-offs on shares (idle share, short share). No longer decide
    #: severity - that follows recoverable time (``recoverable_high`` below) - and kept
    #: only so existing ``--set high_share=...`` lines are still accepted.
    high_share: float = 0.5
    #: The medium cut-off of the severity scale above (a fifth of the time is worth fixing
    #: but is not the main problem).
    medium_share: float = 0.2

    #: A stream fed by at least this many CPU threads is "contended".
    contention_min_threads: int = 2

    #: Copies at or below this many bytes are "small" (latency-bound: a copy this size
    #: costs the same ~2-10 us whether it carries 4 bytes or 64 KiB).
    small_copy_bytes: int = 64 * 1024

    #: Graph candidates: a kernel sequence of at least this many kernels ...
    graph_min_kernels: int = 8
    #: ... that repeats at least this many times, launched eagerly.
    graph_min_repeats: int = 3

    #: How many worst offenders (kernel names, regions) to list per finding.
    top_n: int = 5

    #: Noise floor: a finding whose measured share (of kernels, idle time, copies, CPU time)
    #: is below this is not reported (its numbers stay in the analyzer's ``data``). 5% is
    #: the usual "not worth a code change" cut of profiler expert rules.
    report_min_share: float = 0.05

    #: Stream contention is judged on behaviour, not on the mere thread count: a stream fed
    #: by several threads is reported only if, at least this share of its launch-call time,
    #: another thread was inside a launch call to the same stream ...
    contention_min_overlap: float = 0.05
    #: ... or if at least this share of consecutive launches to it switch thread
    #: (interleaving). A warm-up thread followed by one steady-state thread has ~0 of both,
    #: which is why the per-thread-stream graph trace is not flagged.
    contention_min_switch_rate: float = 0.05

    #: "Many small copies per unit of work": at least this many small H2D/D2H copies per
    #: NVTX range instance / step (one staging copy per input tensor of a wide&deep query
    #: gives ~27 on the H100 probe; a batched pinned staging buffer gives 1-2).
    many_copies_per_unit: float = 8.0

    #: Upper bound on the number of stream groups the planner proposes: each group costs a
    #: stream pair and an allocator pool; 4 matched the 4 concurrent clients of the H100
    #: wide&deep probe and the 4 side streams of the MMoE probe.
    max_stream_groups: int = 4

    #: Severity follows what a fix can win: a finding whose estimated recoverable GPU time
    #: is at least this share of the steady-state window is ``high`` (a quarter of the
    #: time back is the main problem of the run; see docs/findings.md) ...
    recoverable_high: float = 0.25
    #: ... at least this share ``medium`` (a tenth of the window: worth a change) ...
    recoverable_medium: float = 0.10
    #: ... at least this share ``low``; below it the finding is a ``note`` (2% is within
    #: run-to-run noise of a serving benchmark).
    recoverable_low: float = 0.02

    #: A synchronizing call is reported by count too: at least this many sync calls
    #: (``*Synchronize``, blocking copies, D2H copies into pageable memory) in the window
    #: make a finding even when each blocks little (one per query of a 100-query run).
    sync_report_min_calls: int = 100

    #: How many example moments (start, duration, thread, stream) a finding lists.
    examples_per_finding: int = 3

    #: Communication kernels (a regular expression searched in the kernel name): NCCL/RCCL
    #: collectives and point-to-point (``ncclDevKernel_*``, ``ncclKernel_*``: SendRecv,
    #: AllReduce, AllGather, ReduceScatter, AllToAll), NVSHMEM, custom all-reduce kernels, and the
    #: expert-parallel dispatch/combine kernels of MoE training (DeepEP and the like).
    #: They use few blocks by design (8-12 per channel on the DLRM and TorchRec ranks) and
    #: run beside compute on other streams, so small-grid does not judge them.
    comm_kernel_pattern: str = (
        r"(?i)nccl|rccl|msccl|nvshmem|SendRecv|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|alltoall"
        r"|cross_device_reduce|deep_?ep::|(?:^|[\s:_])(?:moe_?)?(?:dispatch|combine)(?:_?kernel)?\s*[<(]")

    #: Allocator calls (a regular expression matched against the CUDA API name): the
    #: synchronous device and pinned-host allocations and frees of the runtime and the
    #: driver (``cudaMalloc``, ``cudaFree``, ``cudaMallocHost``, ``cudaFreeHost``,
    #: ``cudaHostAlloc``, ``cuMemAlloc*``, ``cuMemFree*``; Kineto records the same names).
    #: ``cudaFree`` synchronizes the device; the stream-ordered ``*Async`` forms do not
    #: and are left out.
    allocator_api_pattern: str = (
        r"^(?:cuda|hip)(?:Malloc|Free)(?:Host|Managed|Pitch|Array|3D|3DArray|MipmappedArray)?$"
        r"|^(?:cuda|hip)HostAlloc$|^cuMem(?:Alloc|Free)(?:Host|Managed|Pitch)?(?:_v\d+)?$|^cuMemHostAlloc$")
    #: An idle gap is an allocator gap (not launch-bound) when allocator calls of the
    #: process cover at least this share of it: the GPU waited for cudaMalloc/cudaFree, not
    #: for a launch (on TorchRec rank 54105 three such gaps are 99.6-99.9% covered).
    allocator_gap_share: float = 0.5
    #: A step (``ProfilerStep#N``, or a repeating top-level NVTX range) at least this many
    #: times the median step is reported by ``step-variance`` (1.5x: well outside the few
    #: percent a steady training or serving loop varies by).
    step_variance_ratio: float = 1.5
    #: Where a trace has no ``ProfilerStep#N``, the top-level NVTX ranges that can be steps
    #: (a regular expression searched in the name): names of iterations, batches, queries
    #: or requests. Operator ranges (``aten::mul, op_id = ...`` from ``emit_nvtx``, names with
    #: ``::``), MPI calls and call-site markers repeat too but are no steps.
    step_range_pattern: str = r"(?i)^(?!.*::).*(?:step|iter|batch|query|request|epoch)"
    #: Code regions that are warm-up (a regular expression searched in the innermost
    #: NVTX / annotation range name): allocations there fill the caching allocator once,
    #: they are start-up, not allocator churn (HTA's alexnet benchmark allocates 1.9 s in
    #: its ``...|warmup|forward`` range).
    warmup_range_pattern: str = r"(?i)warm[-_ ]?up"
    #: Streams that never overlap: a process's streams on one device whose kernels run
    #: concurrently for less than this share of their kernel time make a note (1%: the
    #: MMoE probe's 4 side streams overlap 0.000 ms; a working stream group overlaps tens
    #: of percent).
    stream_overlap_note_share: float = 0.01
    #: Kernel-mix notes: memory-bound copy/cat kernels, or FP32 GEMMs on CUDA cores, taking
    #: at least this share of kernel time make a note (a tenth of the GPU's time is where
    #: a cast to bf16 or removing a copy starts to show in the step time).
    kernel_mix_note_share: float = 0.10

    def __post_init__(self) -> None:
        """Reject values no analysis can use (one clear line, exit 2 at the CLI)."""
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if v != v or v < 0:
                raise BadInputError(f"option {f.name} must be >= 0, got {v!r}")
            if f.name.endswith(("_share", "_fraction", "_overlap", "_rate")) or f.name.startswith("recoverable_"):
                if v > 1:
                    raise BadInputError(f"option {f.name} is a share and must be between 0 and 1, got {v!r}")
        for name in ("timeline_bins", "graph_min_kernels", "graph_min_repeats", "top_n", "contention_min_threads",
                     "max_stream_groups"):
            if getattr(self, name) < 1:
                raise BadInputError(f"option {name} must be >= 1, got {getattr(self, name)!r}")
        if self.short_kernel_us <= 0:
            raise BadInputError(f"option short_kernel_us must be > 0, got {self.short_kernel_us!r}")
        for name in ("comm_kernel_pattern", "allocator_api_pattern", "step_range_pattern", "warmup_range_pattern"):
            try:
                re.compile(getattr(self, name))
            except re.error as e:
                raise BadInputError(f"option {name} is not a regular expression: {e}") from None
        if not (self.recoverable_low <= self.recoverable_medium <= self.recoverable_high):
            raise BadInputError("options recoverable_low <= recoverable_medium <= recoverable_high must hold")

    def with_overrides(self, pairs: dict[str, Any] | None = None, **kw: Any) -> "Options":
        """Return a copy with fields replaced; values given as strings are converted to
        the field's type. Unknown names raise :class:`BadInputError`."""
        merged = dict(pairs or {}) | {k: v for k, v in kw.items() if v is not None}
        known = {f.name: f for f in fields(self)}
        conv: dict[str, Any] = {}
        for k, v in merged.items():
            key = k.replace("-", "_")
            if key not in known:
                raise BadInputError(f"unknown option {k!r}; known: {', '.join(sorted(known))}")
            typ = type(getattr(self, key))
            try:
                conv[key] = typ(v)
            except (TypeError, ValueError):
                raise BadInputError(f"option {k}: expected a {typ.__name__}, got {v!r}") from None
        return replace(self, **conv)

    @classmethod
    def documented(cls) -> list[tuple[str, Any, str]]:
        """``(name, default, doc)`` for every field; ``doc`` is the ``#:`` comment above the
        field in this file, so the code and the documentation cannot drift apart."""
        import inspect

        docs: dict[str, str] = {}
        pending: list[str] = []
        for line in inspect.getsource(cls).splitlines():
            text = line.strip()
            if text.startswith("#:"):
                pending.append(text[2:].strip())
            elif ":" in text and not text.startswith(("def ", "@", "#", '"')) and pending:
                docs[text.split(":", 1)[0].strip()] = " ".join(pending)
                pending = []
            elif not text.startswith("#:"):
                pending = [] if text else pending
        return [(f.name, f.default, docs.get(f.name, "")) for f in fields(cls)]


def parse_set_pairs(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``("short_gap_us=3", ...)`` from repeated ``--set NAME=VALUE`` -> ``{name: value}``,
    for :meth:`Options.with_overrides`."""
    out = {}
    for p in pairs:
        if "=" not in p:
            raise BadInputError(f"--set expects NAME=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def options_markdown() -> str:
    """The text of ``docs/options.md`` (a test keeps the file equal to this)."""
    out = [
        "# Analyzer thresholds",
        "",
        "Every threshold the analyzers use lives in `recsys_doctor.options.Options`. Override any of",
        "them with `recsys-doctor advise TRACE --set NAME=VALUE` (repeatable); `--short-kernel-us N`",
        "is a shortcut for `--set short_kernel_us=N`. This file is generated from the comments in",
        "`recsys_doctor/options.py` (`python -c 'from recsys_doctor.options import options_markdown;",
        "print(options_markdown(), end=\"\")' > docs/options.md`).",
        "",
        "| name | default | what it means and where the default comes from |",
        "|---|---|---|",
    ]
    for name, default, doc in Options.documented():
        cell = doc.replace("|", "\\|")
        value = str(default).replace("|", "\\|")  # (the patterns' alternations are no cell borders)
        out.append(f"| `{name}` | `{value}` | {cell} |")
    return "\n".join(out) + "\n"
