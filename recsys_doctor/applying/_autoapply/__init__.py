"""Apply a stream-group plan to a plain script, with no change to the script.

Activated at interpreter start by a generated ``sitecustomize.py`` (see
:func:`recsys_doctor.applying.script_hook.script_env`) when ``RECSYS_DOCTOR_PLAN`` names a plan JSON file;
this module is loaded by file path, so at interpreter start it imports nothing of
``recsys_doctor`` but ``plan.py`` (below), and it never imports torch itself. What it does:

* **a stream per client thread**: every ``threading.Thread`` the script starts is placed in a
  group at its first top-level model call once CUDA is up (where the plan has graphs; at its
  start otherwise, or with ``RECSYS_DOCTOR_PLACE=start``, if CUDA is up by then) and from then
  on runs on the group's stream; the ``i``-th thread placed gets group ``i mod groups``. A thread that
  calls no model stays on PyTorch's default stream (:func:`.interception._place_deferred`);
  the copies a thread makes before it is placed are PyTorch's, counted (:mod:`.unplaced`). The script's own copies, kernels and
  ``.cpu()`` waits then go to, and wait for, that group's stream only, instead of one
  stream shared (and synchronized) by every thread. The groups are the runtime's: the first
  such thread makes one :class:`recsys_doctor.runtime.StreamManager` with the plan's group
  count (merged, ``streams_only``: the script's copies and memory stay PyTorch's; ``blocking``:
  work a thread puts on the default stream stays ordered with the groups' work), and a
  group's stream is a ``torch.cuda.ExternalStream`` over its group's stream handle, as
  :func:`recsys_doctor.runtime.serve` bridges them; the capture streams are the manager's
  side streams (:mod:`.groups`). ``recsys_doctor.runtime`` is imported then, not before
  (a light import: ``cuda.core``, no pandas); where it cannot be, the hook says why on
  stderr and the script runs as it is. The streams are never closed: PyTorch's allocator
  keeps blocks used on them up to its own teardown (closing them at exit crashed
  ``plain_serving_script.py`` on exit on the H200), and the process's end frees them.
* **CUDA graphs for top-level model calls** (where the plan enables graphs): a call of an
  ``nn.Module`` made by such a thread at depth 0 (not from inside another module), with
  gradients off, the module in eval mode and every tensor argument on the GPU (host tensors
  the model copies inside its ``forward`` are copied first: :mod:`.host_args`), is keyed by
  (group, module, argument dtypes/shapes/devices and constants). Where the row count varies,
  rows are padded up to the next power of two (copies of the last row) once the first two
  padded calls of that bucket, each run eagerly as it is and padded, gave the same real rows;
  a model that mixes rows gets graphs per exact shape. A call site holds at most ``MAX_GRAPHS_PER_SITE`` graphs
  a group per argument family (sizes alone differ), at most ``MAX_FAMILIES_PER_SITE`` families,
  and all graphs at most ``GRAPH_MEMORY_BUDGET`` bytes; a call without a graph runs
  eagerly (:mod:`.buckets`). Every call is counted at the script's line that made it, taken
  over or left to PyTorch with the reason (``stats()["sites"]``). The first
  ``WARMUP_CALLS`` calls of a key run eagerly on the group stream, then the call is
  captured once (on a private capture stream, so that the group's other threads keep
  using the group stream meanwhile; the capturing thread first runs the call once there,
  so that its own cuBLAS handle exists before the capture, whichever threads made the
  warm-up calls) into a graph with static input buffers; later calls
  copy their inputs
  into the static buffers (one ``_foreach_copy_``), replay, and return a clone of the
  static output. A group's copy-in, replay and clone are enqueued under the group's lock,
  so threads sharing a group never read each other's results. Anything that cannot be
  captured (a host sync in the forward, data-dependent shapes, non-tensor outputs) runs
  eagerly from then on; the reason is printed to stderr once per key. So does a key whose
  model writes into its own arguments (found on its first call: :mod:`.argwrites`), and a
  module that changed after its capture has its graphs retired and captured again
  (:mod:`.modstate`).
* **a thread's own graph for its input copies** (graphs on; ``RECSYS_DOCTOR_THREAD_GRAPHS=0``
  turns it off): once a thread's model call is graphed and every tensor argument of it was
  copied just before from a pinned CPU tensor with ``.to("cuda", non_blocking=True)`` (or
  ``.cuda(non_blocking=True)``), the thread captures a graph of those copies and the model.
  From then on the same copies of the same tensors return at once a view whose data the
  graph's replay at the model call brings: 28 driver calls and allocations a query become
  one graph launch. Any other use of such a view first makes the deferred copies, and a
  view the script keeps from an earlier query is given its own memory before the buffer is
  written again (the section "a thread's copies in its own graph" below). Host data copied
  straight into the call, and host tensors a model copies inside its ``forward``
  (:mod:`.host_args`), go through the thread's pinned slots into the same graph.
* **batching** (where the plan says ``batching``, with graphs; off by default): concurrent
  top-level calls of one key in a group are run as one batch, one replay of a graph per batch
  size, with the runtime's batching spec checked against eager once per key (:mod:`.batching`,
  the queue :mod:`.combine`); a key whose spec is refused takes the graph path above. With
  batching on, a thread's own graph (above) is not learned: a call made with the thread's
  copies of pinned tensors is served by the runtime's batching, fed from those tensors (:mod:`.served`).

A package loaded by file path at interpreter start, before the package can be imported (its
package import pulls in pandas): the ``sitecustomize`` loads this ``__init__.py`` as the package
``_recsys_doctor_autoapply``, whose modules import one another relatively and nothing of
``recsys_doctor`` but ``plan.py`` (loaded by path too, the one place that parses plans) and,
on the first hooked thread, ``recsys_doctor.runtime``. One module a concern, lowest first:
:mod:`._common` (the state), :mod:`.groups` (thread groups on the runtime's streams, and the
capture gate), :mod:`.fallback` (failures: the reason logged and counted), :mod:`.buckets`
(shapes: row buckets, padding verified, the bounds), :mod:`.graphs` (graphs per call site),
:mod:`.combine` (the batching queue, no CUDA), :mod:`.batching` (calls of one key as one batch),
:mod:`.staging` (a thread's deferred input copies), :mod:`.thread_graphs` (a thread's own
graph), :mod:`.served` (batched calls served by the runtime), :mod:`.host_args` (a model's host arguments, copied inside its forward),
:mod:`.interception` (what is patched), :mod:`.accounting` (calls taken over and
left, per line of the script), :mod:`.modstate` (models that change while they serve),
:mod:`.argwrites` (models that write into their arguments), :mod:`.trainers` (threads that train
the served model: off their groups),
:mod:`.settings` (the plan's settings), :mod:`.report` (``stats``); here: ``activate``.

The plan file is the one ``recsys-doctor profile --apply`` writes (``runtime`` object:
``groups``, ``cuda_graphs``, ``batching``, ``max_batch``); ``RECSYS_DOCTOR_AUTOAPPLY_LOG=1`` prints a summary at exit, and
``RECSYS_DOCTOR_HOOK_STATS=FILE`` writes it to FILE as JSON (what ``profile --apply`` reads back).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
from typing import Any

from ._common import ENV_PLACE, ENV_PLAN, ENV_STAGE_PAGEABLE, ENV_THREAD_GRAPHS, WARMUP_CALLS, _first_line, _lock, _log, _state, _torch
# the private names re-exported here are the ones tests and benchmarks reach through the package
from .accounting import reset as reset_sites
from .graphs import _key  # noqa: F401
from .groups import _Gate
from . import meter, modstate, threaderrors, trainers
from .importwatch import cancel, when_imported
from .interception import _group_for_new_thread, _wrapped_bootstrap, on_torch_imported  # noqa: F401
from .report import ENV_STATS, _at_exit, claim_stats_file, stats, write_stats
from .settings import read_runtime, unhonoured
from .thread_graphs import _min_calls, _replay_window
from .deferred import _materialize, make_lazy_type as _make_lazy_type  # noqa: F401
from .staging import _copy_in, _ThreadCopies, _ThreadGraph  # noqa: F401

__all__ = ["activate", "deactivate", "read_runtime", "stats", "write_stats", "ENV_PLAN", "ENV_STATS", "ENV_THREAD_GRAPHS",
           "ENV_STAGE_PAGEABLE", "ENV_PLACE", "WARMUP_CALLS"]


#: served models of earlier activations (:func:`deactivate`), alive to the process's end
_KEPT: list[Any] = []


def activate(plan: dict[str, Any] | str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Start applying ``plan`` (a dict, a path, or ``$RECSYS_DOCTOR_PLAN``) to threads
    started from now on. Returns the runtime settings used. Idempotent."""
    if plan is None:
        plan = os.environ.get(ENV_PLAN)
        if not plan:
            raise ValueError(f"{ENV_PLAN} is not set")
    doc: dict[str, Any]
    if isinstance(plan, dict):
        doc = plan
    else:
        with open(plan, encoding="utf-8") as f:
            doc = json.load(f)
        if not isinstance(doc, dict):
            raise ValueError("the plan file must hold a JSON object")
    if doc.get("meter_only"):
        return activate_meter()
    rt = read_runtime(doc)
    for line in unhonoured(doc):
        _log(line)
    place = os.environ.get(ENV_PLACE, "first-call")
    if place not in ("first-call", "start"):
        _log(f"{ENV_PLACE}={place!r} is neither 'first-call' nor 'start': threads are placed at their first model call")
    with _lock:
        if _state["active"]:
            return {"groups": _state["n_groups"], "cuda_graphs": _state["graphs"], "batching": _state["batching"],
                    "max_batch": _state["max_batch"]}
        _state.update(active=True, n_groups=rt["groups"], graphs=rt["cuda_graphs"], groups={}, started=0,
                      batching=rt["batching"], max_batch=rt["max_batch"], batch_specs={}, batch_lock=threading.Lock(), batch_refusals_said=set(),
                      patched_module=False, captured=0, replays=0, fallbacks=[], gate=_Gate(),
                      thread_graphs=os.environ.get(ENV_THREAD_GRAPHS, "1") != "0", thread_captured=0, pageable_fast=0, mark_waits=0, outputs_lent=0,
                      thread_replays=0, materialized=0, streams=None, streams_by_dev={}, streams_failed=None, graph_bytes=0,
                      stage_pageable=os.environ.get(ENV_STAGE_PAGEABLE, "0") == "1", host_use={},
                      activation=_state.get("activation", 0) + 1, late_threads=0, patched_copies=False,
                      late_groups=[], module_changes=0, thread_errors=[], thread_error_count=0,
                      copy_only_threads=[], copy_only_count=0, training_threads=[], training_threads_count=0, ended_threads=0, short_lived_threads=0, meter_only=False,
                      min_thread_calls=_min_calls(), replay_window=_replay_window(),
                      place_at_first_call=place != "start" and rt["cuda_graphs"])
        if hasattr(threading.Thread, "_bootstrap_inner"):
            meter.reset()
            reset_sites()
            modstate.reset()
            _state["orig_bootstrap"] = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]
            threading.Thread._bootstrap_inner = _wrapped_bootstrap(_state["orig_bootstrap"])  # type: ignore[attr-defined]
            threaderrors.install()
        else:  # pragma: no cover - every CPython we support has it
            raise RuntimeError("threading.Thread has no _bootstrap_inner on this Python")
    if rt["cuda_graphs"]:  # nn.Module patched once PyTorch is imported: threads placed at their first call
        _state["torch_watch"] = when_imported("torch", on_torch_imported)  # (outside _lock: may run now)
    return rt


def activate_meter() -> dict[str, Any]:
    """The meter-only plan (``{"meter_only": true}``, :mod:`.meter`): nothing of the script
    changed, its top-level model calls counted and timed once PyTorch is imported."""
    with _lock:
        if _state["active"]:
            return {"meter_only": True}
        _state.update(active=True, meter_only=True, n_groups=0, graphs=False, batching=False, patched_module=False,
                      fallbacks=[], started=0, orig_bootstrap=threading.Thread._bootstrap_inner)  # type: ignore[attr-defined]
        meter.reset()

    def patch(torch: Any) -> None:
        with _lock:
            if _state.get("meter_only") and not _state["patched_module"]:
                _state["orig_module_call"] = torch.nn.Module.__call__
                torch.nn.Module.__call__ = meter.install(torch, torch.nn.Module.__call__, on=True)
                _state["patched_module"] = True

    _state["torch_watch"] = when_imported("torch", patch)
    return {"meter_only": True}


def deactivate() -> None:
    """Undo :func:`activate` for threads started from now on (and restore ``nn.Module``)."""
    with _lock:
        if not _state.get("active"):
            return
        threading.Thread._bootstrap_inner = _state.pop("orig_bootstrap")  # type: ignore[attr-defined]
        threaderrors.uninstall()
        cancel(_state.pop("torch_watch", None))
        if _state.get("patched_module"):
            torch = _torch()
            if torch is not None:
                torch.nn.Module.__call__ = _state["orig_module_call"]
                modstate.unpatch(torch)
                trainers.uninstall(torch)
                for name, fn in _state.pop("orig_tensor_methods", {}).items():
                    setattr(torch.Tensor, name, fn)
                for name, fn in _state.pop("orig_torch_functions", {}).items():
                    setattr(torch, name, fn)
        # the runtime's models served for the script (.served) are kept, never closed, as the
        # groups' streams are: PyTorch's allocator keeps blocks used on their streams, and
        # closing them while it does aborted the process on the H100 (served_route_h100/)
        _KEPT.extend(_state.pop("served_models", []))
        _state.pop("routes", None)
        _state["active"] = False


def _main() -> None:
    """Entry of the generated ``sitecustomize``: activate from the environment; a bad plan
    is one line on stderr and the script runs unchanged. The stats are written at exit
    either way (``$RECSYS_DOCTOR_HOOK_STATS``, :mod:`.report`): a plan not applied says why."""
    claim_stats_file()
    atexit.register(_at_exit)
    try:
        rt = activate()
    except Exception as ex:  # noqa: BLE001 - never break the user's program
        _state["not_applied"] = _first_line(ex)
        _log(f"not applied: {_state['not_applied']}")
        return
    if os.environ.get("RECSYS_DOCTOR_AUTOAPPLY_LOG") and rt.get("meter_only"):
        _log("active: meter only (the script's top-level model calls counted and timed, nothing else)")
    elif os.environ.get("RECSYS_DOCTOR_AUTOAPPLY_LOG"):
        _log(f"active: {rt['groups']} stream groups, CUDA graphs {'on' if rt['cuda_graphs'] else 'off'}, "
             f"batching {'up to ' + str(rt['max_batch']) if rt['batching'] else 'off'}")
