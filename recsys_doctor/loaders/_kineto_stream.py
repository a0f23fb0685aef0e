"""Large Kineto files, streamed: decompressed to a temporary file where gzipped, memory-mapped,
and decoded a chunk at a time (:mod:`._kineto_chunks`) - by this process and a forked one
together where a second CPU is ours (:class:`SplitDecode`), possibly started before the rest
of the program is imported (:func:`prefetch`)."""

from __future__ import annotations

import atexit
import contextlib
import gc
import mmap
import os
from typing import Any, Generic

from .._util.files import gunzip_into, private_temp
from .._util.fork import fork_with_queue, load_results, read_all, reap, second_cpu, serve_queue
from .._util.progress import ProgressHandle
import msgspec

from ._kineto_chunks import _events_span, _release, chunk_bounds, decode_streamed
from ._kineto_events import (_EXACT, GZIP_MAGIC, S, SinkFactory, _no_events_in_array, decode_events, exact_floats,
                             needs_exact)


#: files smaller than this are decoded in one piece (no gain from streaming them)
STREAM_MIN = 64 << 20
#: a gzip file larger than this is decompressed to a temporary file, then streamed
GZ_TO_DISK = 8 << 20
#: a streamed events array at least this large is split between two processes (where a
#: second CPU is ours: :func:`~recsys_doctor._util.fork.second_cpu`)
SPLIT_MIN = 32 << 20



def load_streamed(path: str, sink_factory: SinkFactory[S],
                  progress: ProgressHandle | None = None) -> tuple[dict[str, Any], bool, S] | None:
    """Large traces: decode ``traceEvents`` a chunk at a time into a fresh sink; ``(top,
    is_array, sink)``, or None when the file is small or not laid out as expected (the
    caller then decodes it whole: same result, more memory; that path also words errors)."""
    expands = False
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            gz = f.read(2) == GZIP_MAGIC
            if gz and size >= 18:  # the gzip trailer's size (mod 2**32): a small file may expand far
                f.seek(-4, os.SEEK_END)
                expands = int.from_bytes(f.read(4), "little") >= STREAM_MIN
    except OSError:
        return None
    if (size < GZ_TO_DISK and not expands) if gz else (size < STREAM_MIN):
        return None
    with contextlib.ExitStack() as stack:
        tmp = None
        if gz:
            fd, tmp = stack.enter_context(private_temp(".json"))  # removed on every way out
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                gunzip_into(src, out, path)
        job = _take_prefetched(path) if tmp is None else None
        if job is None:
            job = SplitDecode.start(tmp or path, sink_factory)
        if job is not None:
            split = job.finish(progress)
            if split is not None:
                return split
        with open(tmp or path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            sink = sink_factory()
            found = decode_streamed(mm, sink, progress)
            return None if found is None else (*found, sink)


class SplitDecode(Generic[S]):
    """A large events array decoded by this process and a forked child together.

    The array is cut into chunks of about :data:`STREAM_CHUNK` bytes, each ending at an
    event's closing ``},`` (followed by a newline, then the next event's ``{``). Both
    processes take the next chunk not yet taken (a 4-byte index read from a shared pipe,
    which the kernel hands to one reader only) and decode it into a sink of its own (the
    sinks of one process share a string table), so the two stay busy until the array is
    done, however late this process joins in: the command line starts the child
    (:func:`prefetch`) before it imports the rest of the program. The child sends its
    chunks' columns back pickled; :meth:`finish` appends every chunk's columns in file
    order to one sink: the columns one process makes, but for how the strings are
    numbered (which no table depends on).

    A chunk the child did not deliver (it died, was killed) is decoded here. A chunk that
    does not decode (a cut inside an event after all, invalid JSON, a value the sink
    refuses) makes :meth:`finish` answer None: the caller decodes the file in one process,
    which also words the error."""

    def __init__(self, path: str, mm: mmap.mmap, f: Any, span: tuple[int, int, dict[str, Any], bool],
                 bounds: list[tuple[int, int]], sink_factory: SinkFactory[S]) -> None:
        self.path, self.mm, self._file = path, mm, f
        self.arr_start, self.arr_end, self.top, self.is_array = span
        self.bounds, self.sink_factory = bounds, sink_factory
        self._strings: Any = None  # the string table this process's chunks share
        self.exact = needs_exact(path)  # float literals as text (both processes alike)
        self._stat = _identity(os.fstat(f.fileno()))
        self.pid = 0
        self._queue = self._results = -1

    @classmethod
    def start(cls, path: str, sink_factory: SinkFactory[S]) -> "SplitDecode[S] | None":
        """Open ``path`` (plain JSON), cut its events array and fork the child; None when
        there is nothing to share (small array, one CPU, unusual layout, fork refused)."""
        if not second_cpu():
            return None
        try:
            f = open(path, "rb")
        except OSError:
            return None
        try:
            if f.read(2) == GZIP_MAGIC:
                raise ValueError
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            f.close()
            return None
        job = None
        try:
            span = _events_span(mm)
            if span is not None and span[1] - span[0] >= SPLIT_MIN:
                bounds = chunk_bounds(mm, span[0], span[1])
                if 2 <= len(bounds) <= _MAX_CHUNKS:
                    job = cls(path, mm, f, span, bounds, sink_factory)
                    if not job._fork():
                        job = None
        finally:
            if job is None:
                mm.close()
                f.close()
        return job

    def _fork(self) -> bool:
        def child(qr: int, rw: int) -> None:
            self._queue = qr
            self._child(rw)

        queue = b"".join(i.to_bytes(4, "little") for i in range(len(self.bounds)))  # < 64 KiB
        started = fork_with_queue(queue, child)
        if started is None:
            return False
        self.pid, self._queue, self._results = started
        return True

    def _take(self) -> int | None:
        b = os.read(self._queue, 4)
        return int.from_bytes(b, "little") if len(b) == 4 else None

    def _decode(self, view: memoryview, i: int) -> Any:
        """Chunk ``i`` decoded into a fresh sink, its columns exported; None when the chunk
        does not decode (or is a bare array's first chunk that holds no trace events)."""
        a, stop = self.bounds[i]
        try:
            with exact_floats(self.exact or _EXACT[0]):
                evs = decode_events(b"".join((b"[", view[a:stop], b"]")))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if i == 0 and self.is_array and _no_events_in_array(evs):
            return None
        sink = self.sink_factory(self._strings)
        self._strings = sink.strings
        sink(evs)
        del evs
        _release(self.mm, a, stop)
        return sink.export()

    def _child(self, w: int) -> None:
        """The forked child: decode chunks until none is left (or one does not decode),
        write ``{index: columns or None}`` to ``w`` and exit without running any of the
        parent's exit handlers."""
        gc.disable()  # the structs are not tracked; what else is made lives until exit
        view = memoryview(self.mm)

        def run(i: int) -> Any:
            try:
                return self._decode(view, i)
            except Exception:  # noqa: BLE001 - the parent sees the chunk fail and gives way
                return None

        serve_queue(self._take, run, w)

    def finish(self, progress: ProgressHandle | None = None) -> tuple[dict[str, Any], bool, S] | None:
        """Take chunks here until none is left, then gather the child's; ``(top,
        is_array, sink)`` with every chunk's columns in file order, or None (a chunk
        does not decode: the caller decodes in one process). The job is closed."""
        lo, hi = self.arr_start, self.arr_end
        mine: dict[int, Any] = {}
        view = memoryview(self.mm)
        try:
            ok = True
            while (i := self._take()) is not None:
                try:
                    mine[i] = self._decode(view, i)
                except (TypeError, ValueError, AttributeError, KeyError):
                    mine[i] = None  # one process meets the same value and words the error
                if mine[i] is None:
                    ok = False
                    break
                if progress is not None:  # every chunk before this one was taken before it
                    progress.update(completed=min(self.bounds[i][1], hi) - lo, total=hi - lo)
            if not ok:
                return None
            theirs = self._gather()
            sink = self.sink_factory(self._strings)
            remaps: dict[int, Any] = {}
            for i in range(len(self.bounds)):
                part = mine.pop(i) if i in mine else theirs.pop(i, _MISSING)
                if part is _MISSING:  # the child did not deliver it
                    try:
                        part = self._decode(view, i)
                    except (TypeError, ValueError, AttributeError, KeyError):
                        part = None
                if part is None:
                    return None
                sink.merge(part, remaps)
            if progress is not None:
                progress.update(completed=hi - lo, total=hi - lo)
            return self.top, self.is_array, sink
        finally:
            view.release()
            self.close()

    def _gather(self) -> dict[int, Any]:
        """The child's chunks (none when it died or sent something unreadable)."""
        payload = read_all(self._results, self.pid)
        self._results = -1
        code = reap(self.pid, kill=False) if payload is not None else None  # (a hung one is reaped)
        self.pid = 0
        return load_results(payload) if code == 0 and payload is not None else {}

    def close(self) -> None:
        """Stop the child (if still running) and let the file go; safe to call twice."""
        for fd in (self._queue, self._results):
            if fd >= 0:
                os.close(fd)
        self._queue = self._results = -1
        if self.pid:
            reap(self.pid, kill=True)
            self.pid = 0
        with contextlib.suppress(BufferError):  # a view still held: the GC closes it later
            self.mm.close()
        self._file.close()

    def matches(self, path: str) -> bool:
        """Whether this job reads the file ``path`` names now (the same file, unchanged)."""
        try:
            return _identity(os.stat(path)) == self._stat
        except (OSError, ValueError):
            return False


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


_MISSING = object()
#: chunk indices in the queue pipe, 4 bytes each, must fit its 64 KiB before anyone reads
_MAX_CHUNKS = 16_000
_PREFETCHED: list[SplitDecode[Any]] = []


def prefetch(path: str | os.PathLike[str], sink_factory: SinkFactory[Any]) -> bool:
    """Set the shared decoding of a large plain Kineto file going now (the command line
    calls this before it imports pandas and the analyzers, so the child decodes while this
    process imports); :func:`load_streamed` of the same, unchanged file takes it over.
    A job never taken over is stopped at exit. True when a job was started.
    ``sink_factory`` is the loader's (``EventColumns``)."""
    try:
        p = os.fspath(path)
        if not os.path.isfile(p) or os.path.getsize(p) < STREAM_MIN:
            return False
    except (OSError, TypeError, ValueError):
        return False
    job = SplitDecode.start(p, sink_factory)
    if job is None:
        return False
    if not _PREFETCHED:
        atexit.register(_drop_prefetched)
    _PREFETCHED.append(job)
    return True


def _take_prefetched(path: str) -> SplitDecode[Any] | None:
    for job in list(_PREFETCHED):
        if job.matches(path):
            _PREFETCHED.remove(job)
            return job
    return None


def _drop_prefetched() -> None:
    while _PREFETCHED:
        _PREFETCHED.pop().close()
