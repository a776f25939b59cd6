/* The finalize step's per-request loops in C (rankwatch.pipeline.stream._labels).

Layout: one function, ``finalize``, which takes the finalized requests' records, item counts, feedback and
times (columns of pipeline/stream/join.py's PendingRequests) and returns their score parts, the flat
``(item index, grade)`` label pairs and the three feedback counters, as PendingRequests.finalize_lists makes them.

Why: finalizing decoded each request's item ids (a str split) to find the positions its feedback names, a loop
in Python per feedback entry; it was about a quarter of the join's process in a replay, its critical path.
Here the ids are compared in place, as the UTF-8 bytes they are stored as.

Exactness: the same rules as join.py's Python loop, which stays as the fallback and is this function's oracle in
tests/pipeline/stream/test_labels.py: feedback outside ``[request ts, request ts + attribution window]`` is
detached if it was counted on arrival, else late; inside, it is accepted now if it was not counted yet, and it
labels every position whose item id equals its item id.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    PyObject *at;
    PyObject *grade;
    long long accepted, late, detached;
} Labels;

static int append_long(PyObject *list, long long v) {
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL) return -1;
    int r = PyList_Append(list, o);
    Py_DECREF(o);
    return r;
}

/* The labels of one request's feedback ``fb`` (a tuple of (item id, grade, ts, counted)); its ``n`` item ids
   are ``ids`` (``size`` bytes, joined by NUL) and its items start at flat index ``base``. */
static int label_request(Labels *out, PyObject *fb, const char *ids, Py_ssize_t size, Py_ssize_t n,
                         long long rts, long long att, Py_ssize_t base) {
    if (!PyTuple_Check(fb)) {
        PyErr_SetString(PyExc_TypeError, "a request's feedback is a tuple");
        return -1;
    }
    for (Py_ssize_t e = 0; e < PyTuple_GET_SIZE(fb); e++) {
        PyObject *entry = PyTuple_GET_ITEM(fb, e);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 4) {
            PyErr_SetString(PyExc_TypeError, "a feedback entry is (item_id, grade, ts_ms, counted)");
            return -1;
        }
        long long fts = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 2));
        if (fts == -1 && PyErr_Occurred()) return -1;
        int counted = PyObject_IsTrue(PyTuple_GET_ITEM(entry, 3));
        if (counted < 0) return -1;
        if (!(rts <= fts && fts <= rts + att)) {
            if (counted) out->detached++;
            else out->late++;
            continue;
        }
        if (!counted) out->accepted++;
        Py_ssize_t item_len;
        const char *item = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(entry, 0), &item_len);
        if (item == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
            PyErr_Clear(); /* a lone surrogate: equal to no stored id (they are UTF-8), as in Python */
            continue;
        }
        PyObject *grade = PyTuple_GET_ITEM(entry, 1);
        const char *p = ids, *end = ids + size;
        for (Py_ssize_t k = 0; k < n; k++) { /* each id in turn: every position showing the item is labelled */
            const char *stop = memchr(p, '\0', (size_t)(end - p));
            if (stop == NULL) stop = end;
            if (stop - p == item_len && memcmp(p, item, (size_t)item_len) == 0) {
                if (append_long(out->at, base + k) < 0 || PyList_Append(out->grade, grade) < 0) return -1;
            }
            p = stop + 1;
            if (p > end) break;
        }
    }
    return 0;
}

PyDoc_STRVAR(finalize_doc,
"finalize(records, lengths, feedback, ts_ms, attribution_window_ms)\n--\n\n"
"For finalized requests (their records, item counts, feedback tuples or None, and times, in order): the score\n"
"part of each record, the flat label positions and grades, and the feedback accepted, late and detached now,\n"
"as ``(score_parts, label_at, label_grade, accepted, late, detached)``.");

static PyObject *finalize(PyObject *self, PyObject *args) {
    PyObject *records, *lengths, *feedback, *ts;
    long long att;
    if (!PyArg_ParseTuple(args, "OOOOL", &records, &lengths, &feedback, &ts, &att)) return NULL;
    PyObject *recs = PySequence_Fast(records, "records is a sequence");
    PyObject *lens = recs ? PySequence_Fast(lengths, "lengths is a sequence") : NULL;
    PyObject *fbs = lens ? PySequence_Fast(feedback, "feedback is a sequence") : NULL;
    PyObject *times = fbs ? PySequence_Fast(ts, "ts_ms is a sequence") : NULL;
    PyObject *parts = NULL, *out = NULL;
    Labels labels = {PyList_New(0), PyList_New(0), 0, 0, 0};
    if (times == NULL || labels.at == NULL || labels.grade == NULL) goto done;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(recs);
    if (PySequence_Fast_GET_SIZE(lens) != m || PySequence_Fast_GET_SIZE(fbs) != m ||
        PySequence_Fast_GET_SIZE(times) != m) {
        PyErr_SetString(PyExc_ValueError, "records, lengths, feedback and ts_ms differ in length");
        goto done;
    }
    if ((parts = PyList_New(m)) == NULL) goto done;
    Py_ssize_t base = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(recs, i);
        Py_ssize_t n = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(lens, i));
        if (n == -1 && PyErr_Occurred()) goto done;
        if (!PyBytes_Check(rec) || n < 0 || PyBytes_GET_SIZE(rec) / 8 < n) {
            PyErr_SetString(PyExc_ValueError, "a record holds fewer scores than its item count");
            goto done;
        }
        const char *data = PyBytes_AS_STRING(rec);
        PyObject *part = PyBytes_FromStringAndSize(data, 8 * n);
        if (part == NULL) goto done;
        PyList_SET_ITEM(parts, i, part);
        PyObject *fb = PySequence_Fast_GET_ITEM(fbs, i);
        if (fb != Py_None) {
            long long rts = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(times, i));
            if (rts == -1 && PyErr_Occurred()) goto done;
            if (label_request(&labels, fb, data + 8 * n, PyBytes_GET_SIZE(rec) - 8 * n, n, rts, att, base) < 0)
                goto done;
        }
        base += n;
    }
    out = Py_BuildValue("(OOOLLL)", parts, labels.at, labels.grade, labels.accepted, labels.late, labels.detached);
done:
    Py_XDECREF(recs);
    Py_XDECREF(lens);
    Py_XDECREF(fbs);
    Py_XDECREF(times);
    Py_XDECREF(parts);
    Py_XDECREF(labels.at);
    Py_XDECREF(labels.grade);
    return out;
}

static PyMethodDef methods[] = {
    {"finalize", finalize, METH_VARARGS, finalize_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_labels", "The finalize step's per-request loops in C (see the source's header).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__labels(void) { return PyModule_Create(&module); }
