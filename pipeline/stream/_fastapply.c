/* The batch path's common event applied in C (rankwatch.pipeline.stream._fastapply).

Layout: ``run``, which applies a batch's rows in order from record ``i`` until it meets an event it leaves to
Python (then it returns where it stopped), with the state it reads and writes: the pending requests' columns
and index, the dedupe set's newest group, the watermark's inline path and the outcome counters.

Why: the apply loop (pipeline/stream/batch.py ``_apply``) was half of the join's process in a replay, its critical
path, at about 1.5 us an event of dict, set and list operations in the interpreter's loop.

Exactness: this is ``_apply``'s loop for the events it takes, statement for statement, and it takes an event
only if every condition it reads says so *before* it changes anything: an event ``_apply`` would hand to the
per-record path, one that moves the watermark a step, one whose id starts a new group of the dedupe set, an
impression of a request with early feedback waiting or of labels without a cached combo, and feedback that
would wait for its request are left (``run`` returns their index; the caller applies them with ``_apply`` and
calls again). The watermark's value and the partition's largest time are written back when ``run`` returns.
pipeline/stream/batch.py keeps ``_apply`` as the fallback; the batch tests run both (tests/pipeline/stream/).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The state ``run`` reads once per call from its first argument, a tuple (see batch.py ``_native_state``). */
enum {
    S_KINDS, S_IMP, S_FB, S_INDEX, S_MAX_PENDING, S_SEEN, S_SEEN_CAP, S_MAX_TS, S_WMK, S_DISORDER, S_STEP, S_ATTR,
    S_FINALIZED, S_WIRE_COMBO, S_FREE, S_RID, S_TS, S_COMBO, S_USER, S_RECORD, S_COUNT, S_POSITIONS, S_FEEDBACK,
    S_BUCKETS, S_BUCKET_ATTR, S_BUCKET_STEP, S_EARLY, S_FILE, S_N
};

typedef struct {
    long long dup, late, accepted, orphan;
} Counts;

static inline int as_ll(PyObject *o, long long *out) {
    *out = PyLong_AsLongLong(o);
    return !(*out == -1 && PyErr_Occurred());
}

/* A pending column is a list, or an array (PendingRequests keeps its ints in ``array`` s: the conversion and its
   range check are the array's own, as in Python). */
static int set_slot(PyObject *column, Py_ssize_t slot, PyObject *value) {
    if (PyList_CheckExact(column)) {
        Py_INCREF(value);
        return PyList_SetItem(column, slot, value); /* steals the reference */
    }
    return PySequence_SetItem(column, slot, value);
}

static int append_slot(PyObject *column, PyObject *append, PyObject *value) {
    if (PyList_CheckExact(column)) return PyList_Append(column, value);
    PyObject *res = PyObject_CallOneArg(append, value);
    Py_XDECREF(res);
    return res == NULL ? -1 : 0;
}

PyDoc_STRVAR(run_doc,
"run(state, i, end, ip, fp, skip, ikey, ws, tail, tail_tag, early_count)\n--\n\n"
"Apply records i.. of a batch (``ip``/``fp``: the next impression / feedback row) until ``end`` or an event\n"
"left to Python. Returns (i, ip, fp, skip, added_items, impressions duplicate/late/accepted, feedback\n"
"duplicate/late/accepted/orphan).");

static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != S_N) {
        PyErr_SetString(PyExc_TypeError, "run(state, i, end, ip, fp, skip, ikey, ws, tail, tail_tag, early_count)");
        return NULL;
    }
    PyObject *st = args[0];
#define S(k) PyTuple_GET_ITEM(st, k)
    PyObject *kinds = S(S_KINDS), *imp = S(S_IMP), *fb = S(S_FB), *index = S(S_INDEX), *seen = S(S_SEEN);
    PyObject *max_ts = S(S_MAX_TS), *wmk = S(S_WMK), *finalized = S(S_FINALIZED), *wire_combo = S(S_WIRE_COMBO);
    PyObject *free_slots = S(S_FREE), *buckets = S(S_BUCKETS), *early = S(S_EARLY), *file_slot = S(S_FILE);
    PyObject *p_rid = S(S_RID), *p_ts = S(S_TS), *p_combo = S(S_COMBO), *p_user = S(S_USER);
    PyObject *p_record = S(S_RECORD), *p_count = S(S_COUNT), *p_positions = S(S_POSITIONS), *p_fb = S(S_FEEDBACK);
    Py_ssize_t i, end, ip, fp, max_pending, cap;
    long long skip, disorder, step, attr, b_attr, b_step, ws = 0, tail_tag = 0, early_count;
    PyObject *ikey = args[6], *tail = args[8];
    int has_ws = args[7] != Py_None, has_tail = args[9] != Py_None;
    if ((i = PyLong_AsSsize_t(args[1])) < 0 || (end = PyLong_AsSsize_t(args[2])) < 0 ||
        (ip = PyLong_AsSsize_t(args[3])) < 0 || (fp = PyLong_AsSsize_t(args[4])) < 0 ||
        (max_pending = PyLong_AsSsize_t(S(S_MAX_PENDING))) < 0 || (cap = PyLong_AsSsize_t(S(S_SEEN_CAP))) < 0 ||
        !as_ll(args[5], &skip) || !as_ll(S(S_DISORDER), &disorder) || !as_ll(S(S_STEP), &step) ||
        !as_ll(S(S_ATTR), &attr) || !as_ll(S(S_BUCKET_ATTR), &b_attr) || !as_ll(S(S_BUCKET_STEP), &b_step) ||
        (has_ws && !as_ll(args[7], &ws)) || (has_tail && !as_ll(args[9], &tail_tag)) ||
        !as_ll(args[10], &early_count)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "run: a negative index or cap");
        return NULL;
    }
#undef S
    if (!PyList_Check(kinds) || !PyList_Check(imp) || PyList_GET_SIZE(imp) != 7 || !PyList_Check(fb) ||
        PyList_GET_SIZE(fb) != 5 || !PyDict_Check(index) || !PySet_Check(seen) || !PyList_Check(tail) ||
        !PySet_Check(finalized) || !PyDict_Check(wire_combo) || !PyList_Check(free_slots) || !PyDict_Check(buckets) ||
        !PyDict_Check(early) || !PyDict_Check(max_ts) || b_step <= 0 || end > PyList_GET_SIZE(kinds)) {
        PyErr_SetString(PyExc_TypeError, "run: the state's columns are not what batch.py hands in");
        return NULL;
    }
    PyObject *ic[7], *fc[5];
    for (int k = 0; k < 7; k++) {
        ic[k] = PyList_GET_ITEM(imp, k);
        if (!PyList_Check(ic[k])) goto bad_columns;
    }
    for (int k = 0; k < 5; k++) {
        fc[k] = PyList_GET_ITEM(fb, k);
        if (!PyList_Check(fc[k])) goto bad_columns;
    }
    /* every column of a kind as long as its first (the loop bounds its reads by the first's length) */
    for (int k = 1; k < 7; k++) {
        if (PyList_GET_SIZE(ic[k]) != PyList_GET_SIZE(ic[0])) goto bad_columns;
    }
    for (int k = 1; k < 5; k++) {
        if (PyList_GET_SIZE(fc[k]) != PyList_GET_SIZE(fc[0])) goto bad_columns;
    }
    PyObject *pending_cols[8] = {p_rid, p_ts, p_combo, p_user, p_record, p_count, p_positions, p_fb};
    PyObject *appends[8] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL}; /* the arrays' append methods */
    if (!PyList_CheckExact(p_rid) || !PyList_CheckExact(p_fb)) goto bad_columns;
    /* the watermark's value, written back once at the end */
    PyObject *value = NULL;
    for (int k = 0; k < 8; k++) {
        if (!PyList_CheckExact(pending_cols[k]) && (appends[k] = PyObject_GetAttrString(pending_cols[k], "append")) == NULL)
            goto error;
    }
    value = PyObject_GetAttrString(wmk, "value");
    if (value == NULL) goto error;
    int has_v = value != Py_None;
    long long v = 0;
    if (has_v && !as_ll(value, &v)) {
        Py_DECREF(value);
        goto error;
    }
    Py_DECREF(value);
    int wm_dirty = 0;
    long long added = 0;
    Counts ci = {0, 0, 0, 0}, cf = {0, 0, 0, 0};
    int failed = 0;

    for (; i < end; i++) {
        PyObject *is_impression = PyList_GET_ITEM(kinds, i);
        if (is_impression != Py_True && is_impression != Py_False) break; /* not a bool: Python reads it */
        int kind = is_impression == Py_True;
        PyObject *const *col = kind ? ic : fc;
        Py_ssize_t at = kind ? ip : fp;
        if (at >= PyList_GET_SIZE(col[0])) break; /* rows run out: the caller's to say why */
        PyObject *eid = PyList_GET_ITEM(col[0], at), *rid = PyList_GET_ITEM(col[1], at);
        if (eid == Py_None) break; /* left to the per-record path */
        int r;
        if (kind) {
            if ((r = PyDict_Contains(index, rid)) != 0 || PyDict_GET_SIZE(index) >= max_pending) {
                failed = r < 0;
                break; /* a second impression of a pending request, or the pending cap: per-record */
            }
        }
        if ((r = PySet_Contains(seen, eid)) != 0) {
            if (r < 0) {
                failed = 1;
                break;
            }
            (kind ? &ci : &cf)->dup++;
            kind ? ip++ : fp++;
            continue;
        }
        long long ts;
        if (!as_ll(PyList_GET_ITEM(col[kind ? 2 : 3], at), &ts)) {
            failed = 1;
            break;
        }
        int moves = 0;
        long long nv = v;
        if (ts > skip) { /* Watermark.observe for the one live partition, inlined (batch.py) */
            if (ikey == Py_None) break;
            long long wm = ts - disorder;
            nv = (!has_v || wm > v) ? wm : v;
            if (!has_ws || nv >= ws + step) break; /* a watermark step: Python finalizes and publishes */
            moves = 1;
        }
        long long tag = has_ws ? ws : 0;
        if (!has_tail || tag != tail_tag || PySet_GET_SIZE(seen) >= cap) break; /* the dedupe set's slow path */
        /* what the event does, decided before anything changes */
        PyObject *combo = NULL, *lst = NULL, *fslot = NULL;
        int late = 0, orphan = 0;
        long long rts = 0;
        if (kind) {
            late = has_ws && ts + attr < ws;
            if (!late && (r = PySet_Contains(finalized, rid)) != 0) {
                if (r < 0) {
                    failed = 1;
                    break;
                }
                late = 1;
            }
            if (!late) {
                combo = PyDict_GetItemWithError(wire_combo, PyList_GET_ITEM(ic[3], at));
                if (combo == NULL) {
                    failed = PyErr_Occurred() != NULL;
                    break; /* labels not seen yet: their combo is made in Python */
                }
                if (early_count && (r = PyDict_Contains(early, rid)) != 0) {
                    failed = r < 0;
                    break; /* early feedback waiting for this request: attached in Python */
                }
                PyObject *bkey = PyLong_FromLongLong((ts + b_attr) / b_step); /* ts >= 0: floor division */
                if (bkey == NULL) {
                    failed = 1;
                    break;
                }
                lst = PyDict_GetItemWithError(buckets, bkey);
                Py_DECREF(bkey);
                if (lst == NULL && PyErr_Occurred()) {
                    failed = 1;
                    break;
                }
            }
        } else {
            fslot = PyDict_GetItemWithError(index, rid);
            if (fslot == NULL && PyErr_Occurred()) {
                failed = 1;
                break;
            }
            if (fslot != NULL) {
                Py_ssize_t s = PyLong_AsSsize_t(fslot);
                PyObject *t = s < 0 || s >= PyList_GET_SIZE(p_fb) ? NULL : PySequence_GetItem(p_ts, s);
                int ok = t != NULL && as_ll(t, &rts);
                Py_XDECREF(t);
                if (!ok) {
                    failed = 1;
                    break;
                }
                late = ts > rts + attr;
            } else if ((r = PySet_Contains(finalized, rid)) != 0) {
                if (r < 0) {
                    failed = 1;
                    break;
                }
                late = 1;
            } else if (has_ws && ts + attr < ws) {
                orphan = 1;
            } else {
                break; /* feedback before its request: early feedback, kept in Python */
            }
        }
        /* -- from here the event is applied -- */
        if (moves) {
            skip = ts;
            v = nv;
            has_v = 1;
            wm_dirty = 1;
        }
        if (PySet_Add(seen, eid) < 0 || PyList_Append(tail, eid) < 0) goto error;
        if (kind) {
            ip++;
            if (late) {
                ci.late++;
                continue;
            }
            PyObject *slot;
            Py_ssize_t n_free = PyList_GET_SIZE(free_slots);
            PyObject *row[8] = {rid, PyList_GET_ITEM(ic[2], at), combo, PyList_GET_ITEM(ic[6], at),
                                PyList_GET_ITEM(ic[5], at), PyList_GET_ITEM(ic[4], at), Py_None, Py_None};
            if (n_free) {
                slot = Py_NewRef(PyList_GET_ITEM(free_slots, n_free - 1));
                if (PyList_SetSlice(free_slots, n_free - 1, n_free, NULL) < 0) {
                    Py_DECREF(slot);
                    goto error;
                }
                Py_ssize_t s = PyLong_AsSsize_t(slot);
                if (s < 0 || s >= PyList_GET_SIZE(p_rid)) {
                    Py_DECREF(slot);
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "a free slot beyond the columns");
                    goto error;
                }
                for (int k = 0; k < 8; k++) {
                    if (set_slot(pending_cols[k], s, row[k]) < 0) {
                        Py_DECREF(slot);
                        goto error;
                    }
                }
            } else {
                slot = PyLong_FromSsize_t(PyList_GET_SIZE(p_rid));
                if (slot == NULL) goto error;
                for (int k = 0; k < 8; k++) {
                    if (append_slot(pending_cols[k], appends[k], row[k]) < 0) {
                        Py_DECREF(slot);
                        goto error;
                    }
                }
            }
            long long n;
            int bad = PyDict_SetItem(index, rid, slot) < 0 || !as_ll(row[5], &n);
            if (!bad) {
                added += n;
                if (lst != NULL) {
                    bad = PyList_Append(lst, slot) < 0;
                } else { /* a new bucket: PendingRequests._file makes it */
                    PyObject *res = PyObject_CallFunctionObjArgs(file_slot, slot, row[1], NULL);
                    bad = res == NULL;
                    Py_XDECREF(res);
                }
            }
            Py_DECREF(slot);
            if (bad) goto error;
            ci.accepted++;
        } else {
            fp++;
            if (fslot == NULL) {
                orphan ? cf.orphan++ : cf.late++;
                continue;
            }
            if (late) {
                cf.late++;
                continue;
            }
            int counted = ts >= rts;
            if (counted) cf.accepted++;
            Py_ssize_t s = PyLong_AsSsize_t(fslot); /* checked above */
            PyObject *held = PyList_GET_ITEM(p_fb, s);
            if (held != Py_None && !PyTuple_Check(held)) {
                PyErr_SetString(PyExc_TypeError, "a pending request's feedback is a tuple");
                goto error;
            }
            Py_ssize_t h = held == Py_None ? 0 : PyTuple_GET_SIZE(held);
            PyObject *entry = PyTuple_Pack(4, PyList_GET_ITEM(fc[2], at), PyList_GET_ITEM(fc[4], at),
                                           PyList_GET_ITEM(fc[3], at), counted ? Py_True : Py_False);
            PyObject *grown = entry ? PyTuple_New(h + 1) : NULL;
            if (grown == NULL) {
                Py_XDECREF(entry);
                goto error;
            }
            for (Py_ssize_t k = 0; k < h; k++) PyTuple_SET_ITEM(grown, k, Py_NewRef(PyTuple_GET_ITEM(held, k)));
            PyTuple_SET_ITEM(grown, h, entry);
            if (PyList_SetItem(p_fb, s, grown) < 0) goto error;
        }
    }
    if (failed) goto error;
    if (wm_dirty) { /* the watermark's value and the partition's largest time, as _apply leaves them */
        PyObject *vo = PyLong_FromLongLong(v), *so = PyLong_FromLongLong(skip);
        int bad = vo == NULL || so == NULL || PyObject_SetAttrString(wmk, "value", vo) < 0 ||
                  PyDict_SetItem(max_ts, ikey, so) < 0;
        Py_XDECREF(vo);
        Py_XDECREF(so);
        if (bad) goto error;
    }
    for (int k = 0; k < 8; k++) Py_XDECREF(appends[k]);
    return Py_BuildValue("(nnnLLLLLLLLL)", i, ip, fp, skip, added, ci.dup, ci.late, ci.accepted, cf.dup, cf.late,
                         cf.accepted, cf.orphan);
bad_columns:
    PyErr_SetString(PyExc_TypeError, "run: the rows' or the state's columns are not lists of equal lengths");
    return NULL;
error:
    /* An exception mid-event (memory, a foreign object in a column): the state may be half-changed, as it would
       be in _apply; the processor is not to be used further (the caller's exception says so). */
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "run: failed");
    for (int k = 0; k < 8; k++) Py_XDECREF(appends[k]);
    return NULL;
}

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastapply", "The batch path's common event applied in C (see the source's header).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastapply(void) { return PyModule_Create(&module); }
