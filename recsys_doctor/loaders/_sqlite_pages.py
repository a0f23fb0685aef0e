"""The integer columns of an SQLite table read straight from the file's pages, with numpy.

An nsys export's big tables (runtime API calls, copies, kernels...) hold only integers.
SQLite returns them one value at a time through its virtual machine and the ADBC driver
builds Arrow arrays from those values: most of a large export's load time. The file
format is public and stable (https://www.sqlite.org/fileformat2.html): a table is a
b-tree of pages, its rows are records in the leaf pages, a record is a header of "serial
types" (how each value is stored) followed by the values, big-endian. This module walks
the b-tree and decodes whole columns at once: one numpy operation per column and step
over every row of a chunk (gathers through byte-offset views of the memory-mapped file),
no Python per row or per page, and numpy releases the GIL while it works, so two chunks
decode on two cores. Where ``pip install`` could build it (a C compiler at hand), the
rows of a run are decoded instead by ``_pagecodec``, the same loop in C: one pass over
the rows straight into the output columns (about 3x less time than the numpy steps,
which allocate and touch every column several times); it decodes and refuses exactly
what the numpy path does (both parse each row's rowid varint), and both check that every
byte they read lies in its cell.

It decodes only what it can prove it reads right and raises :class:`Unsupported`
otherwise; the loader then reads that table through SQLite, which gives the same values.
What breaks the file format is :class:`Corrupt`: the loader refuses the file.
Unsupported: a database in WAL mode, a table that is not a rowid b-tree, a row whose
payload spills to overflow pages, a value in a wanted column that is not an integer or
NULL (text, blob, float), a row with fewer columns than the wanted ones (added by
``ALTER TABLE`` since), a header type too long for one byte, and anything malformed
(page numbers outside the file, pages of the wrong kind, cells outside their page).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_c_decode: Callable[..., int] | None
try:  # the row loop in C (built by pip install where a C compiler is at hand)
    from ._pagecodec import decode as _c_decode
except ImportError:  # pragma: no cover - an install without a compiler: numpy only
    _c_decode = None

__all__ = ["PageFile", "Unsupported", "Corrupt", "LeafRun", "compiled_available"]

_MAGIC = b"SQLite format 3\x00"
_LEAF, _INTERIOR = 13, 5  # page types of a table b-tree
#: bytes a value takes, by serial type (0 NULL, 1-6 integers of 1/2/3/4/6/8 bytes, 7 a
#: float, 8 and 9 the constants 0 and 1 with no bytes, 10/11 reserved, 12+ blob/text)
_SIZE = np.zeros(256, np.int64)
_SIZE[1:8] = (1, 2, 3, 4, 6, 8, 8)
_SIZE[12:128] = (np.arange(12, 128) - 12) // 2
#: serial types a wanted (integer) column may hold
_INT_TYPES = (0, 1, 2, 3, 4, 5, 6, 8, 9)
_NOT_INT = np.ones(256, bool)
_NOT_INT[list(_INT_TYPES)] = False
#: a value is read as the 8 bytes ending at its last byte, shifted left then right
#: (arithmetically) by this many bits: what is left is the value, sign-extended
_SHIFT = np.zeros(256, np.int64)
_SHIFT[1:7] = 64 - 8 * _SIZE[1:7]
_NO_BYTES = np.zeros(256, bool)
_NO_BYTES[[0, 8, 9]] = True


#: what each status of the C decoder means (the numpy path's wording for the same refusals)
_CODEC_REFUSALS = {
    1: "page number outside the file", 2: "not a leaf page", 3: "more cells than a page holds",
    4: "a cell outside its page", 5: "a row spills to overflow pages",
    6: "a record header this reader does not decode, or a short record",
    7: "a serial type longer than one byte", 8: "a value that is not an integer",
    9: "a record longer than its cell", 10: "the pages hold another number of rows than their headers",
}


def compiled_available() -> bool:
    """Whether the C row loop (``_pagecodec``) was built and imports."""
    return _c_decode is not None


class Unsupported(Exception):
    """These pages hold something this reader does not decode; read them through SQLite."""


class Corrupt(Unsupported):
    """A run's pages break the file format (a cell outside its page, a record longer than
    its cell...): no valid file holds them, and SQLite reads such bytes differently from
    one run to the next (past the end of its page buffer), so they are not re-read."""


#: what :meth:`PageFile.read` refuses as :class:`Corrupt` (every refusal but values this
#: reader does not decode: overflow pages, text or floats, short records, long types)
_CORRUPT = frozenset({"page number outside the file", "not a leaf page", "more cells than a page holds",
                      "a cell outside its page", "a record longer than its cell",
                      "the pages hold another number of rows than their headers",
                      "the b-tree visits more pages than the file has"})


@dataclass(frozen=True)
class LeafRun:
    """Consecutive leaf pages of one table (in b-tree order) and their row count: what
    one chunk of the load reads. Where :meth:`PageFile.read` refuses a run, the loader
    reads the whole table through SQLite (a rowid range could end early on a corrupt
    b-tree, without an error)."""

    pages: np.ndarray
    cells: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.cells.sum())


class PageFile:
    """An SQLite database file, memory-mapped, read page by page (read-only)."""

    def __init__(self, path: str | os.PathLike[str], *, compiled: bool | None = None) -> None:
        """``compiled``: decode rows with the C loop (True; an error where it is not
        built), with numpy (False), or with C where built (None, the default)."""
        if compiled and _c_decode is None:
            raise RuntimeError("the C page decoder (_pagecodec) is not built in this install")
        self.compiled = _c_decode is not None if compiled is None else compiled
        with open(Path(path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 512:
                raise Unsupported("smaller than one page")
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        b = self._mm
        if b[:16] != _MAGIC:
            raise Unsupported("not an SQLite 3 file")
        psz = int.from_bytes(b[16:18], "big")
        self.page_size = 65536 if psz == 1 else psz
        if self.page_size < 512 or self.page_size & (self.page_size - 1):
            raise Unsupported(f"page size {psz}")
        if b[18] != 1 or b[19] != 1:  # 2 = WAL: committed rows may still sit in the -wal file
            raise Unsupported("not a rollback-journal database (WAL)")
        self.usable = self.page_size - b[20]
        if size % self.page_size:
            raise Unsupported("size not a whole number of pages")
        self.n_pages = size // self.page_size
        self.size = size
        self.u8 = np.frombuffer(b, np.uint8)
        # byte-offset views: element i is the big-endian number starting at byte i
        self.be16 = np.ndarray((size - 1,), ">u2", buffer=b, strides=(1,))
        self.be32 = np.ndarray((size - 3,), ">u4", buffer=b, strides=(1,))
        self.be64 = np.ndarray((size - 7,), ">i8", buffer=b, strides=(1,))
        self.be16_even = np.frombuffer(b, ">u2")  # element i: the bytes 2i, 2i+1

    def close(self) -> None:
        for name in ("u8", "be16", "be32", "be64", "be16_even"):
            self.__dict__.pop(name, None)
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a view: the map goes with the last one
            pass

    # --- the b-tree --------------------------------------------------------------
    def _header_at(self, pages: np.ndarray) -> np.ndarray:
        """Byte offset of each page's b-tree header (page 1 starts with the file header)."""
        return (pages - 1) * self.page_size + np.where(pages == 1, 100, 0)

    def _check_pages(self, pages: np.ndarray) -> None:
        if len(pages) and (pages.min() < 1 or pages.max() > self.n_pages):
            raise Unsupported("page number outside the file")

    def _cell_offsets(self, pages: np.ndarray, hdr: np.ndarray, first: int, header: int) -> np.ndarray:
        """File offset of every cell of ``pages``, in page order then cell order.
        ``first``: the fewest bytes a cell has; ``header``: the b-tree header's size (8 for
        a leaf, 12 for an interior page)."""
        n = self.be16[hdr + 3].astype(np.int64)
        total = int(n.sum())
        if not total:
            return np.zeros(0, np.int64)
        base = (pages - 1) * self.page_size
        lo = hdr - base + header + 2 * n  # where a page's cell area may begin
        if (lo > self.usable).any():
            raise Unsupported("more cells than a page holds")
        # the cell pointer array (2-byte big-endian, at an even offset: page starts and
        # headers are even) read through the aligned 16-bit view
        starts = np.cumsum(n) - n
        seq = np.repeat((hdr + header) // 2 - starts, n)
        seq += np.arange(total, dtype=np.int64)
        ptr = self.be16_even[seq].astype(np.int64)
        has = n > 0
        if ((np.minimum.reduceat(ptr, starts[has]) < lo[has]).any()
                or (np.maximum.reduceat(ptr, starts[has]) + first > self.usable).any()):
            raise Unsupported("a cell outside its page")
        ptr += np.repeat(base, n)
        return ptr

    def leaves(self, root: int) -> tuple[np.ndarray, np.ndarray]:
        """The leaf pages of the table b-tree at ``root``, in key (rowid) order, and the
        number of rows (cells) on each. Levels are expanded whole: every interior page of
        a level at once."""
        level = np.array([root], np.int64)
        seen = 0
        while True:
            self._check_pages(level)
            seen += len(level)
            if seen > self.n_pages:
                raise Unsupported("the b-tree visits more pages than the file has")
            hdr = self._header_at(level)
            kind = self.u8[hdr]
            if (kind == _LEAF).all():
                return level, self.be16[hdr + 3].astype(np.int64)
            if not (kind == _INTERIOR).all():  # all leaves of a b-tree lie at one depth
                raise Unsupported("not a rowid table b-tree")
            cells = self._cell_offsets(level, hdr, 5, 12)  # left child (4 bytes), key varint
            n = self.be16[hdr + 3].astype(np.int64)
            left = self.be32[cells].astype(np.int64)
            right = self.be32[hdr + 8].astype(np.int64)
            # children of each page: its cells' left children in order, then its right child
            at = np.cumsum(n + 1) - 1  # where each page's right child goes
            child = np.empty(len(left) + len(level), np.int64)
            mask = np.ones(len(child), bool)
            mask[at] = False
            child[mask] = left
            child[at] = right
            level = child

    def runs(self, root: int, rows_per_run: int) -> list[LeafRun]:
        """The table's leaf pages cut into runs of about ``rows_per_run`` rows; raises
        :class:`Corrupt` for a b-tree that breaks the format, :class:`Unsupported` for one
        this reader does not walk."""
        try:
            pages, cells = self.leaves(root)
        except Unsupported as e:
            if str(e) in _CORRUPT:
                raise Corrupt(str(e)) from None
            raise
        keep = cells > 0  # only an empty table's root leaf has no cell
        pages, cells = pages[keep], cells[keep]
        if not len(pages):
            return []
        ends = np.cumsum(cells)
        cut = np.searchsorted(ends, np.arange(rows_per_run, int(ends[-1]), rows_per_run), side="left") + 1
        out = []
        for a, b in zip(np.r_[0, cut], np.r_[cut, len(pages)]):
            if a < b:
                out.append(LeafRun(pages[a:b], cells[a:b]))
        return out

    def check(self, root: int) -> None:
        """Raise :class:`Corrupt` where the table b-tree at ``root`` or a cell of its leaves
        leaves its page (for a table read through SQLite, which reads such cells past the
        end of its page buffer: a different answer on each run); overflow rows are fine."""
        try:
            pages, _ = self.leaves(root)
            hdr = self._header_at(pages)
            off = self._cell_offsets(pages, hdr, 3, 8)
            end = np.repeat((pages - 1) * self.page_size + self.usable, self.be16[hdr + 3].astype(np.int64))
            payload, n = _varints(self.u8, off, end)
            at = off + n
            at = at + _varints(self.u8, at, end)[1]
            # the bytes of a row on its page (https://www.sqlite.org/fileformat2.html, "Cell
            # payload overflow"): all of it, or a part and the 4-byte first overflow page
            u = self.usable
            lo, hi = (u - 12) * 32 // 255 - 23, u - 35
            spill = lo + (payload - lo) % (u - 4)
            local = np.where(payload <= hi, payload, np.where(spill <= hi, spill, lo) + 4)
            if (payload < 0).any() or (local > end - at).any():
                raise Unsupported("a cell outside its page")
        except Unsupported as e:
            if str(e) in _CORRUPT:
                raise Corrupt(str(e)) from None

    # --- the rows ----------------------------------------------------------------
    def read(self, run: LeafRun, columns: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
        """The values of ``columns`` (0-based positions in the table's records) of every
        row of ``run``, in rowid order: per column an int64 array and a boolean NULL mask
        (None where no row is NULL; NULL rows hold 0). The run's pages are let go of
        afterwards (they stay in the page cache, not in this process's memory)."""
        try:
            return self._decode(run, columns) if self.compiled else self._read(run, columns)
        except Unsupported as e:
            if str(e) in _CORRUPT:
                raise Corrupt(str(e)) from None
            raise
        finally:
            self._release(run.pages)

    def _release(self, pages: np.ndarray) -> None:
        """Unmap the span of ``pages`` from this process (``MADV_DONTNEED``; the file is
        read-only, so a later read maps them again from the page cache): the mapped file
        would otherwise count in the resident memory of the load, growing with the file."""
        if not len(pages) or not hasattr(self._mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        lo = (int(pages.min()) - 1) * self.page_size // mmap.PAGESIZE * mmap.PAGESIZE
        hi = min(int(pages.max()) * self.page_size, self.size)
        try:
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except (OSError, ValueError):
            pass

    def _decode(self, run: LeafRun, columns: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
        """:meth:`read` by the C loop: one pass over the rows, straight into the output."""
        cols = np.unique(np.asarray(columns, np.int64))
        if not len(cols) or cols[0] < 0 or cols[-1] > 126:  # (a record header of one byte holds 126 types)
            raise Unsupported("a record header this reader does not decode, or a short record")
        n = run.rows
        if _c_decode is None:  # (self.compiled is False then: read() does not come here)
            raise Unsupported("the C row loop is not built")
        values = np.empty((len(cols), n), np.int64)
        nulls = np.empty((len(cols), n), np.uint8)
        counts = np.zeros(len(cols), np.int64)
        status = _c_decode(self._mm, self.page_size, self.usable, np.ascontiguousarray(run.pages, np.int64),
                           cols, values, nulls, counts)
        if status:
            raise Unsupported(_CODEC_REFUSALS.get(status, f"status {status}"))
        return {int(c): (values[i], nulls[i].view(bool) if counts[i] else None) for i, c in enumerate(cols)}

    def _read(self, run: LeafRun, columns: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
        pages = run.pages
        self._check_pages(pages)
        hdr = self._header_at(pages)
        if not (self.u8[hdr] == _LEAF).all():
            raise Unsupported("not a leaf page")
        off = self._cell_offsets(pages, hdr, 3, 8)
        if not len(off):
            return {c: (np.zeros(0, np.int64), None) for c in columns}
        u8 = self.u8
        at, payload, hsize, need = self._records(pages, hdr, off, columns)
        last = at + hsize - 8  # 8 bytes before the end of the values read so far
        out: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        wanted = set(columns)

        def one_type(c: int, t: int) -> None:  # column c has serial type t on every row
            nonlocal last
            if t >= 0x80:
                raise Unsupported("a serial type longer than one byte")
            last += _SIZE[t]
            if c in wanted:
                out[c] = self._uniform(t, last)

        for c0 in range(0, need, 8):  # the serial types 8 at a time: one 8-byte read per row
            k = min(8, need - c0)
            words = None
            if int(at.max()) + 1 + c0 + 8 <= self.size:  # (not past the end of the file)
                words = self.be64[1 + c0:][at]
                if k < 8:
                    words &= np.int64(-1) << (64 - 8 * k)
                w0 = int(words[0])
                if (words == w0).all():  # the same k types on every row (the usual case)
                    for j in range(k):
                        one_type(c0 + j, (w0 >> (56 - 8 * j)) & 0xFF)
                    continue
            for c in range(c0, c0 + k):
                if words is not None:
                    t = (words >> (56 - 8 * (c - c0))).astype(np.uint8)
                else:
                    t = u8[c + 1:][at]  # column c's serial type, one byte each (checked below)
                t0 = int(t[0])
                if (t == t0).all():  # one type on every row: scalar steps
                    one_type(c, t0)
                    continue
                if (t >= 0x80).any():
                    raise Unsupported("a serial type longer than one byte")
                ti = t.astype(np.intp)
                last += _SIZE[ti]
                if c in wanted:
                    out[c] = self._mixed(ti, last)
        if (last > at + payload - 8).any():
            raise Unsupported("a record longer than its cell")
        return out

    def _records(self, pages: np.ndarray, hdr: np.ndarray, off: np.ndarray,
                 columns: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Each cell's record: ``(where it starts, payload size, header size, columns to read
        the serial types of)``, its header (one byte) holding the serial types of ``columns``."""
        u8 = self.u8
        # the cell: payload size (varint), rowid (varint), then the record; every byte is
        # checked to lie in the cell's page before it is read, in the C loop's order
        end = np.repeat((pages - 1) * self.page_size + self.usable, self.be16[hdr + 3].astype(np.int64))
        payload, n = _varints(u8, off, end)
        if (payload > self.usable - 35).any():  # the rest of such a row is on overflow pages
            raise Unsupported("a row spills to overflow pages")
        at = off + n
        at = at + _varints(u8, at, end)[1]  # the record: after the rowid
        if (payload > end - at).any():
            raise Unsupported("a cell outside its page")
        if (payload < 1).any():
            raise Unsupported("a record header this reader does not decode, or a short record")
        # the record header: its size (a varint; one byte for up to 127 bytes), then one
        # serial type per column
        hsize = u8[at].astype(np.int64)
        need = max(columns) + 1
        if (hsize >= 0x80).any() or (hsize < 1 + need).any():
            raise Unsupported("a record header this reader does not decode, or a short record")
        if (hsize > payload).any():
            raise Unsupported("a record longer than its cell")
        return at, payload, hsize, need

    def _uniform(self, t: int, last: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """A column whose values all have serial type ``t``."""
        if _NOT_INT[t]:
            raise Unsupported("a value that is not an integer")
        if _NO_BYTES[t]:
            n = len(last)
            return np.full(n, int(t == 9), np.int64), (np.ones(n, bool) if t == 0 else None)
        v = self.be64[np.minimum(last, len(self.be64) - 1)].astype(np.int64)  # (past the cell: refused after)
        shift = int(_SHIFT[t])
        if shift:
            v <<= shift
            v >>= shift
        return v, None

    def _mixed(self, t: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """A column whose values have different serial types (``t``, one per row)."""
        if _NOT_INT[t].any():
            raise Unsupported("a value that is not an integer")
        none = _NO_BYTES[t]  # NULL (0) and the constants 0 (8) and 1 (9) take no bytes
        if none.all():  # flags, enums: no value to read
            v = (t == 9).astype(np.int64)
        else:
            v = self.be64[np.minimum(last, len(self.be64) - 1)].astype(np.int64)
            shift = _SHIFT[t]
            np.left_shift(v, shift, out=v)
            np.right_shift(v, shift, out=v)
            if not none.any():
                return v, None
            v[none] = t[none] == 9
        nulls = t == 0
        return v, (nulls if nulls.any() else None)


def _varints(u8: np.ndarray, at: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varint at each offset: (values as uint64 bit patterns in int64, sizes). Raises
    :class:`Unsupported` where one runs past its ``end`` (the C loop's test: no byte at or
    after ``end`` is read as part of it)."""
    last = len(u8) - 1
    b = u8[np.minimum(at, last)].astype(np.int64)
    val = b & 0x7F
    size = np.ones(len(at), np.int64)
    todo = np.flatnonzero(b >= 0x80)
    v = val[todo]
    for i in range(1, 9):
        if not len(todo):
            break
        b = u8[np.minimum(at[todo] + i, last)].astype(np.int64)
        v = (v << 8) | b if i == 8 else (v << 7) | (b & 0x7F)
        size[todo] += 1
        more = (b >= 0x80) if i < 8 else np.zeros(len(todo), bool)
        done = ~more
        val[todo[done]] = v[done]
        todo, v = todo[more], v[more]
    if (at + size > end).any():
        raise Unsupported("a cell outside its page")
    return val, size
