"""The plan's settings the hook reads: ``groups``, ``cuda_graphs``, ``batching`` and ``max_batch``, through the package's one
plan parser (:class:`recsys_doctor.plan.Plan`), loaded by file path where there is no package."""

from __future__ import annotations

import os
import sys
from typing import Any


def _plan_type() -> Any:
    """:class:`recsys_doctor.plan.Plan`, the one plan parser. Inside the package it is
    imported; loaded by file path at interpreter start (the generated ``sitecustomize``),
    ``recsys_doctor/plan.py`` is loaded the same way, without importing the package."""
    if (__package__ or "").startswith("recsys_doctor."):
        from ...plan import Plan

        return Plan
    mod = sys.modules.get("_recsys_doctor_plan")
    if mod is None:
        import importlib.util

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # recsys_doctor/
        spec = importlib.util.spec_from_file_location("_recsys_doctor_plan", os.path.join(root, "plan.py"))
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_recsys_doctor_plan"] = mod  # dataclasses look the module up while it runs
        spec.loader.exec_module(mod)
    return mod.Plan


#: the plan's runtime fields the hook honours; the others are reported by :func:`unhonoured`
HONOURED = ("groups", "cuda_graphs", "batching", "max_batch")


def unhonoured(plan: dict[str, Any]) -> list[str]:
    """One line per plan setting a plain script cannot get from this hook: its copies are
    its own (no merged/split copy streams, no staging pools, no slots), so only the group
    count, CUDA graphs and batching (no queue delay) apply (the rules:
    :meth:`recsys_doctor.plan.Plan.unhonoured`)."""
    return _plan_type().from_dict(plan).unhonoured("script")


def read_runtime(plan: dict[str, Any]) -> dict[str, Any]:
    """:data:`HONOURED` of a plan dict (through ``Plan.from_dict``: the ``runtime`` object, or
    planner schema 1 ``stream_groups.count`` / ``cuda_graphs.enabled``). Batching is off unless
    the plan turns it on, and it needs CUDA graphs (a batch is one replay of a graph per batch
    size): without them it is off, and said so (:func:`unhonoured`)."""
    p = _plan_type().from_dict(plan)
    return {"groups": p.groups, "cuda_graphs": p.cuda_graphs, "batching": p.batching and p.cuda_graphs,
            "max_batch": p.max_batch}
