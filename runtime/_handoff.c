/* The batcher's client hand-off in C (issue 24): a caller copies its query into its
 * staging slot AND sleeps until its result is posted in ONE release of the interpreter
 * lock, where Python needs three (the copy, which a torch op does without the GIL, then
 * getting the GIL back among many client threads, then the wait). On the H100 each GIL
 * hand-off among 32 client threads is what bounded the batched path (docs/runtime.md).
 *
 * Slots(n): n staging slots, each with a "staged" flag and a semaphore.
 *   prepare(tensors, spec) -> (addresses, sizes)   GIL held: checks each tensor against the
 *        example (spec: per tensor (dtype, nbytes, offset)): same dtype object, same number
 *        of bytes, contiguous, not on a GPU; raises ValueError naming the first that is not.
 *   copy_wait(slot, base, addresses, sizes, offsets, timeout_s) -> bool
 *        GIL released once: memcpy each tensor to base + offset, mark the slot staged, wait
 *        for post(slot) up to timeout_s (False: timed out).
 *   copy(slot, base, addresses, sizes, offsets)    the copy and the mark, without waiting.
 *   wait_staged(slots)   until every slot in the list is staged (GIL released only if one
 *        is not yet: a caller between its mark and ... is microseconds away).
 *   post(slot)           wake the caller waiting on slot.
 *   reset(slot)          clear the mark and any stale post (before a slot is reused).
 * Built where a C compiler is at hand (setup.py, optional); runtime/_batched.py falls back
 * to staging in the driver with torch._foreach_copy_ when it is not. POSIX only. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <semaphore.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    sem_t *sems;
    atomic_int *staged;
} SlotsObject;

static PyObject *s_dtype, *s_nbytes, *s_is_contiguous, *s_is_cuda, *s_data_ptr;

static void Slots_dealloc(SlotsObject *self) {
    if (self->sems) {
        for (Py_ssize_t i = 0; i < self->n; i++) sem_destroy(&self->sems[i]);
        PyMem_RawFree(self->sems);
    }
    PyMem_RawFree(self->staged);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Slots_init(SlotsObject *self, PyObject *args, PyObject *kw) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return -1;
    if (n < 1 || n > 1 << 20) {
        PyErr_SetString(PyExc_ValueError, "Slots(n): n must be between 1 and 2**20");
        return -1;
    }
    self->sems = PyMem_RawCalloc((size_t)n, sizeof(sem_t));
    self->staged = PyMem_RawCalloc((size_t)n, sizeof(atomic_int));
    if (!self->sems || !self->staged) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (sem_init(&self->sems[i], 0, 0) != 0) {
            self->n = i;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        atomic_init(&self->staged[i], 0);
    }
    self->n = n;
    return 0;
}

static int check_slot(SlotsObject *self, Py_ssize_t slot) {
    if (slot < 0 || slot >= self->n) {
        PyErr_Format(PyExc_IndexError, "slot %zd out of range (%zd slots)", slot, self->n);
        return -1;
    }
    return 0;
}

/* prepare(tensors, spec) -> (tuple of addresses, tuple of sizes) */
static PyObject *Slots_prepare(SlotsObject *self, PyObject *args) {
    PyObject *tensors, *spec;
    if (!PyArg_ParseTuple(args, "OO", &tensors, &spec)) return NULL;
    PyObject *ts = PySequence_Fast(tensors, "tensors must be a sequence");
    if (!ts) return NULL;
    PyObject *sp = PySequence_Fast(spec, "spec must be a sequence");
    if (!sp) { Py_DECREF(ts); return NULL; }
    Py_ssize_t m = PySequence_Fast_GET_SIZE(ts);
    PyObject *addrs = NULL, *out = NULL;
    if (m != PySequence_Fast_GET_SIZE(sp)) {
        PyErr_Format(PyExc_ValueError, "a batched query has %zd tensors where the example has %zd",
                     m, PySequence_Fast_GET_SIZE(sp));
        goto done;
    }
    addrs = PyTuple_New(m);
    if (!addrs) goto done;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(ts, i);
        PyObject *want = PySequence_Fast_GET_ITEM(sp, i);  /* (dtype, nbytes, offset) */
        if (!PyTuple_Check(want) || PyTuple_GET_SIZE(want) != 3) {
            PyErr_SetString(PyExc_TypeError, "spec items must be (dtype, nbytes, offset)");
            goto done;
        }
        PyObject *dt = PyObject_GetAttr(t, s_dtype);
        if (!dt) goto done;
        int same = dt == PyTuple_GET_ITEM(want, 0);
        Py_DECREF(dt);
        PyObject *nb = same ? PyObject_GetAttr(t, s_nbytes) : NULL;
        if (same && !nb) goto done;
        int size_ok = nb && PyObject_RichCompareBool(nb, PyTuple_GET_ITEM(want, 1), Py_EQ) == 1;
        Py_XDECREF(nb);
        if (!same || !size_ok) {
            PyErr_Format(PyExc_ValueError, "tensor %zd of a batched query is not like the example's "
                         "(%R, %R bytes)", i, PyTuple_GET_ITEM(want, 0), PyTuple_GET_ITEM(want, 1));
            goto done;
        }
        PyObject *cu = PyObject_GetAttr(t, s_is_cuda);
        if (!cu) goto done;
        int on_gpu = PyObject_IsTrue(cu);
        Py_DECREF(cu);
        PyObject *co = on_gpu ? NULL : PyObject_CallMethodNoArgs(t, s_is_contiguous);
        if (!on_gpu && !co) goto done;
        int contiguous = co && PyObject_IsTrue(co) == 1;
        Py_XDECREF(co);
        if (on_gpu || !contiguous) {
            PyErr_Format(PyExc_ValueError, "tensor %zd of a batched query is %s", i,
                         on_gpu ? "on a GPU (batched queries take host tensors)" : "not contiguous");
            goto done;
        }
        PyObject *p = PyObject_CallMethodNoArgs(t, s_data_ptr);
        if (!p) goto done;
        PyTuple_SET_ITEM(addrs, i, p);
    }
    out = addrs;
    addrs = NULL;
done:
    Py_XDECREF(addrs);
    Py_DECREF(ts);
    Py_DECREF(sp);
    return out;
}

/* The copies of one query: addresses, sizes and offsets as C arrays (GIL held). */
typedef struct { Py_ssize_t m; char **src; size_t *size; size_t *off; } Copies;

static void copies_free(Copies *c) { PyMem_Free(c->src); PyMem_Free(c->size); PyMem_Free(c->off); }

static int copies_from(Copies *c, PyObject *addrs, PyObject *sizes, PyObject *offs) {
    memset(c, 0, sizeof(*c));
    if (!PyTuple_Check(addrs) || !PyTuple_Check(sizes) || !PyTuple_Check(offs)
        || PyTuple_GET_SIZE(sizes) != PyTuple_GET_SIZE(addrs) || PyTuple_GET_SIZE(offs) != PyTuple_GET_SIZE(addrs)) {
        PyErr_SetString(PyExc_TypeError, "addresses, sizes and offsets must be tuples of one length");
        return -1;
    }
    c->m = PyTuple_GET_SIZE(addrs);
    c->src = PyMem_Malloc(sizeof(char *) * (size_t)(c->m + 1));
    c->size = PyMem_Malloc(sizeof(size_t) * (size_t)(c->m + 1));
    c->off = PyMem_Malloc(sizeof(size_t) * (size_t)(c->m + 1));
    if (!c->src || !c->size || !c->off) { copies_free(c); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < c->m; i++) {
        c->src[i] = (char *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(addrs, i));
        c->size[i] = PyLong_AsSize_t(PyTuple_GET_ITEM(sizes, i));
        c->off[i] = PyLong_AsSize_t(PyTuple_GET_ITEM(offs, i));
        if (PyErr_Occurred()) { copies_free(c); return -1; }
    }
    return 0;
}

static void copies_run(const Copies *c, char *base) {
    for (Py_ssize_t i = 0; i < c->m; i++) memcpy(base + c->off[i], c->src[i], c->size[i]);
}

static PyObject *Slots_copy_impl(SlotsObject *self, PyObject *args, int wait) {
    Py_ssize_t slot;
    PyObject *base_o, *addrs, *sizes, *offs;
    double timeout = 0.0;
    if (wait) {
        if (!PyArg_ParseTuple(args, "nOOOOd", &slot, &base_o, &addrs, &sizes, &offs, &timeout)) return NULL;
    } else if (!PyArg_ParseTuple(args, "nOOOO", &slot, &base_o, &addrs, &sizes, &offs)) {
        return NULL;
    }
    if (check_slot(self, slot) < 0) return NULL;
    char *base = (char *)PyLong_AsVoidPtr(base_o);
    if (PyErr_Occurred()) return NULL;
    Copies c;
    if (copies_from(&c, addrs, sizes, offs) < 0) return NULL;
    int got = 1;
    Py_BEGIN_ALLOW_THREADS
    copies_run(&c, base);
    atomic_store_explicit(&self->staged[slot], 1, memory_order_release);
    if (wait) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double s = (double)ts.tv_sec + ts.tv_nsec / 1e9 + timeout;
        ts.tv_sec = (time_t)s;
        ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
        int rc;
        while ((rc = sem_timedwait(&self->sems[slot], &ts)) != 0 && errno == EINTR) {
        }
        got = rc == 0;
    }
    Py_END_ALLOW_THREADS
    copies_free(&c);
    return PyBool_FromLong(got);
}

static PyObject *Slots_copy_wait(SlotsObject *self, PyObject *args) { return Slots_copy_impl(self, args, 1); }
static PyObject *Slots_copy(SlotsObject *self, PyObject *args) { return Slots_copy_impl(self, args, 0); }

static PyObject *Slots_wait_staged(SlotsObject *self, PyObject *slots) {
    PyObject *seq = PySequence_Fast(slots, "slots must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t *idx = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(k + 1));
    if (!idx) { Py_DECREF(seq); return PyErr_NoMemory(); }
    int pending = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        idx[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if ((idx[i] == -1 && PyErr_Occurred()) || check_slot(self, idx[i]) < 0) {
            PyMem_Free(idx);
            Py_DECREF(seq);
            return NULL;
        }
        if (!atomic_load_explicit(&self->staged[idx[i]], memory_order_acquire)) pending = 1;
    }
    if (pending) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < k; i++)
            while (!atomic_load_explicit(&self->staged[idx[i]], memory_order_acquire)) sched_yield();
        Py_END_ALLOW_THREADS
    }
    PyMem_Free(idx);
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static PyObject *Slots_post(SlotsObject *self, PyObject *arg) {
    Py_ssize_t slot = PyLong_AsSsize_t(arg);
    if ((slot == -1 && PyErr_Occurred()) || check_slot(self, slot) < 0) return NULL;
    if (sem_post(&self->sems[slot]) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *Slots_reset(SlotsObject *self, PyObject *arg) {
    Py_ssize_t slot = PyLong_AsSsize_t(arg);
    if ((slot == -1 && PyErr_Occurred()) || check_slot(self, slot) < 0) return NULL;
    atomic_store_explicit(&self->staged[slot], 0, memory_order_release);
    while (sem_trywait(&self->sems[slot]) == 0) {
    }
    Py_RETURN_NONE;
}

static PyMethodDef Slots_methods[] = {
    {"prepare", (PyCFunction)Slots_prepare, METH_VARARGS, "prepare(tensors, spec) -> addresses"},
    {"copy_wait", (PyCFunction)Slots_copy_wait, METH_VARARGS,
     "copy_wait(slot, base, addresses, sizes, offsets, timeout_s) -> bool"},
    {"copy", (PyCFunction)Slots_copy, METH_VARARGS, "copy(slot, base, addresses, sizes, offsets)"},
    {"wait_staged", (PyCFunction)Slots_wait_staged, METH_O, "wait_staged(slots)"},
    {"post", (PyCFunction)Slots_post, METH_O, "post(slot)"},
    {"reset", (PyCFunction)Slots_reset, METH_O, "reset(slot)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SlotsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "recsys_doctor.runtime._handoff.Slots",
    .tp_basicsize = sizeof(SlotsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Staging slots with a staged flag and a semaphore each (see the module source).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Slots_init,
    .tp_dealloc = (destructor)Slots_dealloc,
    .tp_methods = Slots_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_handoff", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__handoff(void) {
    if (PyType_Ready(&SlotsType) < 0) return NULL;
    s_dtype = PyUnicode_InternFromString("dtype");
    s_nbytes = PyUnicode_InternFromString("nbytes");
    s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    s_is_cuda = PyUnicode_InternFromString("is_cuda");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    if (!s_dtype || !s_nbytes || !s_is_contiguous || !s_is_cuda || !s_data_ptr) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&SlotsType);
    if (PyModule_AddObject(m, "Slots", (PyObject *)&SlotsType) < 0) {
        Py_DECREF(&SlotsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
