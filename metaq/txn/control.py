"""Control records: batch headers and transaction markers, in MetaQ's record format.

Why ordinary records with a reserved attribute (and not a new flag bit)
-----------------------------------------------------------------------
A control record is a normal MetaQ record (flag bit 0 set, an attribute block)
whose attribute is the reserved string ``CONTROL_ATTRIBUTE``; its data is the
binary body below. So every existing reader of the format (recovery's CRC scan,
``validate_batch``, a slave's tail check, truncation, the Spark source, an old
MetaQ client) reads it as a valid record, a slave copies it verbatim (its log
stays a byte-identical prefix of the master's), and the marker that makes it a
control record sits inside the CRC-covered payload: a flipped header bit cannot
turn a message into a control record (a new flag bit would be outside the CRC,
and every broker that does not know the bit would cut it off as a torn tail).
The cost: a reader must look at the attribute to skip it; ``is_control`` does
that on the raw bytes, without decoding.

Producers never write control records: the broker writes them (the put handler
prepends a BATCH header, the transaction coordinator appends markers), and a
put carrying a record with the reserved attribute is refused
(``find_forged_control``).

Body layout (big-endian), after the attribute block::

    int8   version          1
    int8   kind             1 BATCH, 2 PREPARE, 3 COMMIT, 4 ABORT
    int64  producerId       -1 if none
    int16  producerEpoch
    int64  timestampMs      the master's clock when it appended the record
    int16  txidLen | txid   UTF-8; empty for a batch outside any transaction
    then by kind:
      BATCH    int32 firstSeq | int32 recordCount | int32 dataBytes
               (the recordCount records, dataBytes long, that follow this one)
      PREPARE  int32 timeoutSeconds (the transaction's timeout, from the prepare)
               [int8 starterLen | starter]  optional: who started the branch (below)
      COMMIT   nothing
      ABORT    int8 reason (see AbortReason)

A BATCH header comes immediately before the records it describes, in the same
append: a batch whose header is in the log but whose records are not all there
is a torn tail (``rebuild.incomplete_batch_start`` finds it).

The PREPARE marker's starter is the keyed tag of the principal that started the
branch (metaq/security/principal_tags.py: an HMAC under the group's key, so a
reader of the log learns no user name), so every replica, and so the master a
failover promotes, knows whose branch it is. It is written only when known (security
on); a PREPARE without it (written before starters were recorded, or with security
off) has exactly the old layout and decodes with ``starter == ""``: unknown starter,
which the transaction service treats as "admin only". A broker that predates the
field refuses a PREPARE that carries it (trailing bytes), so upgrade slaves before
their master.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

from metaq.record import FLAG_HAS_ATTRIBUTE, HEADER, HEADER_SIZE, Record, encode_record, record_ends

#: The reserved attribute. The leading NUL keeps it apart from any printable attribute.
CONTROL_ATTRIBUTE = "\x00metaq.control"
_MARK = CONTROL_ATTRIBUTE.encode("utf-8")
#: The attribute block of every control record: int32 length, then the mark.
_ATTR_BLOCK = struct.pack(">i", len(_MARK)) + _MARK

VERSION = 1
_COMMON = struct.Struct(">BBqhq")
_TXID_LEN = struct.Struct(">H")
_BATCH = struct.Struct(">iii")
_PREPARE = struct.Struct(">i")
_ABORT = struct.Struct(">B")
_LENGTH = struct.Struct(">i")
NO_PRODUCER = -1
#: Sequences are 31-bit and wrap to 0 after this (so they stay non-negative int32).
MAX_SEQUENCE = 0x7FFFFFFF
MAX_TXID_BYTES = 512
#: The PREPARE marker's starter tag is prefixed by an int8 length.
MAX_STARTER_BYTES = 255
_STARTER_LEN = struct.Struct(">B")


class ControlError(ValueError):
    """A record carries the control attribute but its body is not a control body we know."""

    #: Where the record starts, when a walk of a log found it (metaq/txn/rebuild.py).
    offset: int | None = None

    @classmethod
    def at(cls, offset: int, exc: Exception) -> "ControlError":
        error = cls(f"record at {offset}: {exc}")
        error.offset = offset
        return error


class Kind(enum.IntEnum):
    BATCH = 1
    PREPARE = 2
    COMMIT = 3
    ABORT = 4


class AbortReason(enum.IntEnum):
    ROLLBACK = 0  # the application asked for it
    TIMEOUT = 1  # an unprepared transaction outlived its timeout
    HEURISTIC = 2  # a prepared transaction outlived its timeout (XA heuristic rollback)
    FAILOVER = 3  # a new master found it unprepared when it took over


class Control(NamedTuple):
    kind: Kind
    producer_id: int = NO_PRODUCER
    producer_epoch: int = 0
    timestamp_ms: int = 0
    txid: str = ""
    first_seq: int = 0  # BATCH
    record_count: int = 0  # BATCH
    data_bytes: int = 0  # BATCH
    timeout_s: int = 0  # PREPARE
    reason: AbortReason = AbortReason.ROLLBACK  # ABORT
    starter: str = ""  # PREPARE: the starter's tag; "" unknown (an older marker, or security off)

    @property
    def last_seq(self) -> int:
        return (self.first_seq + self.record_count - 1) & MAX_SEQUENCE


def encode_body(control: Control) -> bytes:
    txid = control.txid.encode("utf-8")
    if len(txid) > MAX_TXID_BYTES:
        raise ControlError(f"transaction id is {len(txid)} bytes, the limit is {MAX_TXID_BYTES}")
    if control.kind is Kind.BATCH and not 0 <= control.first_seq <= MAX_SEQUENCE:
        raise ControlError(f"sequence {control.first_seq} is not in 0..{MAX_SEQUENCE}")
    head = _COMMON.pack(
        VERSION, control.kind, control.producer_id, control.producer_epoch, control.timestamp_ms
    ) + _TXID_LEN.pack(len(txid)) + txid
    if control.kind is Kind.BATCH:
        return head + _BATCH.pack(control.first_seq, control.record_count, control.data_bytes)
    if control.kind is Kind.PREPARE:
        return head + _PREPARE.pack(control.timeout_s) + _encode_starter(control.starter)
    if control.kind is Kind.ABORT:
        return head + _ABORT.pack(control.reason)
    return head


def _encode_starter(starter: str) -> bytes:
    """The optional tail of a PREPARE body: nothing when unknown, so such a marker keeps the old layout."""
    if not starter:
        return b""
    raw = starter.encode("utf-8")
    if len(raw) > MAX_STARTER_BYTES:
        raise ControlError(f"starter is {len(raw)} bytes, the limit is {MAX_STARTER_BYTES}")
    return _STARTER_LEN.pack(len(raw)) + raw


def encode_control(control: Control) -> bytes:
    """One whole control record (msg id 0: the master stamps it like any record)."""
    return encode_record(encode_body(control), CONTROL_ATTRIBUTE)


def decode_body(data: bytes | memoryview) -> Control:
    view = memoryview(data)
    try:
        version, kind, producer_id, epoch, timestamp = _COMMON.unpack_from(view, 0)
        if version != VERSION:
            raise ControlError(f"control record version {version}, this broker reads {VERSION}")
        try:
            kind = Kind(kind)
        except ValueError:
            raise ControlError(f"unknown control record kind {kind}") from None
        pos = _COMMON.size
        (txid_len,) = _TXID_LEN.unpack_from(view, pos)
        pos += _TXID_LEN.size
        if pos + txid_len > len(view):
            raise ControlError("control record transaction id runs past its body")
        txid = bytes(view[pos : pos + txid_len]).decode("utf-8")
        pos += txid_len
        fields: dict[str, object] = {}
        tail: struct.Struct | None = {Kind.BATCH: _BATCH, Kind.PREPARE: _PREPARE, Kind.ABORT: _ABORT}.get(kind)
        if tail is not None:
            values = tail.unpack_from(view, pos)
            pos += tail.size
            if kind is Kind.BATCH:
                fields = dict(zip(("first_seq", "record_count", "data_bytes"), values))
            elif kind is Kind.PREPARE:
                fields = {"timeout_s": values[0]}
                if pos < len(view):  # the optional starter (absent in markers written before it existed)
                    (starter_len,) = _STARTER_LEN.unpack_from(view, pos)
                    pos += _STARTER_LEN.size
                    if starter_len == 0 or pos + starter_len > len(view):
                        raise ControlError("control record starter is empty or runs past its body")
                    fields["starter"] = bytes(view[pos : pos + starter_len]).decode("utf-8")
                    pos += starter_len
            else:
                fields = {"reason": AbortReason(values[0])}
    except struct.error:
        raise ControlError("control record body is truncated") from None
    except UnicodeDecodeError:
        raise ControlError("control record transaction id or starter is not UTF-8") from None
    except ValueError as exc:
        if isinstance(exc, ControlError):
            raise
        raise ControlError(f"control record field out of range: {exc}") from None
    if pos != len(view):
        raise ControlError(f"control record body has {len(view) - pos} unexpected trailing bytes")
    return Control(kind, producer_id, epoch, timestamp, txid, **fields)  # type: ignore[arg-type]


def is_control(view: memoryview | bytes, pos: int = 0) -> bool:
    """Is the whole record starting at ``pos`` a control record? Reads only its header and attribute block."""
    length, _crc, _msg_id, flag = HEADER.unpack_from(view, pos)
    if not flag & FLAG_HAS_ATTRIBUTE or length < len(_ATTR_BLOCK):
        return False
    start = pos + HEADER_SIZE
    return bytes(view[start : start + len(_ATTR_BLOCK)]) == _ATTR_BLOCK


def control_at(view: memoryview | bytes, pos: int = 0) -> Control | None:
    """The control body of the whole record at ``pos``, None for an ordinary message."""
    if not is_control(view, pos):
        return None
    (length,) = _LENGTH.unpack_from(view, pos)
    return decode_body(memoryview(view)[pos + HEADER_SIZE + len(_ATTR_BLOCK) : pos + HEADER_SIZE + length])


def control_of(record: Record) -> Control | None:
    """The control body of a decoded record, None for an ordinary message."""
    if record.attribute != CONTROL_ATTRIBUTE:
        return None
    return decode_body(record.data)


def drop_control_columns(offsets: list, ids: list, attributes: list, datas: list) -> tuple[list, list, list, list]:
    """``record.decode_columns``' columns without the control records' rows (readers that deliver messages)."""
    if CONTROL_ATTRIBUTE not in attributes:  # the common case: one C-speed scan, nothing copied
        return offsets, ids, attributes, datas
    keep = [i for i, attribute in enumerate(attributes) if attribute != CONTROL_ATTRIBUTE]
    return [offsets[i] for i in keep], [ids[i] for i in keep], [attributes[i] for i in keep], [datas[i] for i in keep]


def may_hold_control(data: bytes | bytearray | memoryview) -> bool:
    """False only if no record in ``data`` can be a control record: its attribute block is nowhere."""
    return _ATTR_BLOCK in (data if isinstance(data, (bytes, bytearray)) else bytes(data))


def next_attribute_block(data: bytes | bytearray, start: int) -> int:
    """Where the first control attribute block at or after ``start`` begins in ``data``, or -1.

    No record whose attribute block would begin before that point is a control record: a
    walk passes them without looking at each (one C-speed search; a hit may still be an
    ordinary message whose bytes happen to hold the block, which ``control_at`` tells)."""
    return data.find(_ATTR_BLOCK, start)


def find_forged_control(batch: bytes | bytearray | memoryview) -> int | None:
    """Index of the first record of a producer's batch that carries the reserved attribute, or None."""
    if not may_hold_control(batch):  # the put hot path: one C-speed search, no walk
        return None
    view = memoryview(batch)
    pos = 0
    for index, end in enumerate(record_ends(view)):
        if is_control(view, pos):
            return index
        pos = end
    return None


def frame_batch(
    batch: bytes | bytearray,
    record_count: int,
    *,
    producer_id: int,
    producer_epoch: int,
    first_seq: int,
    timestamp_ms: int,
    txid: str = "",
) -> bytearray:
    """A validated producer batch with its BATCH header in front: the bytes the put handler appends."""
    header = encode_control(
        Control(Kind.BATCH, producer_id, producer_epoch, timestamp_ms, txid, first_seq, record_count, len(batch))
    )
    return bytearray(header) + batch


def marker(kind: Kind, txid: str, *, producer_id: int, producer_epoch: int, timestamp_ms: int,
           timeout_s: int = 0, reason: AbortReason = AbortReason.ROLLBACK, starter: str = "") -> bytes:
    """One PREPARE, COMMIT or ABORT record for a transaction, ready to append (``starter``: PREPARE only)."""
    if kind is Kind.BATCH:
        raise ControlError("a BATCH header is built by frame_batch, not as a marker")
    if not txid:
        raise ControlError("a transaction marker needs a transaction id")
    return encode_control(Control(kind, producer_id, producer_epoch, timestamp_ms, txid,
                                  timeout_s=timeout_s, reason=reason,
                                  starter=starter if kind is Kind.PREPARE else ""))
