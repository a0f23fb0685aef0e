"""Renderers over one :class:`~recsys_doctor.diagnose.advise.AdviseResult`: HTML, Markdown, plots.

(The terminal renderer lives in ``terminal.py``.) Every renderer escapes every string
that comes from a trace.

The HTML and Markdown renderers (jinja2, matplotlib) are imported on first use, so that
importing ``terminal`` or ``plots`` does not pay for them.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["render_html", "write_html", "render_compare_html", "write_compare_html",
           "render_markdown", "write_markdown", "md_escape"]

_HOME = {"render_html": "html", "write_html": "html", "render_compare_html": "html", "write_compare_html": "html",
         "render_markdown": "markdown", "write_markdown": "markdown", "md_escape": "markdown"}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)
