"""The message record: MetaQ's on-disk format, which is also the wire format.

One record, big-endian, 20-byte header then payload::

    int32 length      payload length, header excluded
    int32 checksum    crc32(payload) & 0x7fffffff (MetaQ's, kept positive for Java readers)
    int64 msg_id      assigned by the master when it appends; 0 in a producer's batch
    int32 flag        bit 0: the payload starts with an attribute block
    payload           [int32 attr_len | attr (UTF-8)] if flag & 1, then data

The same bytes travel everywhere: a producer builds records (msg_id 0), the master
stamps ids into them and appends the buffer as it is, a fetch returns a byte range
of the log, and a slave appends that range verbatim. Because nobody re-encodes,
a slave's log stays a byte-identical copy of its master's at the same offsets.
"""

from __future__ import annotations

import struct
import zlib
from typing import Callable, Iterator, NamedTuple

HEADER = struct.Struct(">iiqi")
HEADER_SIZE = HEADER.size  # 20
_HEADER_UNPACK_FROM = HEADER.unpack_from
_CRC32 = zlib.crc32
_ATTR_LEN = struct.Struct(">i")
_MSG_ID = struct.Struct(">q")
_MSG_ID_AT = 8  # byte position of msg_id inside the header

FLAG_HAS_ATTRIBUTE = 1
#: Flag bits a record may carry; the rest are reserved and rejected so that a
#: corrupted header is caught even when its length happens to look plausible.
KNOWN_FLAGS = FLAG_HAS_ATTRIBUTE

DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024


try:  # compiled during setup (setup.py, metaq/_speedups.c); the same results in pure Python without it
    from ._speedups import scan_valid, stamp_ids  # (_scan, stamp_msg_ids); the unit tests run both
except ImportError:
    scan_valid = stamp_ids = None


class RecordError(ValueError):
    """A record that is malformed: bad length, bad checksum, bad attribute block."""


class Record(NamedTuple):
    offset: int
    msg_id: int
    flag: int
    attribute: str | None
    data: bytes

    @property
    def size(self) -> int:
        """Bytes this record takes in the log."""
        return HEADER_SIZE + payload_size(self.attribute, self.data)


def checksum(payload: bytes | memoryview) -> int:
    return zlib.crc32(payload) & 0x7FFFFFFF


def payload_size(attribute: str | None, data: bytes) -> int:
    if attribute is None:
        return len(data)
    return 4 + len(attribute.encode("utf-8")) + len(data)


def encode_payload(data: bytes, attribute: str | None = None) -> tuple[int, bytes]:
    """Return ``(flag, payload)`` for a message body and its optional attribute."""
    if attribute is None:
        return 0, bytes(data)
    attr = attribute.encode("utf-8")
    return FLAG_HAS_ATTRIBUTE, _ATTR_LEN.pack(len(attr)) + attr + data


def decode_payload(flag: int, payload: bytes | memoryview) -> tuple[str | None, bytes]:
    """Split a payload into ``(attribute, data)``; raises RecordError if the block is bad."""
    if not flag & FLAG_HAS_ATTRIBUTE:
        return None, bytes(payload)
    if len(payload) < 4:
        raise RecordError("attribute flag set but payload shorter than 4 bytes")
    (attr_len,) = _ATTR_LEN.unpack_from(payload, 0)
    if attr_len < 0 or 4 + attr_len > len(payload):
        raise RecordError(f"attribute length {attr_len} does not fit a {len(payload)}-byte payload")
    try:
        attribute = bytes(payload[4 : 4 + attr_len]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"attribute is not UTF-8: {exc}") from None
    return attribute, bytes(payload[4 + attr_len :])


def encode_record(data: bytes, attribute: str | None = None, msg_id: int = 0) -> bytes:
    flag, payload = encode_payload(data, attribute)
    return HEADER.pack(len(payload), checksum(payload), msg_id, flag) + payload


def encode_batch(messages: list[tuple[bytes, str | None]]) -> bytes:
    """Records for ``[(data, attribute), ...]`` with msg_id 0, ready for a put."""
    return b"".join(encode_record(data, attribute) for data, attribute in messages)


def _check_header(length: int, crc: int, flag: int, max_size: int, at: int) -> None:
    if length < 0:
        raise RecordError(f"record at {at}: negative length {length}")
    if length > max_size:
        raise RecordError(f"record at {at}: length {length} exceeds the limit of {max_size} bytes")
    if flag & ~KNOWN_FLAGS:
        raise RecordError(f"record at {at}: unknown flag bits {flag:#x}")
    if crc < 0:
        raise RecordError(f"record at {at}: negative checksum")


def validate_batch(buf: bytes | bytearray | memoryview, max_message_size: int) -> int:
    """Check that ``buf`` is a whole number of well-formed records; return their count.

    Used on every put before anything touches a log, so that a malformed or
    partly corrupted batch is refused whole and never half-written. The rules are
    the store's (``_scan``) plus UTF-8 attributes; only a bad batch is walked again,
    from its first bad record, to say what is wrong with it.
    """
    whole, count = _scan(buf, max_message_size, attributes_utf8=True)
    if whole != len(buf):
        _explain_bad_record(memoryview(buf), whole, max_message_size)
    return count


def _explain_bad_record(view: memoryview, pos: int, max_message_size: int) -> None:
    """Raise the RecordError that says why the record at ``pos`` is not valid."""
    end = len(view)
    if end - pos < HEADER_SIZE:
        raise RecordError(f"record at {pos}: truncated header ({end - pos} of {HEADER_SIZE} bytes)")
    length, crc, _msg_id, flag = HEADER.unpack_from(view, pos)
    _check_header(length, crc, flag, max_message_size, pos)
    stop = pos + HEADER_SIZE + length
    if stop > end:
        raise RecordError(f"record at {pos}: truncated payload ({end - pos - HEADER_SIZE} of {length} bytes)")
    payload = view[pos + HEADER_SIZE : stop]
    if checksum(payload) != crc:
        raise RecordError(f"record at {pos}: checksum mismatch")
    decode_payload(flag, payload)  # raises for a bad attribute block
    raise RecordError(f"record at {pos}: not a valid record")


#: No length limit beyond the bytes there are: the store and truncation read records
#: written under any maxMessageSize (a garbage length is caught by the CRC or the end).
ANY_LENGTH = 1 << 30
#: How much a record walk reads at a time: bigger than any ordinary record, so walks
#: advance by whole chunks; bigger records are read one by one.
WALK_CHUNK = 4 * 1024 * 1024


def valid_prefix(buf: bytes | bytearray | memoryview, max_message_size: int = ANY_LENGTH) -> int:
    """Length of the longest prefix of ``buf`` made of whole, CRC-valid records."""
    return _scan(buf, max_message_size, attributes_utf8=False)[0]


def damaged_first_record(body: bytes | bytearray | memoryview) -> bool:
    """Whether the first record of a fetched range is whole and not valid (a partial one is
    just cut off): no record starts at the fetch position, e.g. a position from records an
    async failover took back now falls inside a record of the new master's log."""
    if len(body) < HEADER_SIZE:
        return False
    length, _crc, _msg_id, flag = HEADER.unpack_from(body)
    if length < 0 or flag & ~KNOWN_FLAGS:
        return True
    return HEADER_SIZE + length <= len(body) and valid_prefix(body[: HEADER_SIZE + length]) == 0


def _scan(buf: bytes | bytearray | memoryview, max_message_size: int, attributes_utf8: bool) -> tuple[int, int]:
    """``(length, count)`` of the longest prefix of ``buf`` whose records follow the rules.

    The one place the record rules are walked (validate_batch adds: attributes are UTF-8),
    compiled when ``scan_valid`` is built: per record, the same rules in C (a put of 100
    records of 100 B: ~110 µs of Python per walk, on the master's put and again on the
    slave's append).
    """
    if scan_valid is not None:
        scanned = scan_valid(buf, max_message_size, attributes_utf8)
        if scanned is not None:  # None: not a contiguous byte buffer, walked below
            return scanned
    view = memoryview(buf)
    pos, count, end = 0, 0, len(view)
    unpack, crc32 = HEADER.unpack_from, zlib.crc32
    while end - pos >= HEADER_SIZE:
        length, crc, _msg_id, flag = unpack(view, pos)
        if length < 0 or length > max_message_size or flag & ~KNOWN_FLAGS or crc < 0:
            break
        stop = pos + HEADER_SIZE + length
        if stop > end or crc32(view[pos + HEADER_SIZE : stop]) & 0x7FFFFFFF != crc:
            break
        if flag & FLAG_HAS_ATTRIBUTE:
            # The flag is outside the CRC: an attribute block that cannot be one
            # means the header is damaged.
            if length < 4:
                break
            (attr_len,) = _ATTR_LEN.unpack_from(view, pos + HEADER_SIZE)
            if attr_len < 0 or 4 + attr_len > length:
                break
            if attributes_utf8:
                try:
                    str(view[pos + HEADER_SIZE + 4 : pos + HEADER_SIZE + 4 + attr_len], "utf-8")
                except UnicodeDecodeError:
                    break
        pos = stop
        count += 1
    return pos, count


class RecordRun(NamedTuple):
    """Consecutive whole records found by ``walk_records``: ``data`` starts at ``offset``."""

    offset: int
    data: bytes | memoryview
    count: int
    #: Absolute end offset of each record; listed only by a ``boundaries_only`` walk.
    ends: list[int] | None = None

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


def walk_records(
    read: Callable[[int, int], bytes | memoryview],
    start: int,
    end: int,
    *,
    chunk_size: int | None = None,
    max_message_size: int = ANY_LENGTH,
    boundaries_only: bool = False,
) -> Iterator[RecordRun]:
    """Walk the records in [start, end) a chunk at a time, up to the first one that is not valid.

    The one chunked walk of the store's recovery, the log's last record, truncation's
    record boundaries and a slave's check of a fetch reply. ``read(offset, length)``
    returns up to ``length`` bytes at an absolute offset (``LogSegment.read``,
    ``PartitionLog.read`` or ``buffer_reader``); it may return fewer, e.g. at a
    segment's end. Each run holds at most ``chunk_size`` bytes (default
    ``WALK_CHUNK``), except one record larger than that, which is read alone.

    By default every record rule is checked, CRC included, and the walk stops at the
    first record that is cut off at ``end`` or breaks a rule: the last run's end is
    where the valid records stop. ``boundaries_only`` is for logs already checked
    (recovered, or written by this broker): it only follows record lengths, which is
    about twice as fast, and each run lists its records' ends.
    """
    chunk = WALK_CHUNK if chunk_size is None else chunk_size
    pos = start
    while pos < end:
        buf = read(pos, min(chunk, end - pos))
        size, count, ends = _scan_run(buf, pos, max_message_size, boundaries_only)
        if size == 0:
            # Nothing valid at pos within this chunk: one record larger than the
            # chunk (read it alone), or the end of the valid records.
            header = buf if len(buf) >= HEADER_SIZE else read(pos, HEADER_SIZE)
            length = HEADER.unpack_from(header)[0] if len(header) >= HEADER_SIZE else -1
            span = HEADER_SIZE + length
            if length < 0 or length > max_message_size or span <= len(buf) or pos + span > end:
                return
            buf = read(pos, span)
            size, count, ends = _scan_run(buf, pos, max_message_size, boundaries_only)
            if size == 0:
                return
        yield RecordRun(pos, buf if size == len(buf) else memoryview(buf)[:size], count, ends)
        pos += size


def _scan_run(
    buf: bytes | memoryview, offset: int, max_message_size: int, boundaries_only: bool
) -> tuple[int, int, list[int] | None]:
    """``(length, count, ends)`` of the valid records at the start of one chunk of a walk."""
    if not boundaries_only:
        return (*_scan(buf, max_message_size, attributes_utf8=False), None)
    ends = record_ends(buf, offset)
    return (ends[-1] - offset if ends else 0), len(ends), ends


def buffer_reader(buf: bytes | bytearray | memoryview, base_offset: int) -> Callable[[int, int], memoryview]:
    """A ``read`` for walk_records over a buffer whose first byte is at ``base_offset``."""
    view = memoryview(buf)
    return lambda offset, length: view[offset - base_offset : offset - base_offset + length]


def stamp_msg_ids(buf: bytearray, first_id: int) -> int:
    """Write ids ``first_id, first_id + 1, ...`` into a validated batch; return the count."""
    if stamp_ids is not None:
        stamped = stamp_ids(buf, first_id)
        if stamped is not None:  # None: nothing written, left to the loop below (which raises)
            return stamped
    pos, n, end = 0, 0, len(buf)
    while pos < end:
        (length,) = _ATTR_LEN.unpack_from(buf, pos)
        _MSG_ID.pack_into(buf, pos + _MSG_ID_AT, first_id + n)
        pos += HEADER_SIZE + length
        n += 1
    return n


def record_ends(buf: bytes | bytearray | memoryview, base_offset: int = 0) -> list[int]:
    """Absolute end offsets of the whole records in ``buf`` (partial tail ignored)."""
    view = memoryview(buf)
    pos, end, ends = 0, len(view), []
    while end - pos >= HEADER_SIZE:
        (length,) = _ATTR_LEN.unpack_from(view, pos)
        stop = pos + HEADER_SIZE + length
        if length < 0 or stop > end:
            break
        ends.append(base_offset + stop)
        pos = stop
    return ends


def decode_columns(buf: bytes, base: int) -> tuple[list[int], list[int], list[str | None], list[bytes], int]:
    """Decode whole records of ``buf`` (log bytes starting at offset ``base``), CRC-checked.

    Returns ``(offsets, msg_ids, attributes, datas, consumed)``: ``consumed`` is the number
    of bytes of whole records (a trailing partial record is left for the next fetch).
    The one decoder of fetched ranges for readers (client messages, Spark batches): one
    pass, columns rather than an object per record, bound methods hoisted, because a
    reader's decode costs more per message than the broker's work.
    """
    offsets: list[int] = []
    ids: list[int] = []
    attrs: list[str | None] = []
    datas: list[bytes] = []
    o_app, i_app, a_app, d_app = offsets.append, ids.append, attrs.append, datas.append
    pos, end = 0, len(buf)
    while end - pos >= HEADER_SIZE:
        length, crc, msg_id, flag = _HEADER_UNPACK_FROM(buf, pos)
        if length < 0 or flag & ~KNOWN_FLAGS:
            raise RecordError(f"record at offset {base + pos}: bad header (length {length}, flag {flag:#x})")
        start = pos + HEADER_SIZE
        nxt = start + length
        if nxt > end:
            break
        payload = buf[start:nxt]
        if _CRC32(payload) & 0x7FFFFFFF != crc:
            raise RecordError(f"record at offset {base + pos}: checksum mismatch")
        o_app(base + pos)
        i_app(msg_id)
        if flag & FLAG_HAS_ATTRIBUTE:  # the rare path: the attribute rules live in record.py
            try:
                attribute, data = decode_payload(flag, payload)
            except RecordError as exc:
                raise RecordError(f"record at offset {base + pos}: {exc}") from None
            a_app(attribute)
            d_app(data)
        else:
            a_app(None)
            d_app(payload)
        pos = nxt
    return offsets, ids, attrs, datas, pos


def iter_records(
    buf: bytes | bytearray | memoryview, base_offset: int = 0, verify: bool = True
) -> Iterator[Record]:
    """Decode whole records from a fetched byte range starting at ``base_offset``.

    A trailing partial record (a fetch may end mid-message) is not yielded.
    With ``verify`` a checksum mismatch raises RecordError naming the offset.
    """
    view = memoryview(buf)
    pos, end = 0, len(view)
    while end - pos >= HEADER_SIZE:
        length, crc, msg_id, flag = HEADER.unpack_from(view, pos)
        if length < 0:
            raise RecordError(f"record at offset {base_offset + pos}: negative length {length}")
        stop = pos + HEADER_SIZE + length
        if stop > end:
            return
        payload = view[pos + HEADER_SIZE : stop]
        if verify and checksum(payload) != crc:
            raise RecordError(f"record at offset {base_offset + pos}: checksum mismatch")
        attribute, data = decode_payload(flag, payload)
        yield Record(base_offset + pos, msg_id, flag, attribute, data)
        pos = stop
