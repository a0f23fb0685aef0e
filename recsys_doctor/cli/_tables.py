"""Tables that fit a terminal of 80 columns: the prose notes of a row go below the table."""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["Footnotes"]


class Footnotes:
    """Each note printed once below a table, the rows citing it by number (``[1]``): a
    column of prose beside the numbers wraps into a tall, unreadable table on 80 columns."""

    def __init__(self) -> None:
        self.notes: dict[str, int] = {}

    def cite(self, notes: Iterable[str]) -> str:
        """``[1],[2]`` for ``notes`` (empty ones left out), numbering new ones."""
        return ",".join(f"[{self.notes.setdefault(n, len(self.notes) + 1)}]" for n in notes if n)

    def print(self, console: Any) -> None:
        for n, i in self.notes.items():
            console.print(f"[{i}] {n}", markup=False, highlight=False)
