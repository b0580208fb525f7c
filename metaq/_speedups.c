/* Compiled record walks (optional): the client's decode of fetched records into Messages, and
 * the broker's check of a put or a fetch reply (scan_valid) and msg id stamping (stamp_ids).
 *
 * scan_valid and stamp_ids are record.py's _scan and stamp_msg_ids, chosen by record.py when
 * this module is built; they return exactly what those return, and stamp_ids hands anything it
 * would not write (not whole records, an id past int64) back to record.py, which raises.
 *
 * codec.decode_messages calls decode_valid() when this module is built (setup.py, during
 * scripts/setup.sh) and falls back to pure Python (record.decode_columns) when it is not.
 * It decodes valid records only, with or without an attribute, and leaves out control
 * records as decode_messages does. It stops at the first record that is not whole and
 * valid (a partial tail, a bad header, a CRC mismatch, a bad attribute block) and returns
 * its position: record.py decodes from there, so the error messages stay there. The
 * record format is record.py's: a 20-byte big-endian header (int32 length, int32
 * crc32(payload) & 0x7fffffff, int64 msg_id, int32 flag), then the payload, which starts
 * with an attribute block (int32 length, UTF-8) when flag bit 0 is set.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <zlib.h>

#include <limits.h>
#include <string.h>

#define HEADER_SIZE 20
#define FLAG_HAS_ATTRIBUTE 1u /* record.KNOWN_FLAGS: any other bit is a bad header */
#define MESSAGE_FIELDS 6 /* Message: topic, data, attribute, id, partition, offset */

static inline uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline int64_t be64(const unsigned char *p)
{
    return (int64_t)(((uint64_t)be32(p) << 32) | (uint64_t)be32(p + 4));
}

/* A METH_FASTCALL function's argument count: 1 (TypeError set) when it is not ``want``. */
static int wrong_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want)
{
    if (nargs == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", name, want);
    return 1;
}

/* Message(topic, data, attribute, msg_id, partition, offset), built as tuple.__new__ does;
 * takes over the reference to ``attribute``. */
static PyObject *new_message(PyTypeObject *cls, PyObject *topic, PyObject *partition, PyObject *attribute,
                             const unsigned char *payload, Py_ssize_t length, int64_t msg_id, long long offset)
{
    PyObject *data = PyBytes_FromStringAndSize((const char *)payload, length);
    PyObject *id = data ? PyLong_FromLongLong(msg_id) : NULL;
    PyObject *where = id ? PyLong_FromLongLong(offset) : NULL;
    PyObject *message = where ? cls->tp_alloc(cls, MESSAGE_FIELDS) : NULL;
    if (message == NULL) {
        Py_DECREF(attribute);
        Py_XDECREF(data);
        Py_XDECREF(id);
        Py_XDECREF(where);
        return NULL;
    }
    Py_INCREF(topic);
    Py_INCREF(partition);
    PyTuple_SET_ITEM(message, 0, topic);
    PyTuple_SET_ITEM(message, 1, data);
    PyTuple_SET_ITEM(message, 2, attribute);
    PyTuple_SET_ITEM(message, 3, id);
    PyTuple_SET_ITEM(message, 4, partition);
    PyTuple_SET_ITEM(message, 5, where);
    /* Not tracked by the cyclic garbage collector: a received Message holds a str, bytes,
     * a str or None, two ints and a Partition (a frozen dataclass of two ints), so no reference cycle
     * can pass through it (CPython untracks a plain tuple of atomic items the same way;
     * a Partition is not atomic to it). Tracked, the messages of each fetch set off
     * collections that walk every object of the process: about 40% of the decode's time
     * with 100,000 other objects alive. */
    PyObject_GC_UnTrack(message);
    return message;
}

PyDoc_STRVAR(decode_valid_doc,
"decode_valid(buf, pos, base_offset, topic, partition, message_class, out, control_mark) -> int\n\n"
"Append a message_class(topic, data, attribute, msg_id, partition, offset) to the list ``out``\n"
"for each whole, valid record in ``buf`` (bytes-like) from ``pos`` on (``buf[0]`` is at log offset\n"
"``base_offset``), leaving out control records (attribute bytes == ``control_mark``); return\n"
"where it stopped: the end of ``buf`` or the first record that is not whole and valid.");

static PyObject *decode_records(Py_buffer *view, Py_ssize_t pos, long long base, PyObject *topic, PyObject *partition,
                                PyTypeObject *cls, PyObject *out, const char *control, Py_ssize_t control_len);

static PyObject *decode_valid(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_nargs("decode_valid", nargs, 8))
        return NULL;
    PyObject *buf = args[0], *topic = args[3], *partition = args[4], *cls = args[5], *out = args[6], *mark = args[7];
    if (!PyList_Check(out) || !PyBytes_Check(mark) || !PyType_Check(cls)
        || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_valid: control_mark must be bytes, message_class a tuple type, out a list");
        return NULL;
    }
    const char *control = PyBytes_AS_STRING(mark);
    Py_ssize_t control_len = PyBytes_GET_SIZE(mark);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    long long base = PyLong_AsLongLong(args[2]);
    if ((pos == -1 || base == -1) && PyErr_Occurred())
        return NULL;
    /* A buffer export: a bytearray (a fetch reply's body, not copied) cannot be resized
     * while it is held, whatever code a garbage collection in between may run. */
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *stopped = decode_records(&view, pos, base, topic, partition, (PyTypeObject *)cls, out, control, control_len);
    PyBuffer_Release(&view);
    return stopped;
}

static PyObject *decode_records(Py_buffer *view, Py_ssize_t pos, long long base, PyObject *topic, PyObject *partition,
                                PyTypeObject *cls, PyObject *out, const char *control, Py_ssize_t control_len)
{
    const unsigned char *data = (const unsigned char *)view->buf;
    Py_ssize_t end = view->len;
    if (pos < 0 || pos > end) {
        PyErr_SetString(PyExc_ValueError, "decode_valid: pos outside buf");
        return NULL;
    }
    while (end - pos >= HEADER_SIZE) {
        const unsigned char *header = data + pos;
        int32_t length = (int32_t)be32(header);
        uint32_t crc = be32(header + 4);
        uint32_t flag = be32(header + 16);
        /* A record that is not whole and valid is record.py's to reject (or to wait for). */
        if (length < 0 || (flag & ~FLAG_HAS_ATTRIBUTE) || length > end - pos - HEADER_SIZE)
            break;
        const unsigned char *payload = header + HEADER_SIZE;
        if ((crc32(0L, payload, (uInt)length) & 0x7FFFFFFFu) != crc)
            break;
        PyObject *attribute = Py_None;
        const unsigned char *data_start = payload;
        Py_ssize_t data_len = length;
        if (flag) {
            int32_t attr_len = length >= 4 ? (int32_t)be32(payload) : -1;
            if (attr_len < 0 || attr_len > length - 4)
                break;
            if (attr_len == control_len && memcmp(payload + 4, control, (size_t)control_len) == 0) {
                pos += HEADER_SIZE + length; /* a control record: no message, the end moves past it */
                continue;
            }
            attribute = PyUnicode_DecodeUTF8((const char *)payload + 4, attr_len, NULL);
            if (attribute == NULL) { /* not UTF-8: record.py says so */
                PyErr_Clear();
                break;
            }
            data_start = payload + 4 + attr_len;
            data_len = length - 4 - attr_len;
        } else {
            Py_INCREF(Py_None);
        }
        PyObject *message = new_message(cls, topic, partition, attribute, data_start, data_len,
                                        be64(header + 8), base + (long long)pos);
        if (message == NULL)
            return NULL;
        int failed = PyList_Append(out, message);
        Py_DECREF(message);
        if (failed)
            return NULL;
        pos += HEADER_SIZE + length;
    }
    return PyLong_FromSsize_t(pos);
}

/* --- The broker's record walks (record.py's _scan and stamp_msg_ids) ------------------------- */

/* A contiguous byte view of ``obj`` (writable if asked); 0 without an error set when there is
 * none (not a buffer, read-only, items wider than a byte): the caller hands obj back to record.py,
 * which raises what it raises for it. */
static int byte_view(PyObject *obj, Py_buffer *view, int writable)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (view->itemsize != 1) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* ``obj`` as an int64 in *value (LLONG_MAX or LLONG_MIN past either end, *overflow then set);
 * 0 without an error set when it is no int: the caller hands it back to record.py. */
static int int64_arg(PyObject *obj, long long *value, int *overflow)
{
    *value = PyLong_AsLongLongAndOverflow(obj, overflow);
    if (*value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (*overflow)
        *value = *overflow > 0 ? LLONG_MAX : LLONG_MIN;
    return 1;
}

PyDoc_STRVAR(scan_valid_doc,
"scan_valid(buf, max_message_size, attributes_utf8) -> (length, count) or None\n\n"
"record._scan compiled: the length and record count of the longest prefix of ``buf`` (bytes-like)\n"
"whose records follow the record rules (length 0..max_message_size, known flag bits, a positive\n"
"CRC that matches, an attribute block that fits, UTF-8 when ``attributes_utf8``); None when\n"
"``buf`` is not a contiguous byte buffer (record.py walks it).");

/* Whether the attribute bytes are UTF-8: 1 yes, 0 no, -1 another error (set). Needs the GIL. */
static int is_utf8(const unsigned char *attr, int32_t attr_len)
{
    PyObject *attribute = PyUnicode_DecodeUTF8((const char *)attr, attr_len, NULL);
    if (attribute != NULL) {
        Py_DECREF(attribute);
        return 1;
    }
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        return -1;
    PyErr_Clear();
    return 0;
}

/* record._scan's loop over data[0:end]: the end of the valid prefix, its record count in
 * *count; -1 when is_utf8 failed otherwise (error set). Without ``attributes_utf8`` it calls
 * nothing of Python and may run with the GIL released. */
static Py_ssize_t scan_records(const unsigned char *data, Py_ssize_t end, long long max_size, int attributes_utf8,
                               Py_ssize_t *count)
{
    Py_ssize_t pos = 0;
    *count = 0;
    /* Every read below is inside [pos, pos + HEADER_SIZE + length), checked against end first. */
    while (end - pos >= HEADER_SIZE) {
        const unsigned char *header = data + pos;
        int32_t length = (int32_t)be32(header);
        uint32_t crc = be32(header + 4);
        uint32_t flag = be32(header + 16);
        if (length < 0 || (long long)length > max_size || (flag & ~FLAG_HAS_ATTRIBUTE) || (crc & 0x80000000u))
            break;
        if (length > end - pos - HEADER_SIZE)
            break;
        const unsigned char *payload = header + HEADER_SIZE;
        if ((crc32(0L, payload, (uInt)length) & 0x7FFFFFFFu) != crc)
            break;
        if (flag) {
            /* The flag is outside the CRC: an attribute block that cannot be one means a damaged header. */
            if (length < 4)
                break;
            int32_t attr_len = (int32_t)be32(payload);
            if (attr_len < 0 || attr_len > length - 4)
                break;
            if (attributes_utf8) {
                int utf8 = is_utf8(payload + 4, attr_len);
                if (utf8 < 0)
                    return -1;
                if (!utf8)
                    break;
            }
        }
        pos += HEADER_SIZE + length;
        (*count)++;
    }
    return pos;
}

/* From this size on a walk without the UTF-8 rule lets other threads run (zlib.crc32 in the
 * pure walk releases the GIL too): recovery and the scrub walk chunks of megabytes in worker
 * threads while the event loop serves. */
#define SCAN_WITHOUT_GIL_BYTES (64 * 1024)

static PyObject *scan_valid(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_nargs("scan_valid", nargs, 3))
        return NULL;
    /* Past int64 either way, the limit is above (or below) every record length alike. */
    int overflow;
    long long max_size;
    if (!int64_arg(args[1], &max_size, &overflow))
        Py_RETURN_NONE;
    int attributes_utf8 = PyObject_IsTrue(args[2]);
    if (attributes_utf8 < 0)
        return NULL;
    /* A buffer export: a bytearray cannot be resized while it is held, GIL released or not. */
    Py_buffer view;
    if (!byte_view(args[0], &view, 0))
        Py_RETURN_NONE;
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t count, pos;
    if (!attributes_utf8 && view.len >= SCAN_WITHOUT_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        pos = scan_records(data, view.len, max_size, 0, &count);
        Py_END_ALLOW_THREADS
    } else {
        pos = scan_records(data, view.len, max_size, attributes_utf8, &count);
    }
    PyBuffer_Release(&view);
    if (pos < 0)
        return NULL;
    return Py_BuildValue("(nn)", pos, count);
}

PyDoc_STRVAR(stamp_ids_doc,
"stamp_ids(buf, first_id) -> int or None\n\n"
"record.stamp_msg_ids compiled: write ids first_id, first_id + 1, ... into the records of the\n"
"writable buffer ``buf`` and return their count; None, with nothing written, when ``buf`` is not\n"
"a whole number of records or an id would not fit an int64 (record.py then does it, and raises).");

static PyObject *stamp_ids(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_nargs("stamp_ids", nargs, 2))
        return NULL;
    int overflow;
    long long first_id;
    if (!int64_arg(args[1], &first_id, &overflow) || overflow) /* record.py raises for it */
        Py_RETURN_NONE;
    Py_buffer view;
    if (!byte_view(args[0], &view, 1))
        Py_RETURN_NONE;
    unsigned char *data = (unsigned char *)view.buf;
    Py_ssize_t pos = 0, count = 0, end = view.len;
    /* First the walk alone: nothing is written unless every header is inside buf and the
     * records end exactly at its end. */
    while (end - pos >= HEADER_SIZE) {
        int32_t length = (int32_t)be32(data + pos);
        if (length < 0 || length > end - pos - HEADER_SIZE)
            break;
        pos += HEADER_SIZE + length;
        count++;
    }
    if (pos != end || (count > 0 && first_id > INT64_MAX - (long long)(count - 1))) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    pos = 0;
    for (Py_ssize_t n = 0; n < count; n++) {
        uint64_t id = (uint64_t)(first_id + (long long)n);
        unsigned char *at = data + pos + 8;
        for (int i = 7; i >= 0; i--) {
            at[i] = (unsigned char)(id & 0xFFu);
            id >>= 8;
        }
        pos += HEADER_SIZE + (int32_t)be32(data + pos);
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(count);
}

static PyMethodDef speedups_methods[] = {
    {"decode_valid", (PyCFunction)(void (*)(void))decode_valid, METH_FASTCALL, decode_valid_doc},
    {"scan_valid", (PyCFunction)(void (*)(void))scan_valid, METH_FASTCALL, scan_valid_doc},
    {"stamp_ids", (PyCFunction)(void (*)(void))stamp_ids, METH_FASTCALL, stamp_ids_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "metaq._speedups",
    "Compiled record walks (optional; codec.py and record.py fall back to pure Python).",
    -1, speedups_methods,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    return PyModule_Create(&speedups_module);
}
