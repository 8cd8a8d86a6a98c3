/*
 * _fastpath.c — the two calls of a training loop's hottest path, without
 * ctypes: kolo.torch's in-place allreduce of a host tensor
 * (allreduce_async_, DistributedOptimizer's hooks) enqueues through
 * fast_allreduce() and every synchronize waits through fast_wait().
 *
 * DESIGN
 *
 * A ctypes call converts each argument through its argtypes, builds a
 * ctypes object for the handle, and releases and takes back the GIL: about
 * a microsecond per call, as much as the runtime's own work for a small
 * tensor. This module is a plain CPython extension (no torch headers, no
 * link to libkolo) whose functions take Python ints and call libkolo
 * directly.
 *
 * It calls the library the bindings already loaded: kolo/_lib.py hands
 * over the addresses of kolo_allreduce_async_opts and kolo_wait from its
 * ctypes handle (setup()), so KOLO_LIBRARY, the installed libdir and the
 * loader's path choose the library exactly as they do for the rest of the
 * bindings, and this module cannot call another copy of libkolo.
 *
 * It is optional: kolo/_lib.py looks for _fastpath.so beside the libkolo
 * it loaded (a build tree's .libs) and then in the package (where `make
 * install` puts it); without it, or where it fails to load, the bindings
 * make the same calls through ctypes, with the same results.
 *
 * The enqueue keeps the GIL (it does not block: the runtime only queues
 * the request and wakes its thread, and it never calls into Python); the
 * wait releases it, as ctypes does, so other Python threads run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

/* The prototypes of kolo.h, with the pointer types that do not matter here
 * left as void: the addresses come from the loaded library. */
typedef int (*enqueue_fn)(const char *name, const void *input, void *output,
                          int64_t count, int dtype, const void *opts,
                          int64_t *handle);
typedef int (*wait_fn)(int64_t handle);

static enqueue_fn fast_enqueue;
static wait_fn fast_wait_fn;

/* setup(address of kolo_allreduce_async_opts, address of kolo_wait) */
static PyObject *fast_setup(PyObject *self, PyObject *const *args,
                            Py_ssize_t nargs)
{
    void *enq, *wait;
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "setup() takes 2 addresses");
        return NULL;
    }
    enq = PyLong_AsVoidPtr(args[0]);
    if (enq == NULL && PyErr_Occurred())
        return NULL;
    wait = PyLong_AsVoidPtr(args[1]);
    if (wait == NULL && PyErr_Occurred())
        return NULL;
    if (enq == NULL || wait == NULL) {
        PyErr_SetString(PyExc_ValueError, "setup(): a null function address");
        return NULL;
    }
    /* (object to function pointer: the addresses are libkolo's functions) */
    fast_enqueue = (enqueue_fn)(uintptr_t)enq;
    fast_wait_fn = (wait_fn)(uintptr_t)wait;
    Py_RETURN_NONE;
}

/* allreduce(name: bytes, address: int, count: int, dtype: int,
 *           opts: int address of a kolo_opts_t) -> int
 * An in-place allreduce (input = output = address). Returns the handle
 * (> 0) or the negative KOLO_ERR_* status; the caller reads
 * kolo_last_error() for the message. */
static PyObject *fast_allreduce(PyObject *self, PyObject *const *args,
                                Py_ssize_t nargs)
{
    const char *name;
    void *address, *opts;
    long long count;
    long dtype;
    int64_t handle = 0;
    int rc;
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "allreduce() takes 5 arguments");
        return NULL;
    }
    if (fast_enqueue == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "allreduce() before setup()");
        return NULL;
    }
    name = PyBytes_AsString(args[0]);
    if (name == NULL)
        return NULL;
    address = PyLong_AsVoidPtr(args[1]);
    count = PyLong_AsLongLong(args[2]);
    dtype = PyLong_AsLong(args[3]);
    opts = PyLong_AsVoidPtr(args[4]);
    if (PyErr_Occurred())
        return NULL;
    rc = fast_enqueue(name, address, address, (int64_t)count, (int)dtype,
                      opts, &handle);
    return PyLong_FromLongLong(rc == 0 ? (long long)handle : (long long)rc);
}

/* wait(handle: int) -> int status, the GIL released meanwhile */
static PyObject *fast_wait(PyObject *self, PyObject *arg)
{
    long long handle = PyLong_AsLongLong(arg);
    int rc;
    (void)self;
    if (handle == -1 && PyErr_Occurred())
        return NULL;
    if (fast_wait_fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "wait() before setup()");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = fast_wait_fn((int64_t)handle);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* METH_FASTCALL functions are stored as PyCFunction; the cast goes through
 * a function type without parameters, which -Wcast-function-type allows. */
#define FASTCALL(fn) ((PyCFunction)(void (*)(void))(fn))

static PyMethodDef fast_methods[] = {
    {"setup", FASTCALL(fast_setup), METH_FASTCALL,
     "setup(enqueue_address, wait_address): the libkolo functions to call"},
    {"allreduce", FASTCALL(fast_allreduce), METH_FASTCALL,
     "allreduce(name, address, count, dtype, opts_address) -> handle or "
     "negative status: kolo_allreduce_async_opts in place"},
    {"wait", fast_wait, METH_O,
     "wait(handle) -> status: kolo_wait, the GIL released"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kolo._fastpath",
    .m_doc = "kolo.torch's hottest calls into libkolo, without ctypes",
    .m_size = -1,
    .m_methods = fast_methods,
};

PyMODINIT_FUNC PyInit__fastpath(void);

PyMODINIT_FUNC PyInit__fastpath(void)
{
    return PyModule_Create(&fast_module);
}
