"""``plan.json``: writing the chosen plan and reading (and checking) any plan file.

Below both capture and apply: the profiler reads a plan to apply it to a script, the
apply stage writes the one it chose.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from .._util.json import json_default
from ..errors import BadInputError
from .search import plan_candidate
from .whatif import Candidate

__all__ = ["write_plan", "read_plan", "read_bucket_costs"]


def write_plan(path: str | os.PathLike[str], advised: dict[str, Any], chosen: Candidate, *,
               clients: int | None = None, predicted: dict[str, Any] | None = None,
               measured: dict[str, Any] | None = None, baseline: dict[str, Any] | None = None) -> Path:
    """``plan.json``: the advisor's plan (schema 1, as ``advise --json`` prints it) plus a
    ``runtime`` object with the chosen settings (which ``RuntimeConfig.from_plan`` and the
    script hook read first) and an ``apply`` object with what was predicted and measured."""
    p = Path(path)
    doc = dict(advised)
    doc["runtime"] = chosen.to_plan().to_runtime(clients)
    doc["apply"] = {"label": chosen.label, "predicted": predicted, "measured": measured, "baseline": baseline}
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(doc, indent=1, default=json_default) + "\n")
    except OSError as e:
        raise BadInputError(f"cannot write the plan to {p} ({e.strerror or e})") from None
    return p


def _json_file(p: Path, what: str) -> Any:
    """The JSON document in ``p``; :class:`BadInputError` with one line where there is none."""
    if not p.is_file():
        raise BadInputError(f"{p}: no such {what} file")
    try:
        return json.loads(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise BadInputError(f"{p}: cannot read ({e})") from None
    except json.JSONDecodeError as e:
        raise BadInputError(f"{p}: not JSON (line {e.lineno}: {e.msg})") from None


def read_plan(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a plan JSON (``plan.json`` or an ``advise --json`` output, whose
    ``plan`` object is taken). Raises :class:`BadInputError` with one line on any problem."""
    p = Path(path)
    doc = _json_file(p, "plan")
    if isinstance(doc, dict) and isinstance(doc.get("plan"), dict) and "findings" in doc:
        doc = doc["plan"]
    if not isinstance(doc, dict):
        raise BadInputError(f"{p}: a plan must be a JSON object")
    if not any(k in doc for k in ("runtime", "stream_groups", "cuda_graphs", "groups")):
        raise BadInputError(f"{p}: not a recsys-doctor plan (no runtime, stream_groups or cuda_graphs)")
    plan_candidate(doc)  # validates types
    return doc


def read_bucket_costs(path: str | os.PathLike[str]) -> dict[int, float]:
    """The measured GPU time of one batch per bucket size, in ns, from a JSON file in µs:
    either ``{"1": 221.0, "2": 267.0, ...}`` (``json.dumps(served.bucket_gpu_us())``,
    ``profile --apply``'s ``bucket_gpu_us.json``) or an object with that mapping under a
    ``"bucket_gpu_us"`` key (a row of ``bench/serving/serving_sweep.py``'s info file, or
    ``profile --apply``'s ``apply.json``). Sizes are positive integers, costs positive
    numbers, bucket 1 is among them. Raises :class:`BadInputError` with one line."""
    p = Path(path)
    doc = _json_file(p, "bucket-costs")
    if isinstance(doc, dict) and "bucket_gpu_us" in doc:
        doc = doc["bucket_gpu_us"]
    if not isinstance(doc, dict) or not doc:
        raise BadInputError(f"{p}: bucket costs must be a non-empty JSON object of bucket size -> GPU us "
                            'a batch, e.g. {"1": 221.0, "2": 267.0} (or such an object under "bucket_gpu_us")')
    out: dict[int, float] = {}
    for size, us in doc.items():
        try:
            b = int(size)
        except ValueError:
            b = 0
        if b < 1 or str(b) != str(size).strip():
            raise BadInputError(f"{p}: bucket size {size!r} is not a positive whole number")
        if isinstance(us, bool) or not isinstance(us, (int, float)) or not (us > 0 and math.isfinite(us)):
            raise BadInputError(f"{p}: the GPU time of bucket {b} must be a positive number of us, got {us!r}")
        out[b] = float(us) * 1e3
    if 1 not in out:
        raise BadInputError(f"{p}: no bucket 1 (sizes {sorted(out)}): its cost (one query alone) scales the "
                            "others to the trace's model")
    return dict(sorted(out.items()))
