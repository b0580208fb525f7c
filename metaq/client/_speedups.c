/* The client's compiled decode of fetched records into Messages (optional).
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
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "decode_valid takes 8 arguments");
        return NULL;
    }
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

static PyMethodDef speedups_methods[] = {
    {"decode_valid", (PyCFunction)(void (*)(void))decode_valid, METH_FASTCALL, decode_valid_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "metaq.client._speedups",
    "The client's compiled record decode (optional; codec.py falls back to pure Python).",
    -1, speedups_methods,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    return PyModule_Create(&speedups_module);
}
