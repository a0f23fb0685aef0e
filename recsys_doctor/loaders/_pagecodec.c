/* The page reader's inner loop in C: the integer columns of a run of SQLite table-leaf
 * pages, decoded in one pass over the rows (see _sqlite_pages.py, which walks the b-tree,
 * checks what it is given and falls back to numpy where this module was not built).
 *
 * It decodes exactly what the numpy path decodes and refuses exactly what it refuses, so
 * the loader's results do not depend on which one ran; every byte it reads is checked to
 * lie inside its cell, and every cell inside its page, before it is read. The GIL is
 * released while it works: two chunks decode on two cores.
 *
 * File format: https://www.sqlite.org/fileformat2.html (b-tree pages, cells, records,
 * serial types).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* status codes; their wording lives in _sqlite_pages.py (_CODEC_REFUSALS) */
enum {
    OK = 0,
    E_PAGE = 1,      /* a page number outside the file */
    E_KIND = 2,      /* not a table-leaf page */
    E_CELLS = 3,     /* more cells than a page holds */
    E_CELL = 4,      /* a cell outside its page */
    E_OVERFLOW = 5,  /* a row spills to overflow pages */
    E_HEADER = 6,    /* a record header this reader does not decode, or a short record */
    E_LONGTYPE = 7,  /* a serial type longer than one byte */
    E_NOTINT = 8,    /* a value that is not an integer */
    E_LONGREC = 9,   /* a record longer than its cell */
    E_ROWS = 10,     /* the pages hold another number of rows than the caller counted */
};

/* bytes a value of serial type t < 12 takes (0 NULL, 1-6 integers, 7 float, 8/9 the
 * constants 0 and 1, 10/11 reserved); t >= 12 (blob/text) takes (t - 12) / 2 */
static const int SIZE[12] = {0, 1, 2, 3, 4, 6, 8, 8, 0, 0, 0, 0};

/* one varint at p (before end): bytes taken, 0 where it runs past end */
static inline int varint(const uint8_t *p, const uint8_t *end, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        if (p + i >= end) return 0;
        uint8_t b = p[i];
        v = (v << 7) | (b & 0x7F);
        if (b < 0x80) {
            *out = v;
            return i + 1;
        }
    }
    if (p + 8 >= end) return 0;
    *out = (v << 8) | p[8];
    return 9;
}

/* a big-endian two's-complement integer of w (1..8) bytes ending at end, sign-extended:
 * one 8-byte load of the bytes before end (the caller knows 8 bytes there are readable) */
static inline int64_t be_int(const uint8_t *end, int w) {
    uint64_t x;
    memcpy(&x, end - 8, 8);
#if defined(__GNUC__)
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    x = __builtin_bswap64(x);
#endif
#else
    {
        const uint8_t *b = end - 8;
        x = 0;
        for (int i = 0; i < 8; i++) x = (x << 8) | b[i];
    }
#endif
    const int s = 64 - 8 * w;
    return (int64_t)(x << s) >> s;
}

static int decode(const uint8_t *buf, Py_ssize_t size, Py_ssize_t page_size, Py_ssize_t usable,
                  const int64_t *pages, Py_ssize_t npages, const int64_t *cols, Py_ssize_t ncols,
                  int64_t *restrict values, uint8_t *restrict nulls, int64_t *restrict null_counts,
                  Py_ssize_t n) {
    const int64_t file_pages = size / page_size;
    const int64_t need = cols[ncols - 1] + 1;
    /* want[col]: where record position col goes in the output, -1 where it is not wanted */
    Py_ssize_t want[127];
    for (int64_t col = 0; col < need; col++) want[col] = -1;
    for (Py_ssize_t j = 0; j < ncols; j++) want[cols[j]] = j;
    Py_ssize_t row = 0;
    for (Py_ssize_t p = 0; p < npages; p++) {
        const int64_t pg = pages[p];
        if (pg < 1 || pg > file_pages) return E_PAGE;
        const uint8_t *base = buf + (pg - 1) * page_size;
        const Py_ssize_t hdr = pg == 1 ? 100 : 0;
        const uint8_t *h = base + hdr;
        if (h[0] != 13) return E_KIND;
        const Py_ssize_t nc = ((Py_ssize_t)h[3] << 8) | h[4];
        const Py_ssize_t lo = hdr + 8 + 2 * nc; /* where the cell area may begin */
        if (lo > usable) return E_CELLS;
        if (row + nc > n) return E_ROWS;
        const uint8_t *page_end = base + usable;
        for (Py_ssize_t i = 0; i < nc; i++, row++) {
            const Py_ssize_t ptr = ((Py_ssize_t)h[8 + 2 * i] << 8) | h[9 + 2 * i];
            if (ptr < lo || ptr + 3 > usable) return E_CELL;
            const uint8_t *c = base + ptr;
            uint64_t payload, rowid;
            int k = varint(c, page_end, &payload);
            if (!k) return E_CELL;
            c += k;
            if (payload > (uint64_t)(usable - 35)) return E_OVERFLOW;
            k = varint(c, page_end, &rowid);
            if (!k) return E_CELL;
            c += k;
            if (payload > (uint64_t)(page_end - c)) return E_CELL;
            const uint8_t *rec = c, *rec_end = c + payload;
            if (payload < 1) return E_HEADER;
            const int64_t hsize = rec[0];
            if (hsize >= 0x80 || hsize < 1 + need) return E_HEADER;
            if ((uint64_t)hsize > payload) return E_LONGREC;
            /* (a value's 8-byte load starts at most 7 bytes before it: inside the page,
             * which begins at least 12 bytes before any value) */
            const uint8_t *v = rec + hsize;
            for (int64_t col = 0; col < need; col++) {
                const uint8_t t = rec[1 + col];
                if (t >= 0x80) return E_LONGTYPE;
                const Py_ssize_t w = t < 12 ? SIZE[t] : (t - 12) >> 1;
                if (w > rec_end - v) return E_LONGREC;
                v += w;
                const Py_ssize_t j = want[col];
                if (j < 0) continue;
                int64_t x = 0;
                uint8_t isnull = 0;
                if (t >= 1 && t <= 6) {
                    x = be_int(v, (int)w);
                } else if (t == 0) {
                    isnull = 1;
                    null_counts[j]++;
                } else if (t == 9) {
                    x = 1;
                } else if (t != 8) {
                    return E_NOTINT;
                }
                values[j * n + row] = x;
                nulls[j * n + row] = isnull;
            }
        }
    }
    return row == n ? OK : E_ROWS;
}

static int has_size(Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t count, const char *what) {
    if (b->len != itemsize * count) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, expected %zd", what, b->len, itemsize * count);
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(decode_doc,
"decode(file, page_size, usable, pages, columns, values, nulls, null_counts) -> status\n\n"
"Decode the integer columns ``columns`` (int64 record positions, ascending, distinct)\n"
"of every row of the table-leaf ``pages`` (int64 page numbers, in order) of the SQLite\n"
"file ``file`` into ``values`` (int64, len(columns) x n, row-major per column) and\n"
"``nulls`` (uint8, same shape: 1 where NULL, the value then 0); ``null_counts`` (int64,\n"
"len(columns)) is incremented per NULL. n, the rows the pages hold, is taken from the\n"
"shape of ``nulls``. Returns 0, or the code of what the pages hold that this decoder\n"
"does not read (the caller reads those rows another way).");

static PyObject *py_decode(PyObject *self, PyObject *args) {
    Py_buffer file, pages, cols, values, nulls, counts;
    Py_ssize_t page_size, usable;
    if (!PyArg_ParseTuple(args, "y*nny*y*w*w*w*", &file, &page_size, &usable, &pages, &cols, &values,
                          &nulls, &counts))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t npages = pages.len / 8, ncols = cols.len / 8;
    const Py_ssize_t n = ncols ? nulls.len / ncols : 0;
    if (page_size < 512 || usable < 480 || usable > page_size || file.len % page_size
        || pages.len % 8 || ncols < 1 || !has_size(&values, 8, ncols * n, "values")
        || !has_size(&nulls, 1, ncols * n, "nulls") || !has_size(&counts, 8, ncols, "null_counts")) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad page size, page list or columns");
        goto done;
    }
    const int64_t *c = (const int64_t *)cols.buf;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        if (c[i] < 0 || c[i] > 126 || (i && c[i] <= c[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "columns: ascending, distinct, 0..126");
            goto done;
        }
    }
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = decode((const uint8_t *)file.buf, file.len, page_size, usable, (const int64_t *)pages.buf, npages,
                    c, ncols, (int64_t *)values.buf, (uint8_t *)nulls.buf, (int64_t *)counts.buf, n);
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(status);
done:
    PyBuffer_Release(&file);
    PyBuffer_Release(&pages);
    PyBuffer_Release(&cols);
    PyBuffer_Release(&values);
    PyBuffer_Release(&nulls);
    PyBuffer_Release(&counts);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", py_decode, METH_VARARGS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pagecodec",
    "The page reader's row loop in C (see recsys_doctor.loaders._sqlite_pages).", -1, methods,
};

PyMODINIT_FUNC PyInit__pagecodec(void) { return PyModule_Create(&module); }
