"""The streamed Kineto path (large files: chunked typed decoding over a memory map) gives
exactly the tables of the whole-file path on every shared PyTorch profiler trace; chunks
are made tiny here so that every trace is cut in many places. So does the shared path
(this process and a forked one take chunks in turn), also when the forked one was
started before the load (``prefetch``) or dies; where it cannot hold (a cut inside an
event, invalid JSON) the load gives way to one process with the same result or the same
error."""

from __future__ import annotations

import gzip
import json
import os
import signal

import pandas as pd
import pytest

import recsys_doctor.loaders._kineto_chunks as chunks
import recsys_doctor.loaders._kineto_decode as decode
import recsys_doctor.loaders._kineto_events as events
import recsys_doctor.loaders._kineto_stream as stream
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
    monkeypatch.setattr(stream, "STREAM_MIN", 0)
    monkeypatch.setattr(stream, "GZ_TO_DISK", 0)
    monkeypatch.setattr(chunks, "STREAM_CHUNK", 20_000)
    monkeypatch.setattr(stream, "SPLIT_MIN", 0 if split else 1 << 62)
    used = []
    real, real_finish = stream.decode_streamed, stream.SplitDecode.finish
    monkeypatch.setattr(stream, "decode_streamed", lambda *a: used.append(1) or real(*a))
    monkeypatch.setattr(stream.SplitDecode, "finish", lambda *a: used.append(2) or real_finish(*a))
    _same(kineto.load_kineto_json(path), whole)
    assert used  # the streamed path ran (it may still hand back to the whole-file path)


def _spy_split(monkeypatch) -> list:
    """Make every streamed array shared; the list collects whether each sharing held."""
    monkeypatch.setattr(stream, "STREAM_MIN", 0)
    monkeypatch.setattr(stream, "GZ_TO_DISK", 0)
    monkeypatch.setattr(stream, "SPLIT_MIN", 0)
    held = []
    real = stream.SplitDecode.finish

    def finish(job, progress=None):
        out = real(job, progress)
        held.append(out is not None)
        return out

    monkeypatch.setattr(stream.SplitDecode, "finish", finish)
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


def _doc(evs: list[str]) -> str:
    return '{"traceEvents": [\n' + ",\n".join(evs) + "\n]}\n"


def test_a_nested_object_is_no_chunk_boundary(tmp_path, monkeypatch):
    """A "},\n" that closes a nested object (a key follows it, not an event's "{") is not
    taken as a cut: the chunks of the shared path still decode, with the tables of the
    whole-file path."""
    k = 200
    evs = [_event(i, f"k{i % 7}", nested=i % 3 == 0) for i in range(2 * k)]
    f = tmp_path / "nested.json"
    doc = _doc(evs)
    f.write_text(doc)
    monkeypatch.setattr(chunks, "STREAM_CHUNK", 3_000)
    whole = kineto.load_kineto_json(f)
    held = _spy_split(monkeypatch)
    _same(kineto.load_kineto_json(f), whole)
    assert held == [True]
    assert len(whole.kernels) == 2 * k
    # every chunk runs from an event's "{" to the "}" that ends an event, and between
    # them the chunks leave out only the separators
    raw = doc.encode()
    lo, hi = raw.index(b"["), raw.rindex(b"]")
    bounds = chunks.chunk_bounds(raw, lo, hi)
    assert len(bounds) > 10
    assert all(raw[a:a + 8] == b'{"ph": "' and raw[a:stop].rstrip().endswith(b"}}") for a, stop in bounds)
    assert bounds[-1][1] == hi
    assert all(raw[b[1]:c[0]] == b",\n" for b, c in zip(bounds, bounds[1:]))
    assert b"".join(raw[a:stop] + b"," for a, stop in bounds).count(b'"ph"') == 2 * k


def test_sharing_gives_way_when_a_cut_is_inside_an_event(tmp_path, monkeypatch):
    """A list of objects inside an event, one per line: a "},\n" followed by "{" that is
    not an event boundary. The chunk cut there does not decode, the sharing is given up
    and one process loads the trace, with the tables of the whole-file path."""
    k = 200
    evs = [_event(i, f"k{i % 7}") for i in range(k)]
    evs.append(_event(k, "x" * 4000).replace('"args": {', '"args": {"list": [{"y": 1},\n{"y": 2}], ', 1))
    evs += [_event(k + 1 + i, f"k{i % 5}") for i in range(k)]
    f = tmp_path / "list_of_objects.json"
    f.write_text(_doc(evs))
    monkeypatch.setattr(chunks, "STREAM_CHUNK", 3_000)
    whole = kineto.load_kineto_json(f)
    held = _spy_split(monkeypatch)
    _same(kineto.load_kineto_json(f), whole)
    assert held == [False]
    assert len(whole.kernels) == 2 * k + 1


def test_split_gives_way_to_the_same_error(tmp_path, monkeypatch):
    """Invalid JSON in one chunk (whichever process takes it): the sharing fails and the
    load reports the error the one-process path reports."""
    evs = [_event(i, f"k{i % 3}") for i in range(400)]
    evs[300] = evs[300].replace('"dur": 2', '"dur": 2,,')
    f = tmp_path / "bad_second_half.json"
    f.write_text('{"traceEvents": [\n' + ",\n".join(evs) + "\n]}\n")
    with pytest.raises(TraceFormatError) as one:
        kineto.load_kineto_json(f)
    held = _spy_split(monkeypatch)
    monkeypatch.setattr(chunks, "STREAM_CHUNK", 3_000)
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
    monkeypatch.setattr(stream, "STREAM_MIN", 0)
    monkeypatch.setattr(chunks, "STREAM_CHUNK", 5_000)
    whole = kineto.load_kineto_json(src)
    for p in (compact, nested):
        t = kineto.load_kineto_json(p)
        assert t.counts() == whole.counts()
        pd.testing.assert_frame_equal(t.kernels, whole.kernels)


@pytest.mark.parametrize("split", [False, True], ids=["one-process", "split"])
def test_streamed_progress_follows_bytes(split, shared_traces, monkeypatch):
    """On the streamed path the bar is moved to the bytes decoded, ending at the full
    length of the ``traceEvents`` array (shared: to the end of each chunk this process
    decodes, every chunk before it having been taken before it)."""
    src = next(p for p in KINETO if "df_index_resolver" in p.name)
    monkeypatch.setattr(stream, "STREAM_MIN", 0)
    monkeypatch.setattr(stream, "GZ_TO_DISK", 0)
    monkeypatch.setattr(chunks, "STREAM_CHUNK", 1 << 20)
    monkeypatch.setattr(stream, "SPLIT_MIN", 0 if split else 1 << 62)

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
        monkeypatch.setattr(stream, "STREAM_MIN", 0)
        monkeypatch.setattr(chunks, "STREAM_CHUNK", 2_000)
        monkeypatch.setattr(stream, "SPLIT_MIN", 0 if split else 1 << 62)
        _same(kineto.load_kineto_json(f), whole)


def _large_trace(monkeypatch):
    src = next(p for p in KINETO if "df_index_resolver" in p.name)
    monkeypatch.setattr(stream, "STREAM_MIN", 0)
    monkeypatch.setattr(stream, "SPLIT_MIN", 0)
    monkeypatch.setattr(chunks, "STREAM_CHUNK", 1 << 20)
    return src


def test_prefetched_job_is_taken_over(tmp_path, shared_traces, monkeypatch):
    """``prefetch`` (what ``advise`` calls before its imports) starts the forked decoder;
    the load of the same file takes it over and gives the tables of the whole-file path.
    A file changed since is not taken over, and a job nobody took is stopped at exit."""
    src = _large_trace(monkeypatch)
    f = tmp_path / "big.json"
    f.write_bytes(gzip.open(src).read())
    whole = kineto.load_kineto_json(src)
    assert stream.prefetch(f, kineto.EventColumns)
    job = stream._PREFETCHED[-1]
    assert job.pid > 0
    taken = []
    real = stream._take_prefetched
    monkeypatch.setattr(stream, "_take_prefetched", lambda p: taken.append(real(p)) or taken[-1])
    _same(kineto.load_kineto_json(f), whole)
    assert taken == [job] and job.pid == 0 and not stream._PREFETCHED
    # a job for a file that changed before the load is not used for it
    assert stream.prefetch(f, kineto.EventColumns)
    stale = stream._PREFETCHED[-1]
    with open(f, "ab") as out:
        out.write(b"\n")
    assert not stale.matches(str(f))
    _same(kineto.load_kineto_json(f), whole)
    assert taken[-1] is None and stream._PREFETCHED == [stale]
    pid = stale.pid
    stream._drop_prefetched()  # what exit does
    assert stale.pid == 0 and not stream._PREFETCHED
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)  # reaped
    assert not stream.prefetch(tmp_path / "missing.json", kineto.EventColumns)
    assert not stream.prefetch(tmp_path, kineto.EventColumns)


def test_chunks_of_a_dead_child_are_decoded_here(tmp_path, shared_traces, monkeypatch):
    """The forked decoder is killed: every chunk it took and did not deliver is decoded by
    this process, with the tables of the whole-file path."""
    src = _large_trace(monkeypatch)
    f = tmp_path / "big.json"
    f.write_bytes(gzip.open(src).read())
    whole = kineto.load_kineto_json(src)
    job = stream.SplitDecode.start(str(f), kineto.EventColumns)
    assert job is not None and len(job.bounds) > 10
    os.kill(job.pid, signal.SIGKILL)
    top, is_array, cols = job.finish()
    assert job.pid == 0
    monkeypatch.setattr(decode, "load_streamed", lambda *a: (top, is_array, cols))  # the tables of cols
    _same(kineto.load_kineto_json(f), whole)


@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_decoding_by_phase_equals_decoding_as_events(path, shared_traces, monkeypatch):
    """Events decoded by phase (flows, instants... skipped in C) give the tables of events
    decoded one struct type for all, the way a trace with a phase outside the Trace Event
    Format is decoded."""
    by_phase = kineto.load_kineto_json(path)

    def refuse(buf):
        raise events.msgspec.ValidationError("as if a phase were unknown")

    refuser = type("Refuse", (), {"decode": staticmethod(refuse)})
    # (the by-phase decoders of both modes: float literals as floats, and as text)
    monkeypatch.setattr(events, "_DECODERS", {k: (refuser, v[1], refuser, v[3]) for k, v in events._DECODERS.items()})
    _same(kineto.load_kineto_json(path), by_phase)


def test_an_unknown_phase_decodes_as_events(tmp_path):
    """A phase outside the Trace Event Format ("Z") or a missing one: the batch is decoded
    as :class:`Event`; such events are counted and not loaded, like flows."""
    evs = [json.loads(_event(i, f"k{i % 3}")) for i in range(6)]
    flows = [{"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 1005, "cat": "ac2g", "name": "ac2g"}]
    odd = [{"ph": "Z", "pid": 0, "tid": 7, "ts": 1006}, {"pid": 0, "tid": 7, "ts": 1007}]
    a, b = tmp_path / "flows.json", tmp_path / "odd.json"
    a.write_text(json.dumps({"traceEvents": evs + flows}))
    b.write_text(json.dumps({"traceEvents": evs + odd}))
    assert type(decode.decode_events(json.dumps(evs + flows).encode())[0]) is decode.Complete
    assert type(decode.decode_events(json.dumps(evs + odd).encode())[0]) is decode.Event
    ta, tb = kineto.load_kineto_json(a), kineto.load_kineto_json(b)
    assert len(ta.kernels) == len(tb.kernels) == 6
    assert ta.meta["events"] == 7 and tb.meta["events"] == 8
    pd.testing.assert_frame_equal(ta.kernels, tb.kernels)


@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_tables_built_in_two_processes_equal_one(path, shared_traces, monkeypatch):
    """Large traces build the ranges and the other tables in two processes: the same
    tables and metadata (dropped rows, unmatched GPU events) as one process."""
    one = kineto.load_kineto_json(path)
    monkeypatch.setattr(kineto, "PARALLEL_EVENTS", 0)
    forked = []
    real = kineto.run_in_two
    monkeypatch.setattr(kineto, "run_in_two", lambda tasks: forked.append(len(tasks)) or real(tasks))
    _same(kineto.load_kineto_json(path), one)
    assert forked == [2]


def test_counters_of_both_parts_are_kept(tmp_path, monkeypatch):
    """Rows without a ``ts`` dropped from the ranges and from the calls, and kernels no call
    links to, are counted the same when the two parts are built apart (by hand: 2 + 1
    dropped, 3 unmatched kernels)."""
    evs = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 2, "ts": 100 + i, "dur": 1}
           for i in range(4)]
    evs += [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 2, "dur": 1} for _ in range(2)]
    evs += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 110 + i,
             "dur": 1, "args": {"correlation": i + 1}} for i in range(2)]
    evs += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "dur": 1,
             "args": {"correlation": 9}}]
    evs += [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 120 + i, "dur": 1,
             "args": {"device": 0, "stream": 7, "correlation": c}} for i, c in enumerate((1, 2, 5, 6, 7))]
    f = tmp_path / "counters.json"
    f.write_text(json.dumps({"traceEvents": evs}))
    one = kineto.load_kineto_json(f)
    assert one.meta["dropped_events_without_ts"] == 3
    assert one.meta["unmatched_gpu_events"] == 3 and len(one.kernels) == 5 and len(one.ranges) == 4
    monkeypatch.setattr(kineto, "PARALLEL_EVENTS", 0)
    _same(kineto.load_kineto_json(f), one)
