"""No GPU activity: the trace has no kernels (and no graph executions) at all.

Every other analyzer then has nothing to say, so this one explains why, from what the
trace does contain: CUDA API calls without activity mean CUDA activity tracing was off
(``nsys profile -t cuda`` / ``torch.profiler`` without ``ProfilerActivity.CUDA``) or the
window missed the GPU work; no API calls at all mean the process never used CUDA. API calls from
several processes and no activity is also what nsys leaves of worker processes ended by a
signal: it keeps a process's activity only when the process exits (a ``multiprocessing`` pool's
``terminate()``: 0 kernels of 94,558 on the H200, ``bench/apply/results/session22_h200/``).
"""

from __future__ import annotations

from ..findings import AnalysisResult, Finding
from ..model import Trace
from ..options import Options
from ._util import str_contains

__all__ = ["analyze", "reason"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "no-gpu-activity": {
        "api_calls": "number", "graph_executions": "number", "kernels": "number", "launch_calls": "number",
        "memcpys": "number", "memsets": "number", "processes": "number",
    },
}


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="no-gpu-activity")
    n_k, n_g = len(trace.kernels), len(trace.graphs)
    res.data = {"kernels": n_k, "graph_executions": n_g, "api_calls": int(len(trace.api)),
                "launch_calls": _launch_calls(trace), "memcpys": int(len(trace.memcpys)),
                "memsets": int(len(trace.memsets)), "processes": _processes(trace)}
    if n_k or n_g:
        return res
    res.findings.append(Finding(
        id="no-gpu-activity", severity="note", title="No GPU kernels in this trace",
        evidence=res.data | {"why": reason(trace)},
        recommendation=("Re-capture with CUDA tracing on (nsys profile -t cuda,nvtx or torch.profiler with "
                        "ProfilerActivity.CUDA) over a window where the model runs."),
        where=[], action="re-capture with CUDA activity tracing on, over a window where the model runs"))
    return res


def _launch_calls(trace: Trace) -> int:
    return int(str_contains(trace.api["name"], r"Launch").sum()) if len(trace.api) else 0


def _processes(trace: Trace) -> int:
    return int(trace.api["pid"].nunique()) if len(trace.api) and "pid" in trace.api else 0


def reason(trace: Trace) -> str:
    """Why a trace without kernels may have none, from what it does contain (also what
    ``whatif``/``profile --apply`` say when they have nothing to estimate from)."""
    if len(trace.api):
        n_procs = _processes(trace)
        why = (f"{len(trace.api)} CUDA API calls ({_launch_calls(trace)} launch calls) but no kernel activity "
               "recorded: was CUDA activity tracing on (nsys -t cuda, torch.profiler activities=[CUDA]), "
               "or did the capture window miss the GPU work?")
        if n_procs > 1:
            why += (f" The calls come from {n_procs} processes: nsys keeps a process's GPU activity only when "
                    "the process exits, so worker processes ended by a signal (a multiprocessing pool's "
                    "terminate(), SIGTERM or SIGKILL) leave none (recsys-doctor profile lets Python workers ended "
                    "by SIGTERM exit first; otherwise close and join the pool)")
        return why
    if len(trace.memcpys) or len(trace.memsets):
        return "copies/memsets were recorded but no kernels: this trace cannot show compute utilization"
    return ("no CUDA API calls and no GPU activity: the traced process did not use the GPU "
            "(or CUDA tracing was off)")
