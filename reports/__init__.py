"""Renderers over one :class:`~recsys_doctor.advise.AdviseResult`: HTML, Markdown, plots.

(The terminal renderer lives in ``terminal.py``.) Every renderer escapes every string
that comes from a trace.
"""

from __future__ import annotations

from .html import render_compare_html, render_html, write_compare_html, write_html
from .markdown import md_escape, render_markdown, write_markdown

__all__ = ["render_html", "write_html", "render_compare_html", "write_compare_html",
           "render_markdown", "write_markdown", "md_escape"]
