"""JSON output shared by every command and file the package writes."""

from __future__ import annotations

__all__ = ["json_default"]


def json_default(o: object) -> object:
    """numpy scalars and similar that slip into evidence dicts; sets and tuples as lists."""
    if hasattr(o, "item"):
        return o.item()  # type: ignore[no-any-return]
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)

