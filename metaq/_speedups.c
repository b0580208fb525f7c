/* The compiled hot paths (optional; each user falls back to its pure Python when this module is
 * not built): the client's decode of fetched records into Messages (decode_valid), the broker's
 * check of a put or a fetch reply (scan_valid) and msg id stamping (stamp_ids), and the request
 * path both sides share: a whole frame out of the receive buffer (frame_at), a frame packed
 * (pack_frame), a request built from its header (request_from); see their section below.
 *
 * scan_valid and stamp_ids are record.py's _scan and stamp_msg_ids, chosen by record.py when
 * this module is built; they return exactly what those return, and stamp_ids hands anything it
 * would not write (not whole records, an id past int64) back to record.py, which raises.
 *
 * codec.encode_messages calls encode_plain() for a put of messages without attributes (each
 * record's header and CRC written in one pass, no per-message Python); anything else, and
 * any message that is not a plain Message with bytes data, is left to codec.py (None).
 *
 * The Spark sink encodes Arrow batches with encode_columns (codec.encode_columns): the value
 * and attribute columns are read in place through their buffers (offsets, data, validity), so
 * no Python object is made per row; key_crc32 hashes a key column the same way for placement.
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

/* CRC-32 (zlib's: reflected polynomial 0xEDB88320) of short payloads by slicing-by-8, eight
 * table lookups per 8 bytes: zlib 1.2's crc32 costs ~120 ns for a 100-byte payload (its
 * braided loop starts paying off only on longer buffers), this ~50 ns, and every record's CRC
 * is computed on a put three times (the client's encode, the master's check, the slave's
 * check). From SHORT_CRC_LIMIT bytes on, zlib is faster: it is used there. Bytes are read one
 * by one (no unaligned or endian-dependent loads); the tables are built once, at import, and
 * only read afterwards (so a walk without the GIL may use them). */
#define SHORT_CRC_LIMIT 256
static uint32_t crc_tables[8][256];

static void build_crc_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc_tables[0][i] = c;
    }
    for (int i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_tables[t][i] = (crc_tables[t - 1][i] >> 8) ^ crc_tables[0][crc_tables[t - 1][i] & 0xFFu];
}

/* zlib.crc32(payload[:length]), the value record.py stores and checks (before its & 0x7fffffff). */
static inline uint32_t payload_crc(const unsigned char *p, Py_ssize_t length)
{
    if (length >= SHORT_CRC_LIMIT)
        return (uint32_t)crc32(0L, p, (uInt)length);
    uint32_t c = 0xFFFFFFFFu;
    Py_ssize_t n = length;
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t a = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_tables[7][a & 0xFFu] ^ crc_tables[6][(a >> 8) & 0xFFu] ^ crc_tables[5][(a >> 16) & 0xFFu]
            ^ crc_tables[4][a >> 24] ^ crc_tables[3][p[4]] ^ crc_tables[2][p[5]] ^ crc_tables[1][p[6]]
            ^ crc_tables[0][p[7]];
    }
    for (; n > 0; p++, n--)
        c = crc_tables[0][(c ^ *p) & 0xFFu] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
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
        if ((payload_crc(payload, length) & 0x7FFFFFFFu) != crc)
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
        if ((payload_crc(payload, length) & 0x7FFFFFFFu) != crc)
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

/* --- The request path: frames (protocol/frames.py) and requests (protocol/messages.py) ---------
 *
 * frame_at, pack_frame and request_from are the common case of FrameDecoder's binary frame,
 * encode_frame and parse_request, chosen by those modules when this module is built. Each
 * answers only what it can answer exactly as the Python code does and returns None for
 * everything else (a frame not yet whole, a limit passed, a header msgpack that is not a plain
 * map of the types below, a request with a missing or ill-typed field): the Python code then
 * runs, so every event, error and message stays its own. The wire format is frames.py's:
 * uint8 magic 0xCA, uint8 version 1, uint32 header_len, uint32 body_len (big-endian), a
 * msgpack map header, the raw body. */

#define FRAME_MAGIC 0xCA
#define FRAME_VERSION 1
#define FRAME_PREFIX_SIZE 10
/* Deeper headers go to msgpack (requests and replies nest one level: a slave's ``replica``). */
#define MSGPACK_MAX_DEPTH 8

/* A new instance of the (data)class ``cls`` whose attributes are ``attributes`` (a dict, taken
 * over): what its generated __init__ does for a class without __post_init__, without the
 * frozen dataclass's object.__setattr__ per field. */
static PyObject *instance_with(PyObject *cls, PyObject *attributes)
{
    /* object.__new__(cls): what the class's own __new__ is (checked by its Python user). */
    PyObject *no_args = PyTuple_New(0);
    PyObject *instance = no_args ? PyBaseObject_Type.tp_new((PyTypeObject *)cls, no_args, NULL) : NULL;
    Py_XDECREF(no_args);
    if (instance == NULL || PyObject_GenericSetDict(instance, attributes, NULL) < 0) {
        Py_XDECREF(instance);
        Py_DECREF(attributes);
        return NULL;
    }
    Py_DECREF(attributes);
    return instance;
}

/* msgpack reading, the subset headers use: nil, bools, ints, str, bin, arrays and maps with
 * str keys. NULL with no error set: something else (msgpack decides); NULL with an error set:
 * out of memory. The results equal msgpack.unpackb(raw=False, strict_map_key=True)'s: lists
 * for arrays, map keys interned as msgpack does, the last of duplicate keys kept. */
typedef struct {
    const unsigned char *at, *end;
} reader;

static int take(reader *r, Py_ssize_t n, const unsigned char **start)
{
    if (r->end - r->at < n)
        return 0;
    *start = r->at;
    r->at += n;
    return 1;
}

static int read_uint(reader *r, int size, uint64_t *value)
{
    const unsigned char *p;
    if (!take(r, size, &p))
        return 0;
    *value = 0;
    for (int i = 0; i < size; i++)
        *value = (*value << 8) | p[i];
    return 1;
}

static PyObject *read_object(reader *r, int depth);

static PyObject *read_str(reader *r, uint64_t length)
{
    const unsigned char *p;
    if (length > (uint64_t)(r->end - r->at) || !take(r, (Py_ssize_t)length, &p))
        return NULL;
    PyObject *str = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)length, NULL);
    if (str == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear(); /* msgpack raises for it: its message is the one a peer gets */
    return str;
}

static PyObject *read_container(reader *r, uint64_t count, int is_map, int depth)
{
    /* Every item takes a byte at least: a count past what is left is msgpack's to refuse. */
    if (depth >= MSGPACK_MAX_DEPTH || count > (uint64_t)(r->end - r->at))
        return NULL;
    if (!is_map) {
        PyObject *list = PyList_New((Py_ssize_t)count);
        for (Py_ssize_t i = 0; list != NULL && i < (Py_ssize_t)count; i++) {
            PyObject *item = read_object(r, depth + 1);
            if (item == NULL)
                Py_CLEAR(list);
            else
                PyList_SET_ITEM(list, i, item);
        }
        return list;
    }
    PyObject *map = PyDict_New();
    for (uint64_t i = 0; map != NULL && i < count; i++) {
        unsigned char kind = r->at < r->end ? *r->at : 0;
        uint64_t length = 0;
        int is_str = 1;
        if (kind >= 0xa0 && kind <= 0xbf) {
            r->at++;
            length = kind & 0x1f;
        } else if (kind >= 0xd9 && kind <= 0xdb) {
            r->at++;
            is_str = read_uint(r, 1 << (kind - 0xd9), &length);
        } else {
            is_str = 0; /* strict_map_key: bytes keys are allowed there, but not taken here */
        }
        PyObject *key = is_str ? read_str(r, length) : NULL;
        if (key != NULL)
            PyUnicode_InternInPlace(&key);
        PyObject *value = key != NULL ? read_object(r, depth + 1) : NULL;
        if (value == NULL || PyDict_SetItem(map, key, value) < 0)
            Py_CLEAR(map);
        Py_XDECREF(key);
        Py_XDECREF(value);
    }
    return map;
}

static PyObject *read_object(reader *r, int depth)
{
    const unsigned char *p;
    uint64_t value;
    if (!take(r, 1, &p))
        return NULL;
    unsigned char kind = *p;
    if (kind <= 0x7f)
        return PyLong_FromLong(kind);
    if (kind >= 0xe0)
        return PyLong_FromLong((long)(signed char)kind);
    if (kind <= 0x8f)
        return read_container(r, kind & 0x0f, 1, depth);
    if (kind <= 0x9f)
        return read_container(r, kind & 0x0f, 0, depth);
    if (kind <= 0xbf)
        return read_str(r, kind & 0x1f);
    switch (kind) {
    case 0xc0:
        Py_RETURN_NONE;
    case 0xc2:
        Py_RETURN_FALSE;
    case 0xc3:
        Py_RETURN_TRUE;
    case 0xc4: case 0xc5: case 0xc6: /* bin 8/16/32 */
        if (!read_uint(r, 1 << (kind - 0xc4), &value) || value > (uint64_t)(r->end - r->at) || !take(r, (Py_ssize_t)value, &p))
            return NULL;
        return PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)value);
    case 0xcc: case 0xcd: case 0xce: case 0xcf: /* uint 8/16/32/64 */
        if (!read_uint(r, 1 << (kind - 0xcc), &value))
            return NULL;
        return PyLong_FromUnsignedLongLong(value);
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: { /* int 8/16/32/64 */
        int size = 1 << (kind - 0xd0);
        if (!read_uint(r, size, &value))
            return NULL;
        if (size < 8 && (value >> (size * 8 - 1)))
            value |= ~(uint64_t)0 << (size * 8); /* sign-extend */
        return PyLong_FromLongLong((long long)value);
    }
    case 0xd9: case 0xda: case 0xdb: /* str 8/16/32 */
        if (!read_uint(r, 1 << (kind - 0xd9), &value))
            return NULL;
        return read_str(r, value);
    case 0xdc: case 0xdd: /* array 16/32 */
        if (!read_uint(r, kind == 0xdc ? 2 : 4, &value))
            return NULL;
        return read_container(r, value, 0, depth);
    case 0xde: case 0xdf: /* map 16/32 */
        if (!read_uint(r, kind == 0xde ? 2 : 4, &value))
            return NULL;
        return read_container(r, value, 1, depth);
    default: /* floats, ext types: msgpack's */
        return NULL;
    }
}

/* The frame header at data[0:length] as a dict, when it is one map of the subset above and
 * nothing after it; NULL otherwise (an error set only when out of memory). */
static PyObject *read_header(const unsigned char *data, Py_ssize_t length)
{
    reader r = {data, data + length};
    if (length == 0 || !((*data >= 0x80 && *data <= 0x8f) || *data == 0xde || *data == 0xdf))
        return NULL; /* not a map: FrameDecoder's BadFrame */
    PyObject *header = read_object(&r, 0);
    if (header != NULL && r.at != r.end)
        Py_CLEAR(header); /* bytes after the map: msgpack's ExtraData */
    return header;
}

PyDoc_STRVAR(frame_at_doc,
"frame_at(buf, pos, max_header, max_body, frame_class) -> (frame, end) or None\n\n"
"FrameDecoder's whole binary frame at ``buf[pos:]`` (a bytearray) within the limits, with a\n"
"header map of nil, bools, ints, str, bin, arrays and maps: frame_class(header, body) (body a\n"
"bytearray copy) and where the next frame starts. None for anything else: the decoder's own\n"
"code runs (waits for more, announces, breaks, skips or reports a BadFrame).");

static PyObject *frame_at(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_nargs("frame_at", nargs, 5))
        return NULL;
    PyObject *buf = args[0], *cls = args[4];
    if (!PyByteArray_Check(buf) || !PyType_Check(cls))
        Py_RETURN_NONE;
    int overflow;
    long long pos, max_header, max_body;
    if (!int64_arg(args[1], &pos, &overflow) || !int64_arg(args[2], &max_header, &overflow)
        || !int64_arg(args[3], &max_body, &overflow))
        Py_RETURN_NONE;
    const unsigned char *data = (const unsigned char *)PyByteArray_AS_STRING(buf);
    Py_ssize_t end = PyByteArray_GET_SIZE(buf);
    if (pos < 0 || end - pos < FRAME_PREFIX_SIZE)
        Py_RETURN_NONE;
    const unsigned char *prefix = data + pos;
    long long header_len = be32(prefix + 2), body_len = be32(prefix + 6);
    if (prefix[0] != FRAME_MAGIC || prefix[1] != FRAME_VERSION || header_len > max_header || body_len > max_body
        || end - pos - FRAME_PREFIX_SIZE < header_len + body_len)
        Py_RETURN_NONE;
    PyObject *header = read_header(prefix + FRAME_PREFIX_SIZE, (Py_ssize_t)header_len);
    if (header == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    /* A copy: the decoder's buffer moves on (and is compacted) while the request is served. */
    const unsigned char *body_start = prefix + FRAME_PREFIX_SIZE + header_len;
    PyObject *body = PyByteArray_FromStringAndSize((const char *)body_start, (Py_ssize_t)body_len);
    PyObject *attributes = body ? Py_BuildValue("{sNsN}", "header", header, "body", body) : NULL;
    if (attributes == NULL) {
        if (body == NULL)
            Py_DECREF(header);
        return NULL;
    }
    PyObject *frame = instance_with(cls, attributes);
    if (frame == NULL)
        return NULL;
    return Py_BuildValue("(Nn)", frame, (Py_ssize_t)(pos + FRAME_PREFIX_SIZE + header_len + body_len));
}

/* msgpack writing, the same subset as reading plus tuples (as arrays), exact types only, byte
 * for byte msgpack.packb(use_bin_type=True)'s choice of each format. */
typedef struct {
    unsigned char *at; /* NULL: only count (packed_size) */
    Py_ssize_t size;
} writer;

static void put_bytes(writer *w, const void *bytes, Py_ssize_t n)
{
    if (w->at != NULL) {
        memcpy(w->at, bytes, (size_t)n);
        w->at += n;
    }
    w->size += n;
}

static void put_kind_uint(writer *w, unsigned char kind, uint64_t value, int size)
{
    unsigned char out[9];
    out[0] = kind;
    for (int i = size; i >= 1; i--) {
        out[i] = (unsigned char)(value & 0xFF);
        value >>= 8;
    }
    put_bytes(w, out, 1 + size);
}

/* A length-prefixed item: the fix form below ``fix_limit`` (0: none), then 8/16/32-bit lengths
 * with kinds ``kind8`` (0: no 8-bit form), kind16, kind32. */
static int put_length(writer *w, Py_ssize_t n, unsigned char fix, Py_ssize_t fix_limit, unsigned char kind8,
                      unsigned char kind16, unsigned char kind32)
{
    if (n < fix_limit) {
        unsigned char one = (unsigned char)(fix | n);
        put_bytes(w, &one, 1);
    } else if (kind8 && n < 0x100) {
        put_kind_uint(w, kind8, (uint64_t)n, 1);
    } else if (n < 0x10000) {
        put_kind_uint(w, kind16, (uint64_t)n, 2);
    } else if ((uint64_t)n <= 0xFFFFFFFFu) {
        put_kind_uint(w, kind32, (uint64_t)n, 4);
    } else {
        return 0;
    }
    return 1;
}

static void put_be32(unsigned char *at, uint32_t value)
{
    at[0] = (unsigned char)(value >> 24);
    at[1] = (unsigned char)(value >> 16);
    at[2] = (unsigned char)(value >> 8);
    at[3] = (unsigned char)value;
}

static void put_int(writer *w, long long d)
{
    /* msgpack's pack_template.h, msgpack_pack_real_int64 */
    if (d < -(1LL << 5)) {
        if (d < -(1LL << 15))
            put_kind_uint(w, d < -(1LL << 31) ? 0xd3 : 0xd2, (uint64_t)d, d < -(1LL << 31) ? 8 : 4);
        else
            put_kind_uint(w, d < -(1LL << 7) ? 0xd1 : 0xd0, (uint64_t)d, d < -(1LL << 7) ? 2 : 1);
    } else if (d < (1LL << 7)) {
        unsigned char one = (unsigned char)(d & 0xFF);
        put_bytes(w, &one, 1);
    } else if (d < (1LL << 16)) {
        put_kind_uint(w, d < (1LL << 8) ? 0xcc : 0xcd, (uint64_t)d, d < (1LL << 8) ? 1 : 2);
    } else {
        put_kind_uint(w, d < (1LL << 32) ? 0xce : 0xcf, (uint64_t)d, d < (1LL << 32) ? 4 : 8);
    }
}

/* 1: written (or counted); 0: not of the subset (no error set); -1: an error set. */
static int put_object(writer *w, PyObject *obj, int depth)
{
    if (depth >= MSGPACK_MAX_DEPTH)
        return 0;
    if (obj == Py_None) {
        put_bytes(w, "\xc0", 1);
    } else if (obj == Py_True || obj == Py_False) {
        put_bytes(w, obj == Py_True ? "\xc3" : "\xc2", 1);
    } else if (PyLong_CheckExact(obj)) {
        int overflow;
        long long d = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (d == -1 && PyErr_Occurred())
            return -1;
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(obj);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear(); /* past uint64: msgpack raises for it */
                return 0;
            }
            put_kind_uint(w, 0xcf, u, 8);
        } else if (overflow < 0) {
            return 0;
        } else {
            put_int(w, d);
        }
    } else if (PyUnicode_CheckExact(obj)) {
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(obj, &n);
        if (utf8 == NULL) {
            PyErr_Clear(); /* surrogates: msgpack's error */
            return 0;
        }
        if (!put_length(w, n, 0xa0, 32, 0xd9, 0xda, 0xdb))
            return 0;
        put_bytes(w, utf8, n);
    } else if (PyBytes_CheckExact(obj)) {
        Py_ssize_t n = PyBytes_GET_SIZE(obj);
        if (!put_length(w, n, 0, 0, 0xc4, 0xc5, 0xc6))
            return 0;
        put_bytes(w, PyBytes_AS_STRING(obj), n);
    } else if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
        if (!put_length(w, n, 0x90, 16, 0, 0xdc, 0xdd))
            return 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            /* A list is not changed here: put_object runs no Python code. */
            int done = put_object(w, PySequence_Fast_GET_ITEM(obj, i), depth + 1);
            if (done <= 0)
                return done;
        }
    } else if (PyDict_CheckExact(obj)) {
        Py_ssize_t n = PyDict_GET_SIZE(obj), i = 0;
        PyObject *key, *value;
        if (!put_length(w, n, 0x80, 16, 0, 0xde, 0xdf))
            return 0;
        while (PyDict_Next(obj, &i, &key, &value)) {
            int done = put_object(w, key, depth + 1);
            if (done > 0)
                done = put_object(w, value, depth + 1);
            if (done <= 0)
                return done;
        }
    } else {
        return 0; /* floats, other types, subclasses: msgpack's (or its error) */
    }
    return 1;
}

PyDoc_STRVAR(pack_frame_doc,
"pack_frame(header, body) -> bytes or None\n\n"
"frames.encode_frame compiled: prefix, msgpack header, body, the same bytes; None when the\n"
"header holds anything but nil, bools, ints, str, bytes, lists, tuples and dicts (exact types)\n"
"or the body is not a contiguous byte buffer (encode_frame packs it with msgpack).");

static PyObject *pack_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_nargs("pack_frame", nargs, 2))
        return NULL;
    PyObject *header = args[0];
    if (!PyDict_CheckExact(header))
        Py_RETURN_NONE;
    writer count = {NULL, 0};
    int done = put_object(&count, header, 0);
    if (done <= 0) {
        if (done < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    Py_buffer body;
    if (!byte_view(args[1], &body, 0))
        Py_RETURN_NONE;
    if (count.size > 0xFFFFFFFFLL || body.len > 0xFFFFFFFFLL) { /* PREFIX.pack raises for it */
        PyBuffer_Release(&body);
        Py_RETURN_NONE;
    }
    PyObject *frame = PyBytes_FromStringAndSize(NULL, FRAME_PREFIX_SIZE + count.size + body.len);
    if (frame != NULL) {
        unsigned char *out = (unsigned char *)PyBytes_AS_STRING(frame);
        out[0] = FRAME_MAGIC;
        out[1] = FRAME_VERSION;
        put_be32(out + 2, (uint32_t)count.size);
        put_be32(out + 6, (uint32_t)body.len);
        writer w = {out + FRAME_PREFIX_SIZE, 0};
        put_object(&w, header, 0); /* the same walk as counted: nothing ran in between */
        memcpy(out + FRAME_PREFIX_SIZE + count.size, body.buf, (size_t)body.len);
    }
    PyBuffer_Release(&body);
    return frame;
}

PyDoc_STRVAR(request_from_doc,
"request_from(cls, fields, header, body) -> request or None\n\n"
"messages.parse_request's common case compiled: ``cls`` (a Request dataclass whose __init__ only\n"
"sets its fields) with opaque, body, origin None and each of ``fields`` ((name, kind, required,\n"
"default), as messages._fields gives them) from ``header``: None on the wire or absent takes\n"
"the default. None when the opaque is not an int or a field is missing or not of its kind:\n"
"parse_request says which.");

/* messages._is_kind: isinstance, but a bool is no int. 1 yes, 0 no, -1 error. */
static int is_kind(PyObject *value, PyObject *kind)
{
    if (kind == (PyObject *)&PyLong_Type)
        return PyLong_Check(value) && !PyBool_Check(value);
    if (kind == (PyObject *)&PyUnicode_Type)
        return PyUnicode_Check(value);
    if (kind == (PyObject *)&PyDict_Type)
        return PyDict_Check(value);
    return PyObject_IsInstance(value, kind);
}

static PyObject *request_from(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_nargs("request_from", nargs, 4))
        return NULL;
    PyObject *cls = args[0], *fields = args[1], *header = args[2], *body = args[3];
    /* An exact dict: a subclass's own get() is what parse_request calls. */
    if (!PyType_Check(cls) || !PyTuple_Check(fields) || !PyDict_CheckExact(header))
        Py_RETURN_NONE;
    PyObject *opaque = PyDict_GetItemString(header, "opaque"); /* borrowed */
    if (opaque == NULL || !PyLong_Check(opaque) || PyBool_Check(opaque))
        Py_RETURN_NONE;
    PyObject *attributes = Py_BuildValue("{sOsOsO}", "opaque", opaque, "body", body, "origin", Py_None);
    if (attributes == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *spec = PyTuple_GET_ITEM(fields, i);
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 4) {
            Py_DECREF(attributes);
            Py_RETURN_NONE;
        }
        PyObject *name = PyTuple_GET_ITEM(spec, 0), *kind = PyTuple_GET_ITEM(spec, 1);
        PyObject *value = PyDict_GetItemWithError(header, name); /* borrowed */
        int ok;
        if (value == NULL && PyErr_Occurred()) {
            ok = -1;
        } else if (value == NULL || value == Py_None) {
            ok = !PyObject_IsTrue(PyTuple_GET_ITEM(spec, 2)); /* a required field is missing */
            value = PyTuple_GET_ITEM(spec, 3);
        } else {
            ok = is_kind(value, kind);
        }
        if (ok > 0)
            ok = PyDict_SetItem(attributes, name, value) < 0 ? -1 : 1;
        if (ok <= 0) {
            Py_DECREF(attributes);
            if (ok < 0)
                return NULL;
            Py_RETURN_NONE;
        }
    }
    return instance_with(cls, attributes);
}

PyDoc_STRVAR(encode_plain_doc,
"encode_plain(messages, cls) -> (body, starts) or None\n\n"
"codec.encode_messages compiled for the common case: the put body of ``messages`` (a list of\n"
"instances of ``cls``, Message) with msg id 0, and each record's start within it; None when any\n"
"message has an attribute, data that is not bytes or longer than an int32, or is not of exactly\n"
"that class (codec.py encodes those, and raises what it raises).");

static PyObject *encode_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_nargs("encode_plain", nargs, 2))
        return NULL;
    PyObject *messages = args[0];
    PyTypeObject *cls = (PyTypeObject *)args[1];
    if (!PyList_Check(messages))
        Py_RETURN_NONE;
    Py_ssize_t count = PyList_GET_SIZE(messages), total = 0;
    /* First every message is checked and the body's size added up, so nothing is built for a
     * list that codec.py must encode anyway. */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *message = PyList_GET_ITEM(messages, i);
        /* Message is a tuple (topic, data, attribute, ...): fields by position. */
        if (Py_TYPE(message) != cls || !PyTuple_Check(message) || PyTuple_GET_SIZE(message) < 3
            || PyTuple_GET_ITEM(message, 2) != Py_None)
            Py_RETURN_NONE;
        PyObject *data = PyTuple_GET_ITEM(message, 1);
        if (!PyBytes_Check(data) || PyBytes_GET_SIZE(data) > INT32_MAX || total > PY_SSIZE_T_MAX - HEADER_SIZE - PyBytes_GET_SIZE(data))
            Py_RETURN_NONE;
        total += HEADER_SIZE + PyBytes_GET_SIZE(data);
    }
    PyObject *body = PyBytes_FromStringAndSize(NULL, total);
    PyObject *starts = body ? PyList_New(count) : NULL;
    if (starts == NULL) {
        Py_XDECREF(body);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *data = PyTuple_GET_ITEM(PyList_GET_ITEM(messages, i), 1);
        Py_ssize_t length = PyBytes_GET_SIZE(data);
        const unsigned char *payload = (const unsigned char *)PyBytes_AS_STRING(data);
        PyObject *start = PyLong_FromSsize_t(pos);
        if (start == NULL) {
            Py_DECREF(body);
            Py_DECREF(starts);
            return NULL;
        }
        PyList_SET_ITEM(starts, i, start);
        unsigned char *header = out + pos;
        /* record.py's header: length, crc32(payload) & 0x7fffffff, msg id 0, flag 0. */
        put_be32(header, (uint32_t)length);
        put_be32(header + 4, payload_crc(payload, length) & 0x7FFFFFFFu);
        memset(header + 8, 0, 12);
        memcpy(header + HEADER_SIZE, payload, (size_t)length);
        pos += HEADER_SIZE + length;
    }
    return Py_BuildValue("(NN)", body, starts);
}

/* --- Arrow columns to records (the Spark sink, codec.encode_columns) --------------------------- */

/* One binary or string column of an Arrow batch, read in place through its buffers: the
 * offsets (int32, or int64 for large_binary/large_string, native byte order as Arrow keeps
 * them), the data, the validity bitmap (absent: no nulls) and the array's offset (its first
 * row's index in the buffers, non-zero for a slice). Nothing per row becomes a Python object. */
typedef struct {
    Py_buffer offsets, data, validity;
    int has_validity, wide;
    long long shift, entries; /* entries: offsets the buffer holds */
} column;

static void column_release(column *c)
{
    PyBuffer_Release(&c->offsets);
    PyBuffer_Release(&c->data);
    if (c->has_validity)
        PyBuffer_Release(&c->validity);
}

/* ``obj``, a tuple (offsets, data, validity or None, shift, offset width 4 or 8), as a column;
 * -1 with ValueError set when it is not one. */
static int column_from(PyObject *obj, column *c)
{
    long long width;
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 5) {
        PyErr_SetString(PyExc_ValueError, "a column is (offsets, data, validity, shift, width)");
        return -1;
    }
    c->shift = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, 3));
    width = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, 4));
    if (PyErr_Occurred())
        return -1;
    if (c->shift < 0 || (width != 4 && width != 8)) {
        PyErr_SetString(PyExc_ValueError, "a column's shift is >= 0 and its offsets are 4 or 8 bytes wide");
        return -1;
    }
    c->wide = width == 8;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(obj, 0), &c->offsets, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(obj, 1), &c->data, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&c->offsets);
        return -1;
    }
    c->has_validity = PyTuple_GET_ITEM(obj, 2) != Py_None;
    if (c->has_validity && PyObject_GetBuffer(PyTuple_GET_ITEM(obj, 2), &c->validity, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&c->offsets);
        PyBuffer_Release(&c->data);
        return -1;
    }
    c->entries = (long long)(c->offsets.len / (c->wide ? 8 : 4));
    return 0;
}

/* Row ``row``'s bytes: 1 (``*at``, ``*length`` set), 0 for null, -1 (ValueError) when the
 * buffers do not hold it: offsets out of order or past the data. */
static int column_item(const column *c, long long row, const unsigned char **at, Py_ssize_t *length)
{
    long long i = c->shift + row;
    if (row < 0 || i + 1 >= c->entries) {
        PyErr_Format(PyExc_ValueError, "row %lld is past the column's %lld rows", row, c->entries - 1 - c->shift);
        return -1;
    }
    if (c->has_validity) {
        if ((i >> 3) >= c->validity.len) {
            PyErr_Format(PyExc_ValueError, "row %lld is past the column's validity bitmap", row);
            return -1;
        }
        if (!((((const unsigned char *)c->validity.buf)[i >> 3] >> (i & 7)) & 1))
            return 0;
    }
    long long start, end;
    if (c->wide) {
        int64_t pair[2];
        memcpy(pair, (const char *)c->offsets.buf + 8 * i, sizeof pair);
        start = pair[0], end = pair[1];
    } else {
        int32_t pair[2];
        memcpy(pair, (const char *)c->offsets.buf + 4 * i, sizeof pair);
        start = pair[0], end = pair[1];
    }
    if (start < 0 || end < start || end > c->data.len) {
        PyErr_Format(PyExc_ValueError, "row %lld: offsets %lld..%lld do not fit the column's %zd data bytes", row, start,
                     end, c->data.len);
        return -1;
    }
    *at = (const unsigned char *)c->data.buf + start;
    *length = (Py_ssize_t)(end - start);
    return 1;
}

/* One row's record: its value and attribute (NULL: none), or -1 with the row named. */
typedef struct {
    const unsigned char *value, *attribute;
    Py_ssize_t value_length, attribute_length, payload;
} row_record;

static int row_at(const column *values, const column *attributes, long long row, long long row_base,
                  long long max_message_size, row_record *r)
{
    int found = column_item(values, row, &r->value, &r->value_length);
    if (found < 0)
        return -1;
    if (found == 0) {
        PyErr_Format(PyExc_ValueError, "row %lld: the value is null (column value is required)", row_base + row);
        return -1;
    }
    r->attribute = NULL;
    r->attribute_length = 0;
    found = attributes ? column_item(attributes, row, &r->attribute, &r->attribute_length) : 0;
    if (found < 0)
        return -1;
    if (found == 0)
        r->attribute = NULL;
    r->payload = r->value_length + (r->attribute ? 4 + r->attribute_length : 0);
    if (r->payload > max_message_size) {
        PyErr_Format(PyExc_ValueError, "row %lld: its record's payload is %zd bytes, more than maxMessageSize (%lld)",
                     row_base + row, r->payload, max_message_size);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(encode_columns_doc,
"encode_columns(values, attributes, rows, start, stop, limit_bytes, limit_count, max_message_size, row_base)\n"
"    -> (body, starts, next)\n\n"
"codec.encode_columns compiled: the put body (msg id 0) of rows ``rows[start:stop]`` (``rows``: a\n"
"buffer of int64 row numbers, or None for the rows start..stop themselves) of the Arrow columns\n"
"``values`` and ``attributes`` (None: no attributes), up to ``limit_count`` records and\n"
"``limit_bytes`` bytes (at least one record); ``starts``: each record's start as native int64\n"
"bytes; ``next``: the position after the last row encoded. ValueError names the row\n"
"(``row_base`` + its number) whose value is null or whose payload exceeds ``max_message_size``.");

static PyObject *encode_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_nargs("encode_columns", nargs, 9))
        return NULL;
    long long start = PyLong_AsLongLong(args[3]), stop = PyLong_AsLongLong(args[4]);
    long long limit_bytes = PyLong_AsLongLong(args[5]), limit_count = PyLong_AsLongLong(args[6]);
    long long max_message_size = PyLong_AsLongLong(args[7]), row_base = PyLong_AsLongLong(args[8]);
    if (PyErr_Occurred())
        return NULL;
    if (max_message_size > INT32_MAX)
        max_message_size = INT32_MAX; /* a record's length is an int32 */
    if (limit_count < 1)
        limit_count = 1; /* at least one record, so a caller's loop always moves on */
    column values, attributes;
    Py_buffer rows_view;
    int have_rows = args[2] != Py_None, have_attributes = args[1] != Py_None;
    PyObject *result = NULL, *body = NULL, *starts = NULL;
    if (column_from(args[0], &values) < 0)
        return NULL;
    if (have_attributes && column_from(args[1], &attributes) < 0) {
        column_release(&values);
        return NULL;
    }
    if (have_rows) {
        if (PyObject_GetBuffer(args[2], &rows_view, PyBUF_C_CONTIGUOUS) < 0)
            goto done_columns;
        if (stop > rows_view.len / 8) {
            PyErr_Format(PyExc_ValueError, "stop %lld is past the %zd rows given", stop, rows_view.len / 8);
            goto done;
        }
    }
    if (start < 0 || stop < start) {
        PyErr_SetString(PyExc_ValueError, "0 <= start <= stop");
        goto done;
    }
    const int64_t *rows = have_rows ? (const int64_t *)rows_view.buf : NULL;
    const column *attrs = have_attributes ? &attributes : NULL;
    row_record r;
    /* First the rows that fit and the body's size, so the body is made once at its size. */
    long long end = start, total = 0;
    for (; end < stop && end - start < limit_count; end++) {
        if (row_at(&values, attrs, rows ? rows[end] : end, row_base, max_message_size, &r) < 0)
            goto done;
        if (end > start && total + HEADER_SIZE + r.payload > limit_bytes)
            break;
        total += HEADER_SIZE + r.payload;
    }
    body = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    starts = body ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(8 * (end - start))) : NULL;
    if (starts == NULL)
        goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(body);
    int64_t *start_at = (int64_t *)PyBytes_AS_STRING(starts);
    long long pos = 0;
    for (long long i = start; i < end; i++) {
        row_at(&values, attrs, rows ? rows[i] : i, row_base, max_message_size, &r); /* checked above */
        unsigned char *header = out + pos, *payload = out + pos + HEADER_SIZE, *data = payload;
        if (r.attribute) {
            put_be32(payload, (uint32_t)r.attribute_length);
            memcpy(payload + 4, r.attribute, (size_t)r.attribute_length);
            data = payload + 4 + r.attribute_length;
        }
        memcpy(data, r.value, (size_t)r.value_length);
        /* record.py's header: length, crc32(payload) & 0x7fffffff, msg id 0, flag. */
        put_be32(header, (uint32_t)r.payload);
        put_be32(header + 4, payload_crc(payload, r.payload) & 0x7FFFFFFFu);
        memset(header + 8, 0, 8);
        put_be32(header + 16, r.attribute ? FLAG_HAS_ATTRIBUTE : 0u);
        start_at[i - start] = (int64_t)pos;
        pos += HEADER_SIZE + r.payload;
    }
    result = Py_BuildValue("(OOL)", body, starts, end);
done:
    if (have_rows)
        PyBuffer_Release(&rows_view);
done_columns:
    Py_XDECREF(body);
    Py_XDECREF(starts);
    column_release(&values);
    if (have_attributes)
        column_release(&attributes);
    return result;
}

PyDoc_STRVAR(key_crc32_doc,
"key_crc32(column, count) -> bytes\n\n"
"codec.key_crc32 compiled: zlib.crc32 of each of the first ``count`` rows of an Arrow binary or\n"
"string column (as encode_columns reads it), -1 for a null row, as native int64 bytes.");

static PyObject *key_crc32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_nargs("key_crc32", nargs, 2))
        return NULL;
    long long count = PyLong_AsLongLong(args[1]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "count >= 0");
        return NULL;
    }
    column keys;
    if (column_from(args[0], &keys) < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(8 * count));
    if (out != NULL) {
        int64_t *crcs = (int64_t *)PyBytes_AS_STRING(out);
        for (long long row = 0; row < count; row++) {
            const unsigned char *at;
            Py_ssize_t length;
            int found = column_item(&keys, row, &at, &length);
            if (found < 0) {
                Py_CLEAR(out);
                break;
            }
            crcs[row] = found ? (int64_t)payload_crc(at, length) : -1;
        }
    }
    column_release(&keys);
    return out;
}

static PyMethodDef speedups_methods[] = {
    {"decode_valid", (PyCFunction)(void (*)(void))decode_valid, METH_FASTCALL, decode_valid_doc},
    {"scan_valid", (PyCFunction)(void (*)(void))scan_valid, METH_FASTCALL, scan_valid_doc},
    {"stamp_ids", (PyCFunction)(void (*)(void))stamp_ids, METH_FASTCALL, stamp_ids_doc},
    {"frame_at", (PyCFunction)(void (*)(void))frame_at, METH_FASTCALL, frame_at_doc},
    {"pack_frame", (PyCFunction)(void (*)(void))pack_frame, METH_FASTCALL, pack_frame_doc},
    {"request_from", (PyCFunction)(void (*)(void))request_from, METH_FASTCALL, request_from_doc},
    {"encode_plain", (PyCFunction)(void (*)(void))encode_plain, METH_FASTCALL, encode_plain_doc},
    {"encode_columns", (PyCFunction)(void (*)(void))encode_columns, METH_FASTCALL, encode_columns_doc},
    {"key_crc32", (PyCFunction)(void (*)(void))key_crc32, METH_FASTCALL, key_crc32_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "metaq._speedups",
    "Compiled record walks and request path (optional; each user falls back to its pure Python).",
    -1, speedups_methods,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    build_crc_tables();
    return PyModule_Create(&speedups_module);
}
