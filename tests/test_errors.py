"""The one helper that turns an exception into the line a user reads."""

from __future__ import annotations

from recsys_doctor.errors import first_line


def test_first_line_helper():
    assert first_line(ValueError("bad plan\n  detail\nmore")) == "ValueError: bad plan"
    assert first_line(KeyError()) == "KeyError"
    assert first_line(RuntimeError("  \n"), with_type=False) == "(no message)"
    assert first_line(OSError("disk full\ntrace"), with_type=False) == "disk full"
