"""The streamed Kineto path (large files: chunked typed decoding over a memory map) gives
exactly the tables of the whole-file path on every shared PyTorch profiler trace; chunks
are made tiny here so that every trace is cut in many places."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

import recsys_doctor.loaders._kineto_decode as decode
import recsys_doctor.loaders.kineto as kineto
from conftest import shared_files
from test_engine import _same  # every table and the metadata equal

pytestmark = pytest.mark.shared

KINETO = shared_files("h100", ("*.json.gz", "*.json")) + shared_files("kineto", ("*.json.gz", "*.json"))


@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_streamed_equals_whole(path, shared_traces, monkeypatch):
    whole = kineto.load_kineto_json(path)
    monkeypatch.setattr(decode, "STREAM_MIN", 0)
    monkeypatch.setattr(decode, "GZ_TO_DISK", 0)
    monkeypatch.setattr(decode, "STREAM_CHUNK", 20_000)
    used = []
    real = decode.decode_streamed
    monkeypatch.setattr(decode, "decode_streamed", lambda *a: used.append(1) or real(*a))
    _same(kineto.load_kineto_json(path), whole)
    assert used  # the streamed path ran (it may still hand back to the whole-file path)


def test_streamed_falls_back_on_compact_json(tmp_path, monkeypatch, shared_traces):
    """One line of JSON (no newline between events): no cut point, one chunk, same result;
    a nested "},\\n" inside an event is not an event boundary and the file still loads."""
    src = next(p for p in KINETO if "alexnet" in p.name)
    doc = json.loads(gzip.open(src).read())
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(doc))
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps(doc, indent=1))  # "},\n" also closes every args object
    monkeypatch.setattr(decode, "STREAM_MIN", 0)
    monkeypatch.setattr(decode, "STREAM_CHUNK", 5_000)
    whole = kineto.load_kineto_json(src)
    for p in (compact, nested):
        t = kineto.load_kineto_json(p)
        assert t.counts() == whole.counts()
        pd.testing.assert_frame_equal(t.kernels, whole.kernels)


def test_streamed_progress_follows_bytes(shared_traces, monkeypatch):
    """On the streamed path the bar is moved to the bytes decoded, ending at the full
    length of the ``traceEvents`` array."""
    src = next(p for p in KINETO if "df_index_resolver" in p.name)
    monkeypatch.setattr(decode, "STREAM_MIN", 0)
    monkeypatch.setattr(decode, "GZ_TO_DISK", 0)
    monkeypatch.setattr(decode, "STREAM_CHUNK", 1 << 20)

    class Rec:
        def __init__(self):
            self.seen = []

        def advance(self, n=1):
            pass

        def update(self, *, completed=None, total=None, description=None):
            self.seen.append((completed, total))

    rec = Rec()
    kineto.load_kineto_json(src, progress=rec)
    raw = gzip.open(src).read()
    assert len(rec.seen) > 10  # ~50 MB of JSON in 1 MB chunks
    done = [c for c, _ in rec.seen]
    assert done == sorted(done) and all(t == rec.seen[0][1] for _, t in rec.seen)
    # the total is the span of the events array, from its "[" to its "]" (found by the
    # standard library's decoder), and the last step reaches it
    start = raw.index(b"[", raw.index(b'"traceEvents"'))
    text = raw.decode()
    _, end = json.JSONDecoder().raw_decode(text, len(raw[:start].decode()))
    assert rec.seen[0][1] == len(text[:end].encode()) - 1 - start
    assert done[-1] >= rec.seen[0][1]
