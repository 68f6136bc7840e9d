/* Records as JSON lines, in C: the output of torchdebug.store.record_json.encode_records, byte for byte.
 *
 * Built and loaded by torchdebug/native/build.py against this interpreter's headers and called
 * through ctypes.PyDLL (the GIL stays held; a Python exception raised here reaches the caller).
 * Plain ASCII strings, ints, floats, lists of ints and the statistics dict are written here;
 * anything else (non-ASCII or escaped strings, the `value` and `extra` fields, nested dicts, and any
 * number that is not exactly an int or a float: bools, numpy scalars, a symbolic size, a string in
 * a shape) goes through the Python helpers the caller passes, so the rules live in one place:
 * record_json.py. No object is ever written as its bare str(): every line is valid JSON.
 *
 * td_encode_records(records, helpers): helpers = (quote, dumps, fields, stat_keys, number) where
 * quote is json's encode_basestring_ascii, dumps the compact JSON encoder, fields the Record field
 * names in the order record_json.ENCODED_FIELDS gives, stat_keys the statistics' keys in the order
 * they are written (torchdebug.stats.schema.STAT_KEYS: nothing here knows how many or which),
 * number record_json._number (the JSON text of any other numeric field's value).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { NAME, STEP, RANK, PHASE, MODULE, OP, CALL, SEQ, IO, ARG, KIND, DTYPE, SHAPE, STRIDE, DEVICE, REQUIRES_GRAD,
       STATS, CHECKSUM, TENSOR, SAMPLED, VALUE, STACK, SOURCE, FWD, NODE, CAPTURE, CAPTURE_ERROR, EXTRA, FIELD_COUNT };

typedef struct {
    char *data;
    Py_ssize_t size, capacity;
} buffer_t;

typedef struct {
    PyObject *quote, *dumps, *fields, *stat_keys, *number;
} helpers_t;

/* Statistics already written in this batch, by the identity of their dict: the records of one
 * tensor share it (an op's output, then the next op's input), and every record of the batch is
 * alive during the call, so an identity is never reused for another dict. */
#define MEMO_SLOTS 256
typedef struct {
    const void *key;
    Py_ssize_t offset, size;
} memo_t;

static int reserve(buffer_t *b, Py_ssize_t extra) {
    if (b->size + extra <= b->capacity) return 0;
    Py_ssize_t capacity = b->capacity ? b->capacity : 1 << 16;
    while (capacity < b->size + extra) capacity *= 2;
    char *data = PyMem_Realloc(b->data, capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->capacity = capacity;
    return 0;
}

static int put(buffer_t *b, const char *text, Py_ssize_t n) {
    if (reserve(b, n) < 0) return -1;
    memcpy(b->data + b->size, text, n);
    b->size += n;
    return 0;
}

#define PUT(b, literal) put((b), (literal), (Py_ssize_t)(sizeof(literal) - 1))

/* Writes the text of a str object (ASCII, as every helper returns). */
static int put_str(buffer_t *b, PyObject *text) {
    if (text == NULL) return -1;
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &n);
    int status = utf8 == NULL ? -1 : put(b, utf8, n);
    Py_DECREF(text);
    return status;
}

/* A JSON string: plain printable ASCII directly, anything else through json's escaper. */
static int put_quoted(buffer_t *b, PyObject *s, const helpers_t *h) {
    if (PyUnicode_Check(s) && PyUnicode_IS_ASCII(s)) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(s);
        const unsigned char *c = (const unsigned char *)PyUnicode_DATA(s);
        int plain = 1;
        for (Py_ssize_t i = 0; i < n && plain; i++) plain = c[i] >= ' ' && c[i] <= '~' && c[i] != '"' && c[i] != '\\';
        if (plain) {
            if (reserve(b, n + 2) < 0) return -1;
            b->data[b->size++] = '"';
            memcpy(b->data + b->size, c, n);
            b->size += n;
            b->data[b->size++] = '"';
            return 0;
        }
    }
    return put_str(b, PyObject_CallOneArg(h->quote, s));
}

/* An int field (counts, indices, sizes): an exact int here, anything else through record_json._number. */
static int put_int(buffer_t *b, PyObject *value, const helpers_t *h) {
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (!overflow && !(v == -1 && PyErr_Occurred())) {
            char text[32];
            int n = snprintf(text, sizeof text, "%lld", v);
            return put(b, text, n);
        }
        PyErr_Clear();
        return put_str(b, PyObject_Str(value)); /* an exact int beyond 64 bits: its digits */
    }
    return put_str(b, PyObject_CallOneArg(h->number, value));
}

/* record_json._number: null, repr of a finite float, NaN/Infinity/-Infinity, an exact int, else the helper. */
static int put_number(buffer_t *b, PyObject *value, const helpers_t *h) {
    if (value == NULL || value == Py_None) return PUT(b, "null");
    if (PyFloat_CheckExact(value)) {
        double v = PyFloat_AS_DOUBLE(value);
        if (v != v) return PUT(b, "NaN");
        if (v == Py_HUGE_VAL) return PUT(b, "Infinity");
        if (v == -Py_HUGE_VAL) return PUT(b, "-Infinity");
        char *text = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (text == NULL) return -1;
        int status = put(b, text, (Py_ssize_t)strlen(text));
        PyMem_Free(text);
        return status;
    }
    return put_int(b, value, h);
}

/* record_json._ints: "[1,2,3]". */
static int put_ints(buffer_t *b, PyObject *values, const helpers_t *h) {
    PyObject *items = PySequence_Fast(values, "shape and stride must be sequences");
    if (items == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    int status = PUT(b, "[");
    for (Py_ssize_t i = 0; i < n && status == 0; i++) {
        if (i) status = PUT(b, ",");
        if (status == 0) status = put_int(b, PySequence_Fast_GET_ITEM(items, i), h);
    }
    Py_DECREF(items);
    return status < 0 ? -1 : PUT(b, "]");
}

/* record_json._flat_dict: strings quoted, dicts and lists through dumps, the rest as numbers. */
static int put_flat_dict(buffer_t *b, PyObject *data, const helpers_t *h) {
    PyObject *key, *value;
    Py_ssize_t position = 0;
    int first = 1;
    if (PUT(b, "{") < 0) return -1;
    while (PyDict_Next(data, &position, &key, &value)) {
        if (!first && PUT(b, ",") < 0) return -1;
        first = 0;
        if (put_quoted(b, key, h) < 0 || PUT(b, ":") < 0) return -1;
        int status;
        if (PyUnicode_CheckExact(value)) status = put_quoted(b, value, h);
        else if (PyDict_Check(value) || PyList_Check(value)) status = put_str(b, PyObject_CallOneArg(h->dumps, value));
        else status = put_number(b, value, h);
        if (status < 0) return -1;
    }
    return PUT(b, "}");
}

/* record_json._stats: every statistic in stat_keys' order (plain ASCII keys), else a flat dict. */
static int put_stats(buffer_t *b, PyObject *stats, const helpers_t *h) {
    Py_ssize_t count = PyTuple_GET_SIZE(h->stat_keys);
    int complete = PyDict_Check(stats) && PyDict_GET_SIZE(stats) == count;
    for (Py_ssize_t i = 0; i < count && complete; i++) complete = PyDict_GetItemWithError(stats, PyTuple_GET_ITEM(h->stat_keys, i)) != NULL;
    if (PyErr_Occurred()) return -1;
    if (!complete) return PyDict_Check(stats) ? put_flat_dict(b, stats, h) : put_str(b, PyObject_CallOneArg(h->dumps, stats));
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(h->stat_keys, i);
        if (put(b, i ? "," : "{", 1) < 0 || put_quoted(b, key, h) < 0 || PUT(b, ":") < 0) return -1;
        if (put_number(b, PyDict_GetItem(stats, key), h) < 0) return -1;
    }
    return PUT(b, "}");
}

static int put_key(buffer_t *b, const char *key) {
    return put(b, key, (Py_ssize_t)strlen(key));
}

/* The statistics, copied from where the same dict was written before in this batch if it was. */
static int put_stats_memo(buffer_t *b, PyObject *stats, const helpers_t *h, memo_t *memo) {
    memo_t *slot = &memo[((uintptr_t)stats >> 4) % MEMO_SLOTS];
    if (slot->key == stats) {
        if (reserve(b, slot->size) < 0) return -1;
        memcpy(b->data + b->size, b->data + slot->offset, slot->size);
        b->size += slot->size;
        return 0;
    }
    Py_ssize_t start = b->size;
    if (put_stats(b, stats, h) < 0) return -1;
    *slot = (memo_t){stats, start, b->size - start};
    return 0;
}

static int encode(buffer_t *b, PyObject *record, const helpers_t *h, memo_t *memo) {
    PyObject *f[FIELD_COUNT];
    int status = 0, got = 0;
    for (; got < FIELD_COUNT; got++) {
        f[got] = PyObject_GetAttr(record, PyTuple_GET_ITEM(h->fields, got));
        if (f[got] == NULL) {
            status = -1;
            break;
        }
    }
#define TRY(call) if (status == 0) status = (call) < 0 ? -1 : 0
    TRY(put_key(b, "{\"name\":")); TRY(put_quoted(b, f[NAME], h));
    TRY(put_key(b, ",\"step\":")); TRY(put_int(b, f[STEP], h));
    TRY(put_key(b, ",\"rank\":")); TRY(put_int(b, f[RANK], h));
    TRY(put_key(b, ",\"phase\":")); TRY(put_quoted(b, f[PHASE], h));
    TRY(put_key(b, ",\"module\":")); TRY(put_quoted(b, f[MODULE], h));
    TRY(put_key(b, ",\"op\":")); TRY(put_quoted(b, f[OP], h));
    TRY(put_key(b, ",\"call\":")); TRY(put_int(b, f[CALL], h));
    TRY(put_key(b, ",\"seq\":")); TRY(put_int(b, f[SEQ], h));
    TRY(put_key(b, ",\"io\":")); TRY(put_quoted(b, f[IO], h));
    TRY(put_key(b, ",\"arg\":")); TRY(put_quoted(b, f[ARG], h));
    TRY(put_key(b, ",\"kind\":")); TRY(put_quoted(b, f[KIND], h));
    if (status == 0 && f[DTYPE] != Py_None) { TRY(put_key(b, ",\"dtype\":")); TRY(put_quoted(b, f[DTYPE], h)); }
    if (status == 0 && f[SHAPE] != Py_None) { TRY(put_key(b, ",\"shape\":")); TRY(put_ints(b, f[SHAPE], h)); }
    if (status == 0 && f[STRIDE] != Py_None) { TRY(put_key(b, ",\"stride\":")); TRY(put_ints(b, f[STRIDE], h)); }
    if (status == 0 && f[DEVICE] != Py_None) { TRY(put_key(b, ",\"device\":")); TRY(put_quoted(b, f[DEVICE], h)); }
    if (status == 0 && f[REQUIRES_GRAD] != Py_None) {
        int truth = PyObject_IsTrue(f[REQUIRES_GRAD]);
        if (truth < 0) status = -1;
        TRY(put_key(b, truth ? ",\"requires_grad\":true" : ",\"requires_grad\":false"));
    }
    if (status == 0 && f[STATS] != Py_None) { TRY(put_key(b, ",\"stats\":")); TRY(put_stats_memo(b, f[STATS], h, memo)); }
    if (status == 0 && f[CHECKSUM] != Py_None) { TRY(put_key(b, ",\"checksum\":")); TRY(put_quoted(b, f[CHECKSUM], h)); }
    if (status == 0 && f[TENSOR] != Py_None) {
        TRY(put_key(b, ",\"tensor\":"));
        TRY(PyDict_Check(f[TENSOR]) ? put_flat_dict(b, f[TENSOR], h) : put_str(b, PyObject_CallOneArg(h->dumps, f[TENSOR])));
    }
    if (status == 0 && f[SAMPLED] != Py_None) { TRY(put_key(b, ",\"sampled\":")); TRY(put_number(b, f[SAMPLED], h)); }
    if (status == 0 && f[VALUE] != Py_None) { TRY(put_key(b, ",\"value\":")); TRY(put_str(b, PyObject_CallOneArg(h->dumps, f[VALUE]))); }
    static const char *texts[] = {",\"stack\":", ",\"source\":", ",\"fwd\":", ",\"node\":"};
    for (int i = 0; i < 4; i++) {
        if (status == 0 && f[STACK + i] != Py_None) { TRY(put_key(b, texts[i])); TRY(put_quoted(b, f[STACK + i], h)); }
    }
    TRY(put_key(b, ",\"capture\":")); TRY(put_quoted(b, f[CAPTURE], h));
    if (status == 0 && f[CAPTURE_ERROR] != Py_None) { TRY(put_key(b, ",\"capture_error\":")); TRY(put_quoted(b, f[CAPTURE_ERROR], h)); }
    if (status == 0) {
        int truth = PyObject_IsTrue(f[EXTRA]);
        if (truth < 0) status = -1;
        if (truth > 0) { TRY(put_key(b, ",\"extra\":")); TRY(put_str(b, PyObject_CallOneArg(h->dumps, f[EXTRA]))); }
    }
    TRY(put_key(b, "}\n"));
#undef TRY
    for (int i = 0; i < got; i++) Py_DECREF(f[i]);
    return status;
}

PyObject *td_encode_records(PyObject *records, PyObject *helpers) {
    helpers_t h;
    if (!PyArg_ParseTuple(helpers, "OOO!O!O", &h.quote, &h.dumps, &PyTuple_Type, &h.fields, &PyTuple_Type, &h.stat_keys,
                          &h.number))
        return NULL;
    if (PyTuple_GET_SIZE(h.fields) != FIELD_COUNT) {
        PyErr_SetString(PyExc_ValueError, "record fields changed: rebuild records.c");
        return NULL;
    }
    PyObject *items = PySequence_Fast(records, "records must be a sequence");
    if (items == NULL) return NULL;
    buffer_t b = {NULL, 0, 0};
    memo_t *memo = PyMem_Calloc(MEMO_SLOTS, sizeof(memo_t));
    if (memo == NULL) {
        Py_DECREF(items);
        return PyErr_NoMemory();
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    int status = 0;
    for (Py_ssize_t i = 0; i < n && status == 0; i++) status = encode(&b, PySequence_Fast_GET_ITEM(items, i), &h, memo);
    PyMem_Free(memo);
    Py_DECREF(items);
    PyObject *text = status == 0 ? PyUnicode_DecodeASCII(b.data ? b.data : "", b.size, "strict") : NULL;
    PyMem_Free(b.data);
    return text;
}
