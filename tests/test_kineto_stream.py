"""The streamed Kineto path (large files: chunked typed decoding over a memory map) gives
exactly the tables of the whole-file path on every shared PyTorch profiler trace; chunks
are made tiny here so that every trace is cut in many places. So does the split path (a
forked process decodes the second half of the events), and where the split cannot hold
(the middle cut falls inside an event, the second half is not valid JSON) the load gives
way to one process with the same result or the same error."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

import recsys_doctor.loaders._kineto_decode as decode
import recsys_doctor.loaders.kineto as kineto
from recsys_doctor.errors import TraceFormatError
from conftest import shared_files
from test_engine import _same  # every table and the metadata equal

pytestmark = pytest.mark.shared

KINETO = shared_files("h100", ("*.json.gz", "*.json")) + shared_files("kineto", ("*.json.gz", "*.json"))


@pytest.mark.parametrize("split", [False, True], ids=["one-process", "split"])
@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_streamed_equals_whole(path, split, shared_traces, monkeypatch):
    whole = kineto.load_kineto_json(path)
    monkeypatch.setattr(decode, "STREAM_MIN", 0)
    monkeypatch.setattr(decode, "GZ_TO_DISK", 0)
    monkeypatch.setattr(decode, "STREAM_CHUNK", 20_000)
    monkeypatch.setattr(decode, "SPLIT_MIN", 0 if split else 1 << 62)
    used = []
    real, real_split = decode.decode_streamed, decode.decode_split
    monkeypatch.setattr(decode, "decode_streamed", lambda *a: used.append(1) or real(*a))
    monkeypatch.setattr(decode, "decode_split", lambda *a: used.append(2) or real_split(*a))
    _same(kineto.load_kineto_json(path), whole)
    assert used  # the streamed path ran (it may still hand back to the whole-file path)


def _spy_split(monkeypatch) -> list:
    """Make every streamed array split; the list collects whether each split held."""
    monkeypatch.setattr(decode, "STREAM_MIN", 0)
    monkeypatch.setattr(decode, "GZ_TO_DISK", 0)
    monkeypatch.setattr(decode, "SPLIT_MIN", 0)
    held = []
    real = decode.decode_split
    monkeypatch.setattr(decode, "decode_split", lambda *a: held.append(real(*a) is not None) or
                        (decode._events_span(a[0])[2:] if held[-1] else None))
    return held


def test_split_holds_on_a_large_trace(shared_traces, monkeypatch):
    """On a real trace the two halves are decoded by two processes and give the tables of
    one process (the default chunk size; the strings of both halves in one table)."""
    src = next(p for p in KINETO if "df_index_resolver" in p.name)
    whole = kineto.load_kineto_json(src)
    held = _spy_split(monkeypatch)
    _same(kineto.load_kineto_json(src), whole)
    assert held == [True]


def _event(i: int, name: str, nested: bool = False) -> str:
    args = '{"correlation": %d, "device": 0, "stream": 7}' % i
    if nested:  # a nested object closed by "},\n" inside the event: not an event boundary
        args = '{"x": {"y": 1},\n"correlation": %d, "device": 0, "stream": 7}' % i
    return ('{"ph": "X", "cat": "kernel", "name": "%s", "pid": 0, "tid": 7, "ts": %d, "dur": 2, "args": %s}'
            % (name, 1000 + 10 * i, args))


def test_split_gives_way_when_the_middle_cut_is_inside_an_event(tmp_path, monkeypatch):
    """The first "},\n" after the middle of the array closes a nested object: the first
    half's last chunk does not decode, the split is given up and one process loads the
    trace, with the tables of the whole-file path."""
    k = 200
    evs = [_event(i, f"k{i % 7}") for i in range(k)]
    # the nested event sits across the middle, its inner "},\n" after the middle
    evs.append(_event(k, "x" * 4000, nested=True))
    evs += [_event(k + 1 + i, f"k{i % 5}") for i in range(k)]
    doc = '{"traceEvents": [\n' + ",\n".join(evs) + "\n]}\n"
    f = tmp_path / "nested_mid.json"
    f.write_text(doc)
    arr_start = doc.index("[")
    mid = doc.find("},\n", arr_start + (doc.rindex("]") - arr_start) // 2)
    assert mid == doc.index('{"y": 1}') + len('{"y": 1') and mid >= 0  # the cut falls inside the event
    whole = kineto.load_kineto_json(f)
    held = _spy_split(monkeypatch)
    monkeypatch.setattr(decode, "STREAM_CHUNK", 3_000)
    _same(kineto.load_kineto_json(f), whole)
    assert held == [False]
    assert len(whole.kernels) == 2 * k + 1


def test_split_gives_way_to_the_same_error(tmp_path, monkeypatch):
    """Invalid JSON in the second half (the child's): the split fails and the load reports
    the error the one-process path reports."""
    evs = [_event(i, f"k{i % 3}") for i in range(400)]
    evs[300] = evs[300].replace('"dur": 2', '"dur": 2,,')
    f = tmp_path / "bad_second_half.json"
    f.write_text('{"traceEvents": [\n' + ",\n".join(evs) + "\n]}\n")
    with pytest.raises(TraceFormatError) as one:
        kineto.load_kineto_json(f)
    held = _spy_split(monkeypatch)
    monkeypatch.setattr(decode, "STREAM_CHUNK", 3_000)
    with pytest.raises(TraceFormatError) as split:
        kineto.load_kineto_json(f)
    assert held == [False]
    assert str(split.value) == str(one.value)


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


@pytest.mark.parametrize("split", [False, True], ids=["one-process", "split"])
def test_streamed_progress_follows_bytes(split, shared_traces, monkeypatch):
    """On the streamed path the bar is moved to the bytes decoded, ending at the full
    length of the ``traceEvents`` array (split: this process's half, scaled to the whole)."""
    src = next(p for p in KINETO if "df_index_resolver" in p.name)
    monkeypatch.setattr(decode, "STREAM_MIN", 0)
    monkeypatch.setattr(decode, "GZ_TO_DISK", 0)
    monkeypatch.setattr(decode, "STREAM_CHUNK", 1 << 20)
    monkeypatch.setattr(decode, "SPLIT_MIN", 0 if split else 1 << 62)

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


def test_batches_give_the_columns_of_one_batch(tmp_path, monkeypatch):
    """Later batches take shortcuts (names already in the string table looked up at once,
    args fields read straight from the events); batches with a new name, a null name, a
    non-string name, ``"args": null`` or a ``"stream 7"`` string take the plain way. Tiny
    chunks (many batches, split or not) give the tables of one batch."""
    evs = []
    for i in range(600):
        name = f"k{i % 4}" if i < 500 else [f"k{i % 4}", None, 12, "new", 3.5][i % 5]
        args = {"device": 0, "stream": 7, "correlation": i + 1, "grid": [i % 3 + 1, 1, 1], "block": [32, 1, 1]}
        if i % 97 == 5:
            args = None
        elif i % 89 == 3:
            args = dict(args, stream="stream 7")
        evs.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 1000 + 10 * i,
                    "dur": 2, "args": args})
        evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel" if i % 50 else f"call{i}",
                    "pid": 1, "tid": 2, "ts": 995 + 10 * i, "dur": 3,
                    "args": None if i % 101 == 7 else {"correlation": i + 1}})
        evs.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
                    "tid": 8, "ts": 1003 + 10 * i, "dur": 1,
                    "args": {"device": 0, "stream": 8, "correlation": 0, "bytes": 64,
                             "kind": None if i % 7 == 0 else "HtoD"}})
    f = tmp_path / "edge.json"
    f.write_text('{"traceEvents": [\n' + ",\n".join(json.dumps(e) for e in evs) + "\n]}\n")
    whole = kineto.load_kineto_json(f)
    assert len(whole.kernels) == 600
    for split in (False, True):
        monkeypatch.setattr(decode, "STREAM_MIN", 0)
        monkeypatch.setattr(decode, "STREAM_CHUNK", 2_000)
        monkeypatch.setattr(decode, "SPLIT_MIN", 0 if split else 1 << 62)
        _same(kineto.load_kineto_json(f), whole)
