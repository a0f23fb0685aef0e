"""Applying runtime settings to a workload module in-process: :func:`make_runner`.

Serving workloads run through :func:`recsys_doctor.runtime.serve`; training workloads get
branch streams and a whole-step CUDA graph. Used by the candidate measurements and the
"after" profile of ``profile --apply``, through :func:`runtime_treatment`: in this process
(torch backend) or in a child process run as

    python -m recsys_doctor.applying.train_runner WORKLOAD.py --result m.json --apply RUNTIME_JSON [...]

which is the capture child (:mod:`recsys_doctor.capture._child`, same arguments) with the
settings applied; what the runtime reports (fallbacks, notes) goes to ``RESULT.apply.json``.
A batching candidate's bucket costs (:func:`_bucket_costs`: each bucket replayed alone after
the measured window) are measured only where they are read: for a measured candidate, not
for the after-profile of the kept plan (``"bucket_costs": false`` in the ``--apply`` JSON, beside
the runtime's fields: :data:`BUCKET_COSTS_KEY`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any, Callable

from ..capture._child import main as _child_main
from ..capture.treatment import Prepared, Treatment
from ..errors import BadInputError
from ..plan import Plan

__all__ = ["make_runner", "runtime_treatment", "main", "CHILD_MODULE", "BUCKET_COSTS_KEY"]

#: run as the child process of an applied workload (``python -m``)
CHILD_MODULE = "recsys_doctor.applying.train_runner"
#: the key of the child's ``--apply`` JSON that is false for a run whose bucket costs nobody
#: reads (the after-profile); the rest of that JSON is the runtime dict
BUCKET_COSTS_KEY = "bucket_costs"


def make_runner(wl: Any, runtime: dict[str, Any], *,
                bucket_costs: bool = True) -> tuple[Callable[..., Any], Callable[[], None], dict[str, Any], Any]:
    """``(run, close, info, workload)`` applying ``runtime`` (a flat runtime dict) to a
    :class:`~recsys_doctor.capture.workload.Workload`: pass ``run`` and the returned workload
    (warm-up adjusted) to :func:`~recsys_doctor.capture.workload.measure`, call ``close()`` after.
    ``bucket_costs``: whether ``close()`` of a batching server measures its buckets' GPU times
    into ``info["bucket_gpu_us"]`` (:func:`_bucket_costs`).

    Serving: ``run`` is a :func:`recsys_doctor.runtime.serve` ``ServedModel`` built from
    ``wl.inputs(0)`` (host tensors in, host tensors out, like the default query).

    Training: the workload exposes what the runtime needs (``examples/mmoe_training.py``):
    ``wl.model.streams`` (passed to ``parallel_branches``; set to a ``BranchStreams`` of
    ``groups`` streams when ``groups > 1``) and ``wl.run.optimizer`` (made ``capturable``
    for a whole-step CUDA graph). The graphed ``run`` does the first warm-up steps eagerly
    on a side stream, captures one step, and replays it; it returns a clone of the step's
    loss. The warm-up count is reduced by the steps ``run`` itself takes before the first
    replay, so the same number of optimizer steps precedes the measurement and the
    measured losses are comparable step for step with the baseline's.
    """
    from ..runtime import RuntimeConfig

    cfg = RuntimeConfig.from_plan(runtime)
    # what this path cannot apply is said in the notes, never dropped silently
    notes = Plan.from_dict(runtime).unhonoured("serve" if wl.kind == "serve" else "train")
    info: dict[str, Any] = {"runtime": asdict(cfg), "notes": notes}
    if wl.kind == "serve":
        from ..runtime import serve

        ex = wl.inputs(0)
        ex = ex if isinstance(ex, tuple) else (ex,)
        served = serve(wl.model, ex, plan=runtime, slots_per_group=cfg.slots_per_group)
        info["fallbacks"] = dict(served.fallbacks)

        def close() -> None:
            info["stats"] = served.stats()
            if bucket_costs:
                _bucket_costs(served, info)
            served.close()

        return served, close, info, wl
    return _train_runner(wl, cfg, info)


def _bucket_costs(served: Any, info: dict[str, Any]) -> None:
    """A batching candidate's measured GPU time per bucket (``served.bucket_gpu_us()``,
    after the measurement: the buckets replayed alone) into ``info["bucket_gpu_us"]``, the
    ``{"1": us, ...}`` that ``whatif --bucket-costs`` reads; what keeps it from being
    measured is a note, never a failed candidate."""
    if not (info["stats"].get("batching") or {}).get("enabled"):
        return
    try:
        info["bucket_gpu_us"] = {str(k): float(v) for k, v in served.bucket_gpu_us().items()}
    except Exception as e:  # noqa: BLE001 - the candidate is measured already; its bucket costs are extra
        info["notes"].append(f"bucket GPU times not measured: {type(e).__name__}: {e}")


def runtime_treatment(runtime: dict[str, Any], *, bucket_costs: bool = True) -> Treatment:
    """A workload captured or measured with ``runtime`` applied (:func:`make_runner`), in
    this process or in the child this module runs as; ``bucket_costs=False`` where nothing
    reads them (the after-profile)."""
    payload = runtime if bucket_costs else {**runtime, BUCKET_COSTS_KEY: False}
    return Treatment("workload", prepare=lambda wl: make_runner(wl, runtime, bucket_costs=bucket_costs),
                     child_module=CHILD_MODULE, child_args=("--apply", json.dumps(payload)))


def _prepare_from(text: str) -> Callable[[Any], Prepared]:
    """The child's ``--apply`` JSON: the runtime dict, and :data:`BUCKET_COSTS_KEY` (default true)."""
    try:
        runtime = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInputError(f"--apply: not JSON ({e.msg})") from None
    if not isinstance(runtime, dict):
        raise BadInputError(f"--apply: a JSON object of runtime settings, got {type(runtime).__name__}")
    costs = runtime.pop(BUCKET_COSTS_KEY, True)
    if not isinstance(costs, bool):
        raise BadInputError(f"--apply: {BUCKET_COSTS_KEY!r} must be true or false, got {costs!r}")
    return lambda wl: make_runner(wl, runtime, bucket_costs=costs)


def main(argv: list[str] | None = None) -> int:
    """The child process of an applied workload (see the module docstring): the capture
    child's arguments and ``--apply``."""
    return _child_main(list(sys.argv[1:] if argv is None else argv), prog=f"python -m {CHILD_MODULE}",
                       prepare_from=_prepare_from)


def _train_runner(wl: Any, cfg: Any, info: dict[str, Any]) -> tuple[Any, Any, dict[str, Any], Any]:
    step = wl.run
    closers = _branch_streams(wl.model, cfg.groups, info)

    def close() -> None:
        for c in closers:
            c()

    if not cfg.cuda_graphs:
        return step, close, info, wl
    opt = getattr(step, "optimizer", None)
    if opt is None:
        info["notes"].append("the step exposes no 'optimizer' attribute: no whole-step CUDA graph (eager)")
        return step, close, info, wl
    for pg in opt.param_groups:
        if "capturable" in pg:
            pg["capturable"] = True
    # the first call runs eager_first eager steps + 1 replay and counts as one warm-up
    # call, so warm-up calls = 1 + (warmup - eager_first - 1) keep the same step count
    eager_first = max(1, min(3, int(wl.warmup) - 1))
    rest = max(1, int(wl.warmup) - eager_first)
    if eager_first + rest != int(wl.warmup):
        info["notes"].append(f"warm-up {wl.warmup} < {eager_first + 1}: the applied run takes "
                             f"{eager_first + rest - int(wl.warmup)} more steps before measuring")
    info["whole_step_graph"] = True
    info["eager_steps_before_capture"] = eager_first
    return _graphed_step(step, eager_first, info), close, info, wl.with_overrides(warmup=rest)


def _branch_streams(model: Any, groups: int, info: dict[str, Any]) -> list[Callable[[], None]]:
    """``model.streams`` set to a ``BranchStreams`` of ``groups`` streams (when > 1);
    returns what puts it back."""
    if groups <= 1:
        return []
    if not hasattr(model, "streams"):
        info["notes"].append("the workload's model has no 'streams' attribute: branch streams not applied")
        return []
    from ..runtime import BranchStreams

    bs = BranchStreams(groups)
    prev = model.streams
    model.streams = bs

    def undo() -> None:
        model.streams = prev
        bs.close()

    info["branch_streams"] = groups
    return [undo]


def _graphed_step(step: Callable[..., Any], eager_first: int, info: dict[str, Any]) -> Callable[..., Any]:
    """``step`` as a whole-step CUDA graph: the first call runs ``eager_first`` eager steps
    on a side stream, captures one and replays it; later calls copy new input tensors into
    the captured ones and replay. Returns a clone of the step's output. A failed capture is
    kept in ``info["fallback"]`` and the step runs eagerly from then on."""
    import torch

    st: dict[str, Any] = {}

    def tensors(args: tuple[Any, ...]) -> list[Any]:
        return [a for a in args if isinstance(a, torch.Tensor)]

    def capture(args: tuple[Any, ...]) -> Any:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(eager_first):
                step(*args)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                out = step(*args)
        except Exception as e:  # noqa: BLE001 - the reason is kept; the step runs eagerly
            info["fallback"] = f"whole-step capture failed, running eagerly: {type(e).__name__}: {e}"
            torch.cuda.synchronize()
            st["graph"] = False
            return False
        st.update(graph=g, out=out, args=args, ptrs=[a.data_ptr() for a in tensors(args)])
        return g

    def run(*args: Any) -> Any:
        g = st.get("graph")
        if g is None:
            g = capture(args)
            if g is False:
                return step(*args)
        elif g is False:
            return step(*args)
        elif [a.data_ptr() for a in tensors(args)] != st["ptrs"]:  # new inputs: copy into the captured ones
            for d, src in zip(tensors(st["args"]), tensors(args)):
                d.copy_(src)
        g.replay()
        out = st["out"]
        return out.clone() if isinstance(out, torch.Tensor) else out

    return run


if __name__ == "__main__":  # pragma: no cover - run as a subprocess
    sys.exit(main())
