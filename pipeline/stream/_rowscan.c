/* The batch path's rows of the usual JSON event, scanned in C (rankwatch.pipeline.stream._rowscan).

Layout: the impression line (its fields, its items), the feedback line, and the two module functions
``impressions`` and ``feedback``, which scan a list of lines into the columns of pipeline/stream/prepare.py's
PreparedRows; the JSON subset's scanners are in _json_subset.h.

Why: msgspec decodes an impression into a struct an item, and prepare_rows then walks the items three times
in Python to pack the scores and join the ids: about two thirds of a replay's reader. Here a line is read
once, straight into its row.

Exactness: this scanner takes only a strict subset of JSON whose meaning is plain: ASCII, no backslash at all,
each known field once, ids as non-empty strings or integers, positions 1..n in any order, times as epoch ms or RFC
3339 with a zone, an unknown field with any value (skipped, nested at most 32 deep). Anything else (and anything this code is unsure of) is *left*: its index is returned, and
prepare_rows makes that row with msgspec, as before, which also names the reason of a bad line. So a row made
here is the row msgspec's path makes; tests/pipeline/stream/test_rowscan.py checks it on random and mutated
lines. Numbers are read exactly (_json_subset.h: an exact fast path, else CPython's correctly rounded parser)
after the JSON grammar is checked here.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_json_subset.h"

#define MAX_LABEL_CHARS 256
#define MAX_TS_MS 253370764799999LL
#define MAX_GRADE 20
#define MAX_ITEMS 65535 /* StreamConfig's largest max_items_per_request (PendingRequests counts items in 16 bits) */

/* An event time: epoch milliseconds, or an RFC 3339 time with a zone, in 0..MAX_TS_MS. */
static inline int ts_value(int kind, Span v, long long *ts) {
    int ok = kind == K_INT ? int_value(v, ts) : kind == K_STRING ? rfc3339_ms(v, ts) : 0;
    return ok && *ts >= 0 && *ts <= MAX_TS_MS;
}

/* -- impressions ------------------------------------------------------------------------------------------- */

typedef struct {
    Span id;
    double score;
    long long position;
} Item;

enum { F_EID = 1, F_RID = 2, F_TS = 4, F_ITEMS = 8, F_USER = 16, F_LABEL0 = 32 }; /* F_LABEL0 << i: label i */
static const char *LABELS[4] = {"segment", "surface", "variant", "model"};

typedef struct {
    Span eid, rid, user;
    int user_kind; /* K_STRING, or K_NULL when absent */
    long long ts;
    Span label[4];
    int label_set[4]; /* 1 when a string, 0 when null or absent */
    Py_ssize_t n;
} ImpressionLine;

/* The items of a list-form impression into ``items`` in position order (``items`` holds 2 * max_items: the second
   half is where items listed out of order are put in order); 0 if they are not positions 1..n, each once. */
static int scan_items(Cursor *c, Item *items, Py_ssize_t max_items, Py_ssize_t *n_out) {
    Py_ssize_t n = 0;
    int in_order = 1;
    if (!expect(c, '[')) return 0;
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') return 0; /* no items: left, for its reason */
    for (;;) {
        if (n >= max_items) return 0;
        if (!expect(c, '{')) return 0;
        int seen = 0, kind;
        Span key, v;
        long long position = 0;
        skip_ws(c);
        if (c->p < c->end && *c->p == '}') return 0;
        for (;;) {
            skip_ws(c);
            if (!scan_string(c, &key) || !expect(c, ':')) return 0;
            kind = scan_value(c, &v, 1);
            if (KEY(key, "item_id")) {
                if ((seen & 1) || !id_span(kind, v)) return 0;
                items[n].id = v;
                seen |= 1;
            } else if (KEY(key, "position")) {
                if ((seen & 2) || kind != K_INT || !int_value(v, &position)) return 0;
                items[n].position = position;
                in_order &= position == n + 1;
                seen |= 2;
            } else if (KEY(key, "score")) {
                if ((seen & 4) || (kind != K_INT && kind != K_FLOAT) || !double_value(kind, v, &items[n].score))
                    return 0;
                seen |= 4;
            } else if (kind == 0) {
                return 0;
            }
            if (expect(c, ',')) continue;
            if (expect(c, '}')) break;
            return 0;
        }
        if (seen != 7) return 0;
        n++;
        if (expect(c, ',')) continue;
        if (expect(c, ']')) break;
        return 0;
    }
    if (!in_order) { /* listed out of position order: fine if the positions are 1..n, each once */
        Item *sorted = items + max_items;
        for (Py_ssize_t i = 0; i < n; i++) sorted[i].id.s = NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            long long p = items[i].position;
            if (p < 1 || p > n || sorted[p - 1].id.s != NULL) return 0;
            sorted[p - 1] = items[i];
        }
        memcpy(items, sorted, sizeof(Item) * (size_t)n);
    }
    *n_out = n;
    return 1;
}

/* One impression line in list form, scanned; 0 if it is left to msgspec's path. */
static int scan_impression(const char *s, Py_ssize_t len, Py_ssize_t max_items, Item *items, ImpressionLine *out) {
    Cursor c = {s, s + len};
    int seen = 0, kind;
    Span key, v;
    out->user_kind = K_NULL;
    memset(out->label_set, 0, sizeof(out->label_set));
    if (!expect(&c, '{')) return 0;
    for (;;) {
        skip_ws(&c);
        if (!scan_string(&c, &key) || !expect(&c, ':')) return 0;
        skip_ws(&c);
        if (KEY(key, "items")) {
            if (seen & F_ITEMS || !scan_items(&c, items, max_items, &out->n)) return 0;
            seen |= F_ITEMS;
        } else {
            kind = scan_value(&c, &v, 0);
            if (kind == 0) return 0;
            if (KEY(key, "event_id")) {
                if (seen & F_EID || !id_span(kind, v)) return 0;
                out->eid = v;
                seen |= F_EID;
            } else if (KEY(key, "request_id")) {
                if (seen & F_RID || !id_span(kind, v)) return 0;
                out->rid = v;
                seen |= F_RID;
            } else if (KEY(key, "ts")) {
                if (seen & F_TS || !ts_value(kind, v, &out->ts)) return 0;
                seen |= F_TS;
            } else if (KEY(key, "user_id")) {
                if (seen & F_USER || (kind != K_NULL && (kind != K_STRING || v.n > MAX_LABEL_CHARS))) return 0;
                out->user = v;
                out->user_kind = kind;
                seen |= F_USER;
            } else if (KEY(key, "item_id") || KEY(key, "position") || KEY(key, "score")) {
                if (kind != K_NULL) return 0; /* item form, or both forms: left */
            } else {
                int i;
                for (i = 0; i < 4; i++) {
                    if (key_is(key, LABELS[i], (Py_ssize_t)strlen(LABELS[i]))) break;
                }
                if (i < 4) {
                    if (seen & (F_LABEL0 << i) || (kind != K_NULL && (kind != K_STRING || v.n > MAX_LABEL_CHARS)))
                        return 0;
                    out->label[i] = v;
                    out->label_set[i] = kind == K_STRING;
                    seen |= F_LABEL0 << i;
                }
            }
        }
        if (expect(&c, ',')) continue;
        if (expect(&c, '}')) break;
        return 0;
    }
    skip_ws(&c);
    return c.p == c.end && (seen & (F_EID | F_RID | F_TS | F_ITEMS)) == (F_EID | F_RID | F_TS | F_ITEMS);
}

/* The packed record: the scores as little-endian float64 in position order, then the item ids joined by NUL. */
static PyObject *packed_record(const Item *items, Py_ssize_t n) {
    Py_ssize_t size = 8 * n + (n - 1);
    for (Py_ssize_t i = 0; i < n; i++) size += items[i].id.n;
    PyObject *b = PyBytes_FromStringAndSize(NULL, size);
    if (b == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(b);
    for (Py_ssize_t i = 0; i < n; i++, p += 8) {
        if (PyFloat_Pack8(items[i].score, (char *)p, 1) < 0) {
            Py_DECREF(b);
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i) *p++ = '\0';
        memcpy(p, items[i].id.s, (size_t)items[i].id.n);
        p += items[i].id.n;
    }
    return b;
}

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL) return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

/* The user's GAUC key: user_keys[user] (made with key_of(request_id, user) and remembered, the dict emptied at
   cap entries), or key_of(request_id, None) without a user (prepare_rows' rule). */
static PyObject *user_key(PyObject *user_keys, Py_ssize_t cap, PyObject *key_of, PyObject *rid,
                          const ImpressionLine *line) {
    if (line->user_kind != K_STRING || line->user.n == 0) return PyObject_CallFunctionObjArgs(key_of, rid, Py_None, NULL);
    PyObject *user = ascii_str(line->user);
    if (user == NULL) return NULL;
    PyObject *key = PyDict_GetItemWithError(user_keys, user);
    if (key != NULL) {
        Py_INCREF(key);
        Py_DECREF(user);
        return key;
    }
    if (PyErr_Occurred() || (key = PyObject_CallFunctionObjArgs(key_of, rid, user, NULL)) == NULL) {
        Py_DECREF(user);
        return NULL;
    }
    if (PyDict_GET_SIZE(user_keys) >= cap) PyDict_Clear(user_keys);
    int r = PyDict_SetItem(user_keys, user, key);
    Py_DECREF(user);
    if (r < 0) {
        Py_DECREF(key);
        return NULL;
    }
    return key;
}

static PyObject *labels_key(PyObject *labels, const int *by, Py_ssize_t n_by, const ImpressionLine *line) {
    PyObject *key = PyTuple_New(n_by);
    if (key == NULL) return NULL;
    for (Py_ssize_t j = 0; j < n_by; j++) {
        int i = by[j];
        PyObject *v = line->label_set[i] ? ascii_str(line->label[i]) : Py_NewRef(Py_None);
        if (v == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        PyTuple_SET_ITEM(key, j, v);
    }
    PyObject *one = PyDict_SetDefault(labels, key, key); /* one tuple per distinct labels */
    Py_XINCREF(one);
    Py_DECREF(key);
    return one;
}

static PyObject *columns_and_left(PyObject **columns, int n_columns, PyObject *left) {
    PyObject *cols = PyList_New(n_columns);
    if (cols == NULL) return NULL;
    for (int i = 0; i < n_columns; i++) PyList_SET_ITEM(cols, i, Py_NewRef(columns[i]));
    PyObject *out = PyTuple_Pack(2, cols, left);
    Py_DECREF(cols);
    return out;
}

static int open_columns(PyObject **columns, int n) {
    for (int i = 0; i < n; i++) columns[i] = NULL;
    for (int i = 0; i < n; i++) {
        if ((columns[i] = PyList_New(0)) == NULL) return -1;
    }
    return 0;
}

static void close_columns(PyObject **columns, int n) {
    for (int i = 0; i < n; i++) Py_XDECREF(columns[i]);
}

PyDoc_STRVAR(impressions_doc,
"impressions(lines, max_event_bytes, max_items, by, labels, user_keys, cache_entries, key_of)\n--\n\n"
"The impression columns of prepare_rows for ``lines`` (event_id, request_id, ts, wire labels, n_items, packed,\n"
"user key), and the indexes of the lines left (placeholders in the columns), as ``(columns, left)``. ``by``:\n"
"the label fields' indexes in (segment, surface, variant, model); ``labels``: a dict keeping one tuple per\n"
"distinct labels; ``user_keys``: user id -> key, emptied at ``cache_entries``; ``key_of(request_id, user)``.");

static PyObject *impressions(PyObject *self, PyObject *args) {
    PyObject *lines, *by_obj, *labels, *user_keys, *key_of;
    Py_ssize_t max_bytes, max_items, cap;
    if (!PyArg_ParseTuple(args, "O!nnO!O!O!nO", &PyList_Type, &lines, &max_bytes, &max_items, &PyTuple_Type, &by_obj,
                          &PyDict_Type, &labels, &PyDict_Type, &user_keys, &cap, &key_of))
        return NULL;
    int by[4];
    Py_ssize_t n_by = PyTuple_GET_SIZE(by_obj);
    if (n_by > 4) {
        PyErr_SetString(PyExc_ValueError, "at most four label fields");
        return NULL;
    }
    for (Py_ssize_t j = 0; j < n_by; j++) {
        long i = PyLong_AsLong(PyTuple_GET_ITEM(by_obj, j));
        if (i < 0 || i > 3) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a label field's index is 0..3");
            return NULL;
        }
        by[j] = (int)i;
    }
    if (max_items < 1 || max_items > MAX_ITEMS) { /* StreamConfig keeps it in 1..65535 */
        PyErr_Format(PyExc_ValueError, "max_items %zd is outside 1..%d", max_items, MAX_ITEMS);
        return NULL;
    }
    Item *items = PyMem_Malloc(2 * sizeof(Item) * (size_t)max_items);
    if (items == NULL) return PyErr_NoMemory();
    PyObject *col[7], *left = PyList_New(0), *out = NULL;
    if (left == NULL || open_columns(col, 7) < 0) goto done;
    /* key_of is Python code: the line is held while its spans are read, and the list's size read each time */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lines); i++) {
        PyObject *raw = PyList_GET_ITEM(lines, i);
        ImpressionLine line;
        if (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) > max_bytes ||
            !scan_impression(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), max_items, items, &line)) {
            if (append_new(left, PyLong_FromSsize_t(i)) < 0 || PyList_Append(col[0], Py_None) < 0 ||
                PyList_Append(col[1], Py_None) < 0 || append_new(col[2], PyLong_FromLong(0)) < 0 ||
                PyList_Append(col[3], Py_None) < 0 || append_new(col[4], PyLong_FromLong(0)) < 0 ||
                PyList_Append(col[5], Py_None) < 0 || append_new(col[6], PyLong_FromLong(0)) < 0)
                goto done;
            continue;
        }
        PyObject *rid = ascii_str(line.rid);
        if (rid == NULL) goto done;
        Py_INCREF(raw);
        PyObject *ukey = user_key(user_keys, cap, key_of, rid, &line);
        if (ukey == NULL) {
            Py_DECREF(raw);
            Py_DECREF(rid);
            goto done;
        }
        int bad = append_new(col[0], ascii_str(line.eid)) < 0 || PyList_Append(col[1], rid) < 0 ||
                  append_new(col[2], PyLong_FromLongLong(line.ts)) < 0 ||
                  append_new(col[3], labels_key(labels, by, n_by, &line)) < 0 ||
                  append_new(col[4], PyLong_FromSsize_t(line.n)) < 0 ||
                  append_new(col[5], packed_record(items, line.n)) < 0 || PyList_Append(col[6], ukey) < 0;
        Py_DECREF(raw);
        Py_DECREF(rid);
        Py_DECREF(ukey);
        if (bad) goto done;
    }
    out = columns_and_left(col, 7, left);
done:
    PyMem_Free(items);
    close_columns(col, 7);
    Py_XDECREF(left);
    return out;
}

/* -- feedback ---------------------------------------------------------------------------------------------- */

/* One feedback line, scanned (its grade from ``grades`` where it has an action and no grade); 0 if left. */
static int scan_feedback(const char *s, Py_ssize_t len, PyObject *grades, Span *ids, long long *ts, long *grade) {
    Cursor c = {s, s + len};
    int seen = 0, kind, action_kind = K_NULL, grade_kind = K_NULL;
    Span key, v, action = {NULL, 0};
    long long g = 0;
    if (!expect(&c, '{')) return 0;
    for (;;) {
        skip_ws(&c);
        if (!scan_string(&c, &key) || !expect(&c, ':')) return 0;
        kind = scan_value(&c, &v, 0);
        if (kind == 0) return 0;
        int bit = KEY(key, "event_id") ? 1 : KEY(key, "request_id") ? 2 : KEY(key, "item_id") ? 4
                : KEY(key, "ts") ? 8 : KEY(key, "action") ? 16 : KEY(key, "grade") ? 32 : 0;
        if (bit & seen) return 0;
        seen |= bit;
        if (bit && bit <= 4) {
            if (!id_span(kind, v)) return 0;
            ids[bit == 4 ? 2 : bit - 1] = v;
        } else if (bit == 8) {
            if (!ts_value(kind, v, ts)) return 0;
        } else if (bit == 16) {
            if (kind != K_NULL && kind != K_STRING) return 0;
            action_kind = kind;
            action = v;
        } else if (bit == 32) {
            if (kind != K_NULL && (kind != K_INT || !int_value(v, &g))) return 0;
            grade_kind = kind;
        }
        if (expect(&c, ',')) continue;
        if (expect(&c, '}')) break;
        return 0;
    }
    skip_ws(&c);
    if (c.p != c.end || (seen & 15) != 15) return 0;
    if (grade_kind == K_NULL) { /* prepare_rows: the grade of the action, where the map has it */
        if (action_kind != K_STRING) return 0;
        PyObject *name = ascii_str(action);
        if (name == NULL) return -1;
        PyObject *mapped = PyDict_GetItemWithError(grades, name);
        Py_DECREF(name);
        if (mapped == NULL) return PyErr_Occurred() ? -1 : 0;
        if (!PyLong_CheckExact(mapped)) return 0;
        g = PyLong_AsLongLong(mapped);
        if (g == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    }
    if (g < 0 || g > MAX_GRADE) return 0;
    *grade = (long)g;
    return 1;
}

PyDoc_STRVAR(feedback_doc,
"feedback(lines, max_event_bytes, grades)\n--\n\n"
"The feedback columns of prepare_rows for ``lines`` (event_id, request_id, item_id, ts, grade), and the indexes\n"
"of the lines left (placeholders in the columns), as ``(columns, left)``; ``grades``: action -> grade.");

static PyObject *feedback(PyObject *self, PyObject *args) {
    PyObject *lines, *grades;
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTuple(args, "O!nO!", &PyList_Type, &lines, &max_bytes, &PyDict_Type, &grades)) return NULL;
    PyObject *col[5], *left = PyList_New(0), *out = NULL;
    if (left == NULL || open_columns(col, 5) < 0) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lines); i++) {
        PyObject *raw = PyList_GET_ITEM(lines, i);
        Span ids[3];
        long long ts = 0;
        long grade = 0;
        int ok = PyBytes_Check(raw) && PyBytes_GET_SIZE(raw) <= max_bytes
                     ? scan_feedback(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), grades, ids, &ts, &grade)
                     : 0;
        if (ok < 0) goto done;
        if (!ok) {
            if (append_new(left, PyLong_FromSsize_t(i)) < 0 || PyList_Append(col[0], Py_None) < 0 ||
                PyList_Append(col[1], Py_None) < 0 || PyList_Append(col[2], Py_None) < 0 ||
                append_new(col[3], PyLong_FromLong(0)) < 0 || append_new(col[4], PyLong_FromLong(0)) < 0)
                goto done;
            continue;
        }
        if (append_new(col[0], ascii_str(ids[0])) < 0 || append_new(col[1], ascii_str(ids[1])) < 0 ||
            append_new(col[2], ascii_str(ids[2])) < 0 || append_new(col[3], PyLong_FromLongLong(ts)) < 0 ||
            append_new(col[4], PyLong_FromLong(grade)) < 0)
            goto done;
    }
    out = columns_and_left(col, 5, left);
done:
    close_columns(col, 5);
    Py_XDECREF(left);
    return out;
}

static PyMethodDef methods[] = {
    {"impressions", impressions, METH_VARARGS, impressions_doc},
    {"feedback", feedback, METH_VARARGS, feedback_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rowscan",
    "The batch path's rows of the usual JSON event, scanned in C (see the source's header).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rowscan(void) { return PyModule_Create(&module); }
