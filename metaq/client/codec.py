"""Messages to records and back, on the client's hot paths.

The format is metaq.record's; encoding avoids its per-record generality (a Record tuple
per message), which costs more than the broker's own work per message, and decoding is
record.decode_columns. Records with an attribute go through record.encode_payload /
decode_payload, so the attribute rules live in one place.
"""

from __future__ import annotations

import zlib
from itertools import repeat
from typing import Sequence

from ..record import HEADER, HEADER_SIZE, decode_columns, encode_payload
from ..txn.control import CONTROL_ATTRIBUTE, drop_control_columns
from .message import Message, Partition

try:  # compiled during setup (setup.py, metaq/_speedups.c); the same results in pure Python without it
    from .._speedups import decode_valid, encode_plain
except ImportError:
    decode_valid = encode_plain = None

_pack = HEADER.pack
_crc32 = zlib.crc32
#: The reserved attribute of control records as it is in a record (the compiled decode skips them).
_CONTROL_MARK = CONTROL_ATTRIBUTE.encode("utf-8")


def encode_messages(messages: Sequence[Message]) -> tuple[bytes, list[int]]:
    """The put body for ``messages`` (msg id 0) and each record's start within it."""
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
