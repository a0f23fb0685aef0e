"""What a rank's worker keeps of its full result for ``advise DIR --html`` and the history:
its HTML section and its history row (:func:`recsys_doctor.diagnose.ranks.analyze_rank`'s
``finish``). Both are made where the trace is, so the trace never travels."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..diagnose.advise import AdviseResult

__all__ = ["rank_extras"]


def rank_extras(result: "AdviseResult", *, html: bool = False, history: bool = False,
                options: Any = None) -> dict[str, Any]:
    """``{"html": the rank's report section, "row": its history row}``, each only when
    asked; a row that cannot be built is ``{"row_error": why}`` (history is a side
    effect: the caller warns and goes on)."""
    out: dict[str, Any] = {}
    if html:
        from ..reports.html import render_section

        out["html"] = render_section(result, options=options)
    if history:
        from ..history.row import build_row

        try:
            out["row"] = build_row(result, "advise", options=options)
        except OSError as e:
            out["row_error"] = str(e)
    return out
