/* PROTOTYPE (issue 24, an experiment, not part of the package): the batcher with its driver
 * in C. The question it answers: is the batched path's ceiling the Python driver (its staging
 * copy and the two GIL hand-offs it makes per batch), or the client threads' own GIL
 * hand-offs? Here a client's call checks its tensors with the GIL held, then in ONE release
 * of the GIL copies them into a pinned slot, queues the slot and sleeps on a semaphore; a
 * plain pthread (never holding the GIL) forms batches over the stream groups as soon as
 * requests are queued and a group is free: one host-to-device copy per request into the
 * group's device blocks, the bucket's CUDA graph (captured by the runtime's CudaWorker),
 * one device-to-host copy, an event; a completion pthread per group waits for its batch,
 * copies each request's output rows into the request's own result buffer and posts its
 * semaphore. A caller that finds nothing queued and nothing in flight
 * runs its query on a free group itself (GIL released). libcuda is opened with dlopen.
 *
 * Driver(ctx, groups, spec, block, slots_ptr, nslots, table, out_rows_bytes)
 *   groups: list of (stream, dev_in, pinned_out, dev_out, event, {k: (exec, out_nbytes, (leaf offsets...))})
 *   spec: per input tensor (dtype object, nbytes, offset in the block)
 *   table: table[n] = bucket for a batch of n (index 0 unused)
 *   out_rows_bytes: per output leaf, bytes of one query's rows
 * call(tensors) -> bytearray   one query's outputs, leaf after leaf
 * close()
 * stats() -> (batches, requests, lent) */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static CUresult (*p_htod)(CUdeviceptr, const void *, size_t, void *);
static CUresult (*p_dtoh)(void *, CUdeviceptr, size_t, void *);
static CUresult (*p_launch)(void *, void *);
static CUresult (*p_record)(void *, void *);
static CUresult (*p_sync)(void *);
static CUresult (*p_setctx)(void *);

#define MAXK 64
#define MAXOUT 8
#define MAXIN 256

typedef struct {
    void *exec;
    size_t out_nbytes;
    size_t leaf_off[MAXOUT];
} Bucket;

typedef struct {
    int n, rc;
    int rs[MAXK];
} Flight;

typedef struct {
    void *stream, *event;
    CUdeviceptr dev_in, dev_out;
    char *pinned_out;
    Bucket b[MAXK + 1];
    Flight f;      /* the batch in flight on this group */
    int busy;      /* a batch was handed to the completion thread */
    pthread_cond_t cv;
    pthread_t thread;
} Group;

typedef struct {
    char *slot;
    char *result;
    sem_t sem;
    int err;
} Req;

typedef struct {
    PyObject_HEAD
    void *ctx;
    int ngroups, kmax, nout, m, nslots;
    Group *g;
    int table[MAXK + 1];
    size_t block, out_rows[MAXOUT], out_total;
    PyObject *dtypes[MAXIN];
    size_t in_nbytes[MAXIN], in_off[MAXIN];
    Req *reqs;
    int *freelist, nfree_req;
    int *queue, qhead, qlen;
    int *freeg, nfreeg;
    int ninflight, nlent, asleep, closing, room_waiters;
    long long batches, requests, lent;
    int fatal;
    pthread_mutex_t mu;
    pthread_cond_t cv, room;
    pthread_t thread;
    int started, ncomp;
} Driver;

typedef struct { Driver *d; int gi; } CompArg;

static PyObject *s_dtype, *s_nbytes, *s_is_contiguous, *s_is_cuda, *s_data_ptr;

static int load_cuda(void) {
    if (p_htod) return 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) { PyErr_Format(PyExc_OSError, "dlopen libcuda.so.1: %s", dlerror()); return -1; }
    p_htod = dlsym(h, "cuMemcpyHtoDAsync_v2");
    p_dtoh = dlsym(h, "cuMemcpyDtoHAsync_v2");
    p_launch = dlsym(h, "cuGraphLaunch");
    p_record = dlsym(h, "cuEventRecord");
    p_sync = dlsym(h, "cuEventSynchronize");
    p_setctx = dlsym(h, "cuCtxSetCurrent");
    if (!p_htod || !p_dtoh || !p_launch || !p_record || !p_sync || !p_setctx) {
        PyErr_SetString(PyExc_OSError, "libcuda lacks a symbol");
        return -1;
    }
    return 0;
}

/* GIL released. Launch requests rs[0..n) on group gi; returns a CUresult. */
static int start_batch(Driver *d, int gi, int *rs, int n) {
    Group *g = &d->g[gi];
    int rc = 0;
    for (int j = 0; j < n && !rc; j++)
        rc = p_htod(g->dev_in + (CUdeviceptr)j * d->block, d->reqs[rs[j]].slot, d->block, g->stream);
    Bucket *b = &g->b[d->table[n]];
    if (!rc) rc = p_launch(b->exec, g->stream);
    if (!rc) rc = p_dtoh(g->pinned_out, g->dev_out, b->out_nbytes, g->stream);
    if (!rc) rc = p_record(g->event, g->stream);
    return rc;
}

/* GIL released. Wait for group gi's batch and hand each request its rows (no post). */
static int finish_batch(Driver *d, int gi, int *rs, int n, int rc) {
    Group *g = &d->g[gi];
    if (!rc) rc = p_sync(g->event);
    Bucket *b = &g->b[d->table[n]];
    for (int j = 0; j < n; j++) {
        Req *r = &d->reqs[rs[j]];
        r->err = rc;
        if (rc) continue;
        size_t off = 0;
        for (int l = 0; l < d->nout; l++) {
            memcpy(r->result + off, g->pinned_out + b->leaf_off[l] + (size_t)j * d->out_rows[l], d->out_rows[l]);
            off += d->out_rows[l];
        }
    }
    return rc;
}

/* One per group: waits for the group's batch (whichever group finishes first is served
 * first, where one driver waiting for the oldest batch let new requests wait behind it),
 * hands each request its rows, frees the group and posts the requests. */
static void *complete(void *arg) {
    CompArg *a = arg;
    Driver *d = a->d;
    Group *g = &d->g[a->gi];
    p_setctx(d->ctx);
    for (;;) {
        pthread_mutex_lock(&d->mu);
        while (!g->busy && !d->closing) pthread_cond_wait(&g->cv, &d->mu);
        if (!g->busy) { pthread_mutex_unlock(&d->mu); free(a); return NULL; }
        pthread_mutex_unlock(&d->mu);
        Flight *f = &g->f;
        int rc = finish_batch(d, a->gi, f->rs, f->n, f->rc);
        int n = f->n, rs[MAXK];
        memcpy(rs, f->rs, sizeof(int) * (size_t)n);
        pthread_mutex_lock(&d->mu);
        g->busy = 0;
        d->freeg[d->nfreeg++] = a->gi;
        d->ninflight--;
        d->batches++;
        d->requests += n;
        if (rc) d->fatal = rc;
        if (d->asleep && d->qlen) pthread_cond_signal(&d->cv);
        pthread_mutex_unlock(&d->mu);
        for (int j = 0; j < n; j++) sem_post(&d->reqs[rs[j]].sem);
    }
}

/* Starts batches: whenever requests are queued and a group is free, takes up to kmax of
 * them onto that group, launches, and hands the batch to the group's completion thread. */
static void *drive(void *arg) {
    Driver *d = arg;
    p_setctx(d->ctx);
    for (;;) {
        pthread_mutex_lock(&d->mu);
        while (!(d->qlen && d->nfreeg) && !d->closing) {
            d->asleep++;
            pthread_cond_wait(&d->cv, &d->mu);
            d->asleep--;
        }
        if (d->closing) { pthread_mutex_unlock(&d->mu); return NULL; }
        int gi = d->freeg[--d->nfreeg];
        Group *g = &d->g[gi];
        Flight *f = &g->f;
        f->n = d->qlen < d->kmax ? d->qlen : d->kmax;
        for (int j = 0; j < f->n; j++) {
            f->rs[j] = d->queue[d->qhead];
            d->qhead = (d->qhead + 1) % d->nslots;
        }
        d->qlen -= f->n;
        d->ninflight++;
        pthread_mutex_unlock(&d->mu);
        f->rc = start_batch(d, gi, f->rs, f->n);
        pthread_mutex_lock(&d->mu);
        g->busy = 1;
        pthread_cond_signal(&g->cv);
        pthread_mutex_unlock(&d->mu);
    }
}

static void Driver_dealloc(Driver *d) {
    if (d->started) {
        pthread_mutex_lock(&d->mu);
        d->closing = 1;
        pthread_cond_broadcast(&d->cv);
        for (int i = 0; i < d->ncomp; i++) pthread_cond_broadcast(&d->g[i].cv);
        pthread_mutex_unlock(&d->mu);
        Py_BEGIN_ALLOW_THREADS
        pthread_join(d->thread, NULL);
        for (int i = 0; i < d->ncomp; i++) pthread_join(d->g[i].thread, NULL);
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; i < d->m; i++) Py_XDECREF(d->dtypes[i]);
    if (d->reqs) {
        for (int i = 0; i < d->nslots; i++) { sem_destroy(&d->reqs[i].sem); free(d->reqs[i].result); }
        free(d->reqs);
    }
    free(d->g); free(d->freelist); free(d->queue); free(d->freeg);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static size_t as_size(PyObject *o) { return PyLong_AsSize_t(o); }
static void *as_ptr(PyObject *o) { return PyLong_AsVoidPtr(o); }

static int Driver_init(Driver *d, PyObject *args, PyObject *kw) {
    PyObject *ctx, *groups, *spec, *slots, *table, *rows;
    Py_ssize_t block, nslots;
    if (!PyArg_ParseTuple(args, "OOOnOnOO", &ctx, &groups, &spec, &block, &slots, &nslots, &table, &rows)) return -1;
    if (load_cuda() < 0) return -1;
    d->ctx = as_ptr(ctx);
    d->block = (size_t)block;
    d->nslots = (int)nslots;
    d->ngroups = (int)PyList_Size(groups);
    d->m = (int)PyList_Size(spec);
    d->nout = (int)PyList_Size(rows);
    d->kmax = (int)PyList_Size(table) - 1;
    if (d->ngroups < 1 || d->m < 1 || d->m > MAXIN || d->nout < 1 || d->nout > MAXOUT || d->kmax < 1 || d->kmax > MAXK) {
        PyErr_SetString(PyExc_ValueError, "Driver: sizes out of range");
        return -1;
    }
    for (int k = 1; k <= d->kmax; k++) d->table[k] = (int)PyLong_AsLong(PyList_GET_ITEM(table, k));
    d->out_total = 0;
    for (int l = 0; l < d->nout; l++) { d->out_rows[l] = as_size(PyList_GET_ITEM(rows, l)); d->out_total += d->out_rows[l]; }
    for (int i = 0; i < d->m; i++) {
        PyObject *t = PyList_GET_ITEM(spec, i);
        d->dtypes[i] = PyTuple_GET_ITEM(t, 0);
        Py_INCREF(d->dtypes[i]);
        d->in_nbytes[i] = as_size(PyTuple_GET_ITEM(t, 1));
        d->in_off[i] = as_size(PyTuple_GET_ITEM(t, 2));
    }
    d->g = calloc((size_t)d->ngroups, sizeof(Group));
    d->freeg = calloc((size_t)d->ngroups, sizeof(int));
    for (int gi = 0; gi < d->ngroups; gi++) {
        PyObject *t = PyList_GET_ITEM(groups, gi);
        Group *g = &d->g[gi];
        g->stream = as_ptr(PyTuple_GET_ITEM(t, 0));
        g->dev_in = (CUdeviceptr)PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 1));
        g->pinned_out = as_ptr(PyTuple_GET_ITEM(t, 2));
        g->dev_out = (CUdeviceptr)PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 3));
        g->event = as_ptr(PyTuple_GET_ITEM(t, 4));
        PyObject *bk = PyTuple_GET_ITEM(t, 5);
        PyObject *key, *val;
        Py_ssize_t pos = 0;
        while (PyDict_Next(bk, &pos, &key, &val)) {
            long k = PyLong_AsLong(key);
            if (k < 1 || k > MAXK) { PyErr_SetString(PyExc_ValueError, "bucket out of range"); return -1; }
            Bucket *b = &g->b[k];
            b->exec = as_ptr(PyTuple_GET_ITEM(val, 0));
            b->out_nbytes = as_size(PyTuple_GET_ITEM(val, 1));
            PyObject *offs = PyTuple_GET_ITEM(val, 2);
            for (int l = 0; l < d->nout; l++) b->leaf_off[l] = as_size(PyTuple_GET_ITEM(offs, l));
        }
        d->freeg[d->nfreeg++] = gi;
    }
    char *base = as_ptr(slots);
    if (PyErr_Occurred()) return -1;
    d->reqs = calloc((size_t)d->nslots, sizeof(Req));
    d->freelist = calloc((size_t)d->nslots, sizeof(int));
    d->queue = calloc((size_t)d->nslots, sizeof(int));
    for (int i = 0; i < d->nslots; i++) {
        d->reqs[i].slot = base + (size_t)i * d->block;
        d->reqs[i].result = malloc(d->out_total);
        sem_init(&d->reqs[i].sem, 0, 0);
        d->freelist[d->nfree_req++] = i;
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    pthread_cond_init(&d->room, NULL);
    for (int gi = 0; gi < d->ngroups; gi++) {
        pthread_cond_init(&d->g[gi].cv, NULL);
        CompArg *a = malloc(sizeof(CompArg));
        a->d = d;
        a->gi = gi;
        if (pthread_create(&d->g[gi].thread, NULL, complete, a) != 0) { PyErr_SetFromErrno(PyExc_OSError); return -1; }
        d->ncomp++;
    }
    if (pthread_create(&d->thread, NULL, drive, d) != 0) { PyErr_SetFromErrno(PyExc_OSError); return -1; }
    d->started = 1;
    return 0;
}

/* GIL held: the source address of each tensor, checked against the example. */
static int prepare(Driver *d, PyObject *ts, char **src) {
    Py_ssize_t m = PySequence_Fast_GET_SIZE(ts);
    if (m != d->m) { PyErr_Format(PyExc_ValueError, "%zd tensors where the example has %d", m, d->m); return -1; }
    for (int i = 0; i < d->m; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(ts, i);
        PyObject *dt = PyObject_GetAttr(t, s_dtype);
        if (!dt) return -1;
        int same = dt == d->dtypes[i];
        Py_DECREF(dt);
        PyObject *nb = same ? PyObject_GetAttr(t, s_nbytes) : NULL;
        size_t n = nb ? PyLong_AsSize_t(nb) : 0;
        Py_XDECREF(nb);
        if (!same || n != d->in_nbytes[i]) { PyErr_Format(PyExc_ValueError, "tensor %d is not like the example's", i); return -1; }
        PyObject *cu = PyObject_GetAttr(t, s_is_cuda);
        if (!cu) return -1;
        int on_gpu = PyObject_IsTrue(cu);
        Py_DECREF(cu);
        PyObject *co = PyObject_CallMethodNoArgs(t, s_is_contiguous);
        if (!co) return -1;
        int contiguous = PyObject_IsTrue(co);
        Py_DECREF(co);
        if (on_gpu || !contiguous) { PyErr_Format(PyExc_ValueError, "tensor %d is on a GPU or not contiguous", i); return -1; }
        PyObject *p = PyObject_CallMethodNoArgs(t, s_data_ptr);
        if (!p) return -1;
        src[i] = PyLong_AsVoidPtr(p);
        Py_DECREF(p);
    }
    return 0;
}

static PyObject *Driver_call(Driver *d, PyObject *tensors) {
    PyObject *ts = PySequence_Fast(tensors, "tensors must be a sequence");
    if (!ts) return NULL;
    char *src[MAXIN];
    int bad = prepare(d, ts, src);
    Py_DECREF(ts);
    if (bad) return NULL;
    int ri = -1, gi = -1, rc = 0, closed = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&d->mu);
    while (!d->nfree_req && !d->closing) { d->room_waiters++; pthread_cond_wait(&d->room, &d->mu); d->room_waiters--; }
    if (d->closing) closed = 1;
    else {
        ri = d->freelist[--d->nfree_req];
        if (!d->qlen && !d->ninflight && d->nfreeg) { gi = d->freeg[--d->nfreeg]; d->nlent++; }
    }
    pthread_mutex_unlock(&d->mu);
    if (!closed) {
        Req *r = &d->reqs[ri];
        for (int i = 0; i < d->m; i++) memcpy(r->slot + d->in_off[i], src[i], d->in_nbytes[i]);
        if (gi >= 0) {
            p_setctx(d->ctx);
            int one[1] = {ri};
            rc = start_batch(d, gi, one, 1);
            rc = finish_batch(d, gi, one, 1, rc);
            pthread_mutex_lock(&d->mu);
            d->freeg[d->nfreeg++] = gi;
            d->nlent--;
            d->lent++;
            d->batches++;
            d->requests++;
            if (d->qlen && d->asleep) pthread_cond_signal(&d->cv);
            pthread_mutex_unlock(&d->mu);
        } else {
            pthread_mutex_lock(&d->mu);
            d->queue[(d->qhead + d->qlen) % d->nslots] = ri;
            d->qlen++;
            if (d->asleep) pthread_cond_signal(&d->cv);
            pthread_mutex_unlock(&d->mu);
            while (sem_wait(&r->sem) != 0 && errno == EINTR) {
            }
            rc = r->err;
        }
    }
    Py_END_ALLOW_THREADS
    if (closed) { PyErr_SetString(PyExc_RuntimeError, "closed"); return NULL; }
    PyObject *out = rc ? NULL : PyByteArray_FromStringAndSize(d->reqs[ri].result, (Py_ssize_t)d->out_total);
    pthread_mutex_lock(&d->mu);
    d->freelist[d->nfree_req++] = ri;
    if (d->room_waiters) pthread_cond_signal(&d->room);
    pthread_mutex_unlock(&d->mu);
    if (rc) return PyErr_Format(PyExc_RuntimeError, "CUDA error %d", rc);
    return out;
}

static PyObject *Driver_stats(Driver *d, PyObject *unused) {
    return Py_BuildValue("(LLLi)", d->batches, d->requests, d->lent, d->fatal);
}

static PyMethodDef Driver_methods[] = {
    {"call", (PyCFunction)Driver_call, METH_O, "call(tensors) -> bytearray"},
    {"stats", (PyCFunction)Driver_stats, METH_NOARGS, "(batches, requests, lent, fatal)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DriverType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_cdriver.Driver",
    .tp_basicsize = sizeof(Driver),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Driver_init,
    .tp_dealloc = (destructor)Driver_dealloc,
    .tp_methods = Driver_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cdriver", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__cdriver(void) {
    if (PyType_Ready(&DriverType) < 0) return NULL;
    s_dtype = PyUnicode_InternFromString("dtype");
    s_nbytes = PyUnicode_InternFromString("nbytes");
    s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    s_is_cuda = PyUnicode_InternFromString("is_cuda");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&DriverType);
    PyModule_AddObject(m, "Driver", (PyObject *)&DriverType);
    return m;
}
