/* A scanner of a strict subset of JSON, for pipeline/stream/_rowscan.c (included there: its functions are
   static inline).

Layout: a cursor over one line, then its scanners: whitespace, a string without escapes, a number (RFC 8259
grammar), a word, any scalar, any value (an object or an array only skipped), an integer's value, an identifier, a
number's value as a double, an RFC 3339 time.

Why apart: what these accept is the subset whose meaning is plain (module header of _rowscan.c); each returns
0 for anything else, and the caller leaves that line to msgspec.
*/
#ifndef RANKWATCH_JSON_SUBSET_H
#define RANKWATCH_JSON_SUBSET_H

#include <Python.h>
#include <float.h>
#include <string.h>

#define MAX_INT_DIGITS 18 /* an integer literal of at most 18 digits fits an int64: longer ones are left */

typedef struct {
    const char *p;
    const char *end;
} Cursor;

typedef struct {
    const char *s;
    Py_ssize_t n;
} Span;

/* A scalar: its kind and where it is. */
enum { K_NONE = 0, K_STRING, K_INT, K_FLOAT, K_NULL, K_BOOL, K_NESTED };

static inline void skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static inline int expect(Cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A string without escapes or control characters, ASCII only: its content. 0 if anything else. */
static inline int scan_string(Cursor *c, Span *out) {
    if (c->p >= c->end || *c->p != '"') return 0;
    const char *q = ++c->p;
    while (q < c->end) {
        unsigned char ch = (unsigned char)*q;
        if (ch == '"') break;
        if (ch < 0x20 || ch >= 0x80 || ch == '\\') return 0;
        q++;
    }
    if (q >= c->end) return 0;
    out->s = c->p;
    out->n = q - c->p;
    c->p = q + 1;
    return 1;
}

/* A JSON number (RFC 8259 grammar): K_INT (no fraction nor exponent) or K_FLOAT, its text; 0 if not one. */
static inline int scan_number(Cursor *c, Span *out) {
    const char *q = c->p, *e = c->end;
    int kind = K_INT;
    if (q < e && *q == '-') q++;
    if (q >= e) return 0;
    if (*q == '0') {
        q++;
    } else if (*q >= '1' && *q <= '9') {
        while (q < e && *q >= '0' && *q <= '9') q++;
    } else {
        return 0;
    }
    if (q < e && *q == '.') {
        q++;
        if (q >= e || *q < '0' || *q > '9') return 0;
        while (q < e && *q >= '0' && *q <= '9') q++;
        kind = K_FLOAT;
    }
    if (q < e && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < e && (*q == '+' || *q == '-')) q++;
        if (q >= e || *q < '0' || *q > '9') return 0;
        while (q < e && *q >= '0' && *q <= '9') q++;
        kind = K_FLOAT;
    }
    out->s = c->p;
    out->n = q - c->p;
    c->p = q;
    return kind;
}

static inline int scan_word(Cursor *c, const char *word, Py_ssize_t n) {
    if (c->end - c->p >= n && memcmp(c->p, word, (size_t)n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

/* Any scalar: its kind (K_*), its text for strings and numbers; 0 for an object, an array or bad JSON. */
static int scan_scalar(Cursor *c, Span *out) {
    skip_ws(c);
    if (c->p >= c->end) return 0;
    switch (*c->p) {
        case '"': return scan_string(c, out) ? K_STRING : 0;
        case 'n': return scan_word(c, "null", 4) ? K_NULL : 0;
        case 't': return scan_word(c, "true", 4) ? K_BOOL : 0;
        case 'f': return scan_word(c, "false", 5) ? K_BOOL : 0;
        default: return scan_number(c, out);
    }
}

#define MAX_NESTING 32 /* an unknown field's value nested deeper is left (msgspec's own limit is far beyond) */

static int skip_nested(Cursor *c, int depth);

/* Any value: a scalar's kind (K_*), or K_NESTED for an object or an array (skipped: its grammar checked, each of
   its strings and numbers as scan_scalar takes them); 0 for anything else. ``depth``: the nesting so far. */
static int scan_value(Cursor *c, Span *out, int depth) {
    skip_ws(c);
    if (c->p < c->end && (*c->p == '{' || *c->p == '[')) return skip_nested(c, depth + 1) ? K_NESTED : 0;
    return scan_scalar(c, out);
}

static int skip_nested(Cursor *c, int depth) {
    Span ignored;
    if (depth > MAX_NESTING) return 0;
    char close = *c->p == '{' ? '}' : ']';
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 1;
    }
    for (;;) {
        if (close == '}') {
            skip_ws(c);
            if (!scan_string(c, &ignored) || !expect(c, ':')) return 0;
        }
        if (!scan_value(c, &ignored, depth)) return 0;
        if (expect(c, ',')) continue;
        return expect(c, close);
    }
}

/* An integer literal's value, where it has at most MAX_INT_DIGITS digits. */
static inline int int_value(Span v, long long *out) {
    const char *q = v.s, *e = v.s + v.n;
    int neg = 0;
    if (q < e && *q == '-') {
        neg = 1;
        q++;
    }
    if (e - q > MAX_INT_DIGITS) return 0;
    long long x = 0;
    for (; q < e; q++) x = x * 10 + (*q - '0');
    *out = neg ? -x : x;
    return 1;
}

/* An identifier: a non-empty string, or an integer read as its decimal text. JSON forbids leading zeros, so an
   integer's literal is its text, but for "-0" (the integer 0, text "0"), which is left. */
static inline int id_span(int kind, Span v) {
    if (kind == K_STRING) return v.n > 0;
    if (kind == K_INT) return v.n <= MAX_INT_DIGITS && !(v.n == 2 && v.s[0] == '-' && v.s[1] == '0');
    return 0;
}

static PyObject *ascii_str(Span v) {
    PyObject *s = PyUnicode_New(v.n, 127);
    if (s != NULL) memcpy(PyUnicode_1BYTE_DATA(s), v.s, (size_t)v.n);
    return s;
}

static inline int key_is(Span k, const char *name, Py_ssize_t n) {
    return k.n == n && memcmp(k.s, name, (size_t)n) == 0;
}
#define KEY(k, lit) key_is((k), (lit), (Py_ssize_t)(sizeof(lit) - 1))

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                  1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A number's value as a double (its JSON grammar checked by scan_number). An integer is converted (rounded to
   nearest, as msgspec converts the integer it read); the usual score (at most 2**53 as its
   digits, a power of ten up to 22) is one IEEE division or product of two exact doubles, so correctly rounded
   (Clinger's fast path, where doubles are evaluated in double precision); any other goes to CPython's correctly
   rounded parser, which costs a switch of the x87 control word a call. */
static inline int double_value(int kind, Span v, double *out) {
    const char *q = v.s, *e = v.s + v.n;
    int neg = 0;
    if (kind == K_INT) { /* an integer becomes a float as msgspec converts one: -0 is 0.0, the integer zero */
        long long whole;
        if (!int_value(v, &whole)) return 0; /* msgspec reads a long integer its own way */
        *out = (double)whole;
        return 1;
    }
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
    if (*q == '-') {
        neg = 1;
        q++;
    }
    unsigned long long m = 0;
    int digits = 0, exp10 = 0;
    for (; q < e && *q >= '0' && *q <= '9'; q++, digits++) m = m * 10 + (unsigned)(*q - '0');
    if (q < e && *q == '.') {
        for (q++; q < e && *q >= '0' && *q <= '9'; q++, digits++, exp10--) m = m * 10 + (unsigned)(*q - '0');
    }
    if (q < e) { /* the exponent */
        int eneg = 0, x = 0;
        q++;
        if (*q == '+' || *q == '-') eneg = *q++ == '-';
        for (; q < e && x < 1000; q++) x = x * 10 + (*q - '0');
        exp10 += eneg ? -x : x;
        if (q < e) digits = 99; /* an exponent too long for this path */
    }
    if (digits <= 19 && m <= (1ULL << 53) && exp10 >= -22 && exp10 <= 22) {
        double x = (double)m;
        x = exp10 < 0 ? x / POW10[-exp10] : x * POW10[exp10];
        *out = neg ? -x : x;
        return 1;
    }
#endif
    char buf[64];
    if (v.n >= (Py_ssize_t)sizeof(buf)) return 0;
    memcpy(buf, v.s, (size_t)v.n);
    buf[v.n] = '\0';
    char *end = NULL;
    double x = PyOS_string_to_double(buf, &end, NULL);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (end != buf + v.n || !Py_IS_FINITE(x)) return 0;
    *out = x;
    return 1;
}

/* -- RFC 3339 times ----------------------------------------------------------------------------------------- */

static inline int digits_at(const char *p, int n, int *out) {
    int x = 0;
    for (int k = 0; k < n; k++) {
        if (p[k] < '0' || p[k] > '9') return 0;
        x = x * 10 + (p[k] - '0');
    }
    *out = x;
    return 1;
}

/* Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static inline long long days_from_civil(long long y, int m, int d) {
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long yoe = y - era * 400;
    long long doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static inline int days_in_month(int y, int m) {
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : days[m - 1];
}

/* An RFC 3339 time with a zone, as epoch milliseconds rounded down (pipeline/events/validation.py _ts_ms): only
   ``YYYY-MM-DDTHH:MM:SS``, an optional fraction of 1 to 6 digits (exact microseconds: msgspec rounds longer ones),
   and ``Z`` or ``+HH:MM`` / ``-HH:MM``; 0 for anything else (a lowercase letter, a space, no zone, ...), and for a
   time before the epoch. */
static inline int rfc3339_ms(Span v, long long *out) {
    const char *p = v.s;
    Py_ssize_t n = v.n;
    int y, mo, d, h, mi, sec, us = 0, oh = 0, om = 0, sign = 0;
    if (n < 20 || p[4] != '-' || p[7] != '-' || p[10] != 'T' || p[13] != ':' || p[16] != ':') return 0;
    if (!digits_at(p, 4, &y) || !digits_at(p + 5, 2, &mo) || !digits_at(p + 8, 2, &d) || !digits_at(p + 11, 2, &h) ||
        !digits_at(p + 14, 2, &mi) || !digits_at(p + 17, 2, &sec))
        return 0;
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 59) return 0;
    Py_ssize_t k = 19;
    if (p[k] == '.') {
        int digits = 0;
        for (k++; k < n && p[k] >= '0' && p[k] <= '9'; k++, digits++) {
            if (digits >= 6) return 0;
            us = us * 10 + (p[k] - '0');
        }
        if (digits == 0) return 0;
        for (int z = digits; z < 6; z++) us *= 10;
    }
    if (k == n - 1 && p[k] == 'Z') {
        sign = 0;
    } else if (k == n - 6 && (p[k] == '+' || p[k] == '-') && p[k + 3] == ':') {
        if (!digits_at(p + k + 1, 2, &oh) || !digits_at(p + k + 4, 2, &om) || oh > 23 || om > 59) return 0;
        sign = p[k] == '+' ? 1 : -1;
    } else {
        return 0;
    }
    long long secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec - sign * (oh * 3600 + om * 60);
    long long total_us = secs * 1000000 + us;
    if (total_us < 0) return 0;
    *out = total_us / 1000;
    return 1;
}

#endif
