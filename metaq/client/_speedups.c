/* The client's compiled decode of fetched records into Messages (optional).
 *
 * codec.decode_messages calls decode_plain() when this module is built (setup.py, during
 * scripts/setup.sh) and falls back to pure Python (record.decode_columns) when it is not.
 * It does only the common case: records without an attribute whose header and CRC are
 * right. It stops at the first record that is anything else (an attribute block, a control
 * record, a bad header, a CRC mismatch, a partial tail) and returns its position, so the
 * record rules and their error messages stay in one place, metaq/record.py, which
 * decodes that record. The record format is record.py's: a 20-byte big-endian header
 * (int32 length, int32 crc32(payload) & 0x7fffffff, int64 msg_id, int32 flag), then the
 * payload.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <zlib.h>

#define HEADER_SIZE 20
#define MESSAGE_FIELDS 6 /* Message: topic, data, attribute, id, partition, offset */

static inline uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline int64_t be64(const unsigned char *p)
{
    return (int64_t)(((uint64_t)be32(p) << 32) | (uint64_t)be32(p + 4));
}

/* Message(topic, data, None, msg_id, partition, offset), built as tuple.__new__ does. */
static PyObject *new_message(PyTypeObject *cls, PyObject *topic, PyObject *partition,
                             const unsigned char *payload, Py_ssize_t length, int64_t msg_id, long long offset)
{
    PyObject *data = PyBytes_FromStringAndSize((const char *)payload, length);
    PyObject *id = data ? PyLong_FromLongLong(msg_id) : NULL;
    PyObject *where = id ? PyLong_FromLongLong(offset) : NULL;
    PyObject *message = where ? cls->tp_alloc(cls, MESSAGE_FIELDS) : NULL;
    if (message == NULL) {
        Py_XDECREF(data);
        Py_XDECREF(id);
        Py_XDECREF(where);
        return NULL;
    }
    Py_INCREF(topic);
    Py_INCREF(Py_None);
    Py_INCREF(partition);
    PyTuple_SET_ITEM(message, 0, topic);
    PyTuple_SET_ITEM(message, 1, data);
    PyTuple_SET_ITEM(message, 2, Py_None);
    PyTuple_SET_ITEM(message, 3, id);
    PyTuple_SET_ITEM(message, 4, partition);
    PyTuple_SET_ITEM(message, 5, where);
    /* Not tracked by the cyclic garbage collector: a received Message holds a str, bytes,
     * None, two ints and a Partition (a frozen dataclass of two ints), so no reference cycle
     * can pass through it (CPython untracks a plain tuple of atomic items the same way;
     * a Partition is not atomic to it). Tracked, the messages of each fetch set off
     * collections that walk every object of the process: about 40% of the decode's time
     * with 100,000 other objects alive. */
    PyObject_GC_UnTrack(message);
    return message;
}

PyDoc_STRVAR(decode_plain_doc,
"decode_plain(buf, pos, base_offset, topic, partition, message_class, out) -> int\n\n"
"Append a message_class(topic, data, None, msg_id, partition, offset) to the list ``out``\n"
"for each whole, CRC-valid record without an attribute in bytes ``buf`` from ``pos`` on\n"
"(``buf[0]`` is at log offset ``base_offset``); return where it stopped: the end of ``buf``\n"
"or the first record it leaves to record.py (a partial tail, an attribute, a bad record).");

static PyObject *decode_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "decode_plain takes 7 arguments");
        return NULL;
    }
    PyObject *buf = args[0], *topic = args[3], *partition = args[4], *cls = args[5], *out = args[6];
    if (!PyBytes_Check(buf) || !PyList_Check(out) || !PyType_Check(cls)
        || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "decode_plain: buf must be bytes, message_class a tuple type, out a list");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    long long base = PyLong_AsLongLong(args[2]);
    if ((pos == -1 || base == -1) && PyErr_Occurred())
        return NULL;
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(buf);
    Py_ssize_t end = PyBytes_GET_SIZE(buf);
    if (pos < 0 || pos > end) {
        PyErr_SetString(PyExc_ValueError, "decode_plain: pos outside buf");
        return NULL;
    }
    while (end - pos >= HEADER_SIZE) {
        const unsigned char *header = data + pos;
        int32_t length = (int32_t)be32(header);
        uint32_t crc = be32(header + 4);
        uint32_t flag = be32(header + 16);
        /* Anything but a plain, whole record is record.py's to decode or to reject. */
        if (length < 0 || flag != 0 || length > end - pos - HEADER_SIZE)
            break;
        const unsigned char *payload = header + HEADER_SIZE;
        if ((crc32(0L, payload, (uInt)length) & 0x7FFFFFFFu) != crc)
            break;
        PyObject *message = new_message((PyTypeObject *)cls, topic, partition, payload, length,
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
    {"decode_plain", (PyCFunction)(void (*)(void))decode_plain, METH_FASTCALL, decode_plain_doc},
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
