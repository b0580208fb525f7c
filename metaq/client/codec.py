"""Messages to records and back, on the client's hot paths.

The format is metaq.record's; encoding avoids its per-record generality (a Record tuple
per message), which costs more than the broker's own work per message, and decoding is
record.decode_columns. Records with an attribute go through record.encode_payload /
decode_payload, so the attribute rules live in one place.

Columns to records (``encode_columns``): the Spark sink's Arrow batches are encoded from the
columns' buffers without a Python object per row; the records of one put travel to the
producers as an ``EncodedRecords`` (see there), which ``encode_messages`` hands on as they are.
"""

from __future__ import annotations

import zlib
from array import array
from itertools import repeat
from typing import Any, Sequence

from ..record import FLAG_HAS_ATTRIBUTE, HEADER, HEADER_SIZE, decode_columns, encode_payload
from ..txn.control import CONTROL_ATTRIBUTE, drop_control_columns
from .message import Message, Partition

try:  # compiled during setup (setup.py, metaq/_speedups.c); the same results in pure Python without it
    from .._speedups import decode_valid, encode_columns as compiled_encode_columns, encode_plain, key_crc32 as compiled_key_crc32
except ImportError:
    decode_valid = encode_plain = compiled_encode_columns = compiled_key_crc32 = None

_pack = HEADER.pack
_crc32 = zlib.crc32
#: The reserved attribute of control records as it is in a record (the compiled decode skips them).
_CONTROL_MARK = CONTROL_ATTRIBUTE.encode("utf-8")


def encode_messages(messages: Sequence[Message]) -> tuple[bytes, Sequence[int]]:
    """The put body for ``messages`` (msg id 0) and each record's start within it."""
    if messages and type(messages[0]) is EncodedRecords:
        return messages[0].encoded(messages)
    if encode_plain is not None and type(messages) is list:
        # Compiled for messages without attributes (a batch of 100: ~36 -> ~4 µs); None hands
        # the list back to the loop below (an attribute, data that is not bytes, a subclass).
        encoded = encode_plain(messages, Message)
        if encoded is not None:
            return encoded
    parts: list[bytes] = []
    starts: list[int] = []
    position = 0
    for message in messages:
        if message.attribute is None:
            payload = message.data
            flag = 0
        else:
            flag, payload = encode_payload(message.data, message.attribute)
        length = len(payload)
        parts.append(_pack(length, _crc32(payload) & 0x7FFFFFFF, 0, flag))
        parts.append(payload)
        starts.append(position)
        position += HEADER_SIZE + length
    return b"".join(parts), starts


class EncodedRecords(Message):
    """A put's records already encoded (``encode_columns``), standing for its messages.

    The producers take lists of messages; a put the Spark sink encoded from Arrow columns is
    handed to them as ``as_messages()``, this one object repeated once per record (a list of
    references, not an object per row), and ``encode_messages`` returns its body and starts
    as they are. Its ``topic`` and ``partition`` are the put's (the sink places records itself).
    """

    def __new__(cls, topic: str, partition: Partition, body: bytes, starts: Sequence[int]) -> "EncodedRecords":
        self = tuple.__new__(cls, (topic, b"", None, None, partition, None))
        self.body, self.starts = body, starts  # type: ignore[attr-defined]
        return self

    def as_messages(self) -> list[Message]:
        return [self] * len(self.starts)  # type: ignore[attr-defined]

    def encoded(self, messages: Sequence[Message]) -> tuple[bytes, Sequence[int]]:
        """``(body, starts)`` for a put of ``messages``, which must be ``as_messages()`` whole."""
        starts = self.starts  # type: ignore[attr-defined]
        if len(messages) != len(starts) or not isinstance(messages, list) or messages.count(self) != len(messages):
            raise ValueError("encoded records go in one put, whole and alone (as_messages())")
        return self.body, starts  # type: ignore[attr-defined]


#: A column as encode_columns reads it: (offsets, data, validity or None, shift, offset width 4
#: or 8), buffers as Arrow lays out a binary or string array (``shift``: the array's offset).
Column = tuple[Any, Any, Any, int, int]


def encode_columns(
    values: Column, attributes: Column | None, rows: Any, start: int, stop: int,
    limit_bytes: int, limit_count: int, max_message_size: int, row_base: int = 0,
) -> tuple[bytes, Sequence[int], int]:
    """The put body of rows ``rows[start:stop]`` (``rows``: int64 row numbers, or None for rows
    ``start..stop``), up to ``limit_count`` records and ``limit_bytes`` bytes (at least one).

    Byte for byte what ``encode_messages`` makes of those rows as Messages (value as data,
    attribute, None for a null one). Returns ``(body, starts, next)``: ``next`` is the
    position after the last row encoded. A null value, or a payload over
    ``max_message_size``, raises ValueError naming the row (``row_base`` + its number).
    """
    if compiled_encode_columns is not None:
        body, starts, end = compiled_encode_columns(values, attributes, rows, start, stop, limit_bytes, limit_count,
                                                    max_message_size, row_base)
        return body, memoryview(starts).cast("q"), end
    return _encode_columns(values, attributes, rows, start, stop, limit_bytes, limit_count, max_message_size, row_base)


class _ColumnReader:
    """A Column's rows as bytes (None for null): the pure-Python reading of Arrow's layout."""

    def __init__(self, column: Column) -> None:
        offsets, data, validity, self.shift, width = column
        self.offsets = memoryview(offsets).cast("B").cast("q" if width == 8 else "i")
        self.data = memoryview(data).cast("B")
        self.validity = None if validity is None else memoryview(validity).cast("B")

    def __getitem__(self, row: int) -> bytes | None:
        i = self.shift + row
        if self.validity is not None and not self.validity[i >> 3] >> (i & 7) & 1:
            return None
        return bytes(self.data[self.offsets[i] : self.offsets[i + 1]])


def _encode_columns(
    values: Column, attributes: Column | None, rows: Any, start: int, stop: int,
    limit_bytes: int, limit_count: int, max_message_size: int, row_base: int,
) -> tuple[bytes, Sequence[int], int]:
    value_of = _ColumnReader(values)
    attribute_of = None if attributes is None else _ColumnReader(attributes)
    numbers = None if rows is None else memoryview(rows).cast("B").cast("q")
    parts: list[bytes] = []
    starts = array("q")
    total, end = 0, start
    while end < stop and end - start < max(limit_count, 1):
        row = end if numbers is None else numbers[end]
        data = value_of[row]
        if data is None:
            raise ValueError(f"row {row_base + row}: the value is null (column value is required)")
        attribute = None if attribute_of is None else attribute_of[row]
        if attribute is None:
            flag, payload = 0, data
        else:
            flag, payload = FLAG_HAS_ATTRIBUTE, len(attribute).to_bytes(4, "big") + attribute + data
        if len(payload) > max_message_size:
            raise ValueError(f"row {row_base + row}: its record's payload is {len(payload)} bytes, more than maxMessageSize ({max_message_size})")
        if end > start and total + HEADER_SIZE + len(payload) > limit_bytes:
            break
        parts.append(_pack(len(payload), _crc32(payload) & 0x7FFFFFFF, 0, flag))
        parts.append(payload)
        starts.append(total)
        total += HEADER_SIZE + len(payload)
        end += 1
    return b"".join(parts), starts, end


def key_crc32(keys: Column, count: int) -> Any:
    """zlib.crc32 of each of the first ``count`` rows of a key column, -1 for null: an int64 sequence."""
    if compiled_key_crc32 is not None:
        return memoryview(compiled_key_crc32(keys, count)).cast("q")
    key_of = _ColumnReader(keys)
    return array("q", (-1 if (key := key_of[row]) is None else _crc32(key) for row in range(count)))


def decode_messages(buf: bytes | bytearray, base_offset: int, topic: str, partition: Partition) -> tuple[list[Message], int]:
    """Whole records of a fetched range as Messages; and the end offset of the last.

    A record's end is the next one's ``offset`` (the last one's is the returned end). A trailing partial record is left out; a damaged record
    raises RecordError naming its offset. Control records (the broker's batch headers and
    transaction markers, docs/storage.md) are no messages: they are left out, and the end
    still moves past them.
    """
    if decode_valid is None:
        return _decode_columns_as_messages(bytes(buf), base_offset, topic, partition)
    messages: list[Message] = []
    pos = decode_valid(buf, 0, base_offset, topic, partition, Message, messages, _CONTROL_MARK)  # buf not copied
    if len(buf) - pos < HEADER_SIZE:
        return messages, base_offset + pos
    # The compiled decode stopped at a record that is not whole and valid: record.py decodes
    # the rest, so it is the one to raise and say what is wrong (or to leave a partial tail).
    rest, end = _decode_columns_as_messages(bytes(buf[pos:]), base_offset + pos, topic, partition)
    return messages + rest, end


def _decode_columns_as_messages(buf: bytes, base_offset: int, topic: str, partition: Partition) -> tuple[list[Message], int]:
    """The pure-Python decode: ``buf``'s records (at ``base_offset``) as Messages, and their end offset."""
    offsets, ids, attributes, datas, consumed = decode_columns(buf, base_offset)
    offsets, ids, attributes, datas = drop_control_columns(offsets, ids, attributes, datas)
    # tuple.__new__ mapped over zip builds each Message in C, without NamedTuple.__new__.
    fields = zip(repeat(topic), datas, attributes, ids, repeat(partition), offsets)
    return list(map(tuple.__new__, repeat(Message), fields)), base_offset + consumed
