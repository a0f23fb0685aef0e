"""JSON output shared by every command and file the package writes."""

from __future__ import annotations

__all__ = ["json_default"]


def json_default(o: object) -> object:
    """numpy scalars and similar that slip into evidence dicts; sets and tuples as lists;
    result objects through their ``to_dict()``."""
    if hasattr(o, "item"):
        return o.item()  # type: ignore[no-any-return]
    if isinstance(o, (set, tuple)):
        return list(o)
    if hasattr(o, "to_dict"):
        return o.to_dict()  # type: ignore[no-any-return]
    return str(o)

