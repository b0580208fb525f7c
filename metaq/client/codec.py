"""Messages to records and back, on the client's hot paths.

The format is metaq.record's; these loops only avoid its per-record generality
(memoryviews, a Record tuple per message, a second pass for offsets), which costs more
than the broker's own work per message. Records with an attribute go through
record.encode_payload / decode_payload, so the attribute rules live in one place.
"""

from __future__ import annotations

import zlib
from typing import Sequence

from ..record import HEADER, HEADER_SIZE, RecordError, decode_payload, encode_payload
from .message import Message, Partition

_pack = HEADER.pack
_unpack_from = HEADER.unpack_from
_crc32 = zlib.crc32


def encode_messages(messages: Sequence[Message]) -> tuple[bytes, list[int]]:
    """The put body for ``messages`` (msg id 0) and each record's start within it."""
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
    """Whole records of a fetched range as Messages, in one pass; and the end offset of the last.

    A record's end is the next one's ``offset`` (the last one's is the returned end), so
    no second list is built. A trailing partial record is left out; a checksum mismatch
    raises RecordError.
    """
    data = bytes(buf)
    messages: list[Message] = []
    append = messages.append
    new = tuple.__new__
    pos, end = 0, len(data)
    while end - pos >= HEADER_SIZE:
        length, crc, msg_id, flag = _unpack_from(data, pos)
        if length < 0:
            raise RecordError(f"record at offset {base_offset + pos}: negative length {length}")
        start = pos + HEADER_SIZE
        stop = start + length
        if stop > end:
            break
        payload = data[start:stop]
        if _crc32(payload) & 0x7FFFFFFF != crc:
            raise RecordError(f"record at offset {base_offset + pos}: checksum mismatch")
        if flag:
            attribute, payload = decode_payload(flag, payload)
            append(new(Message, (topic, payload, attribute, msg_id, partition, base_offset + pos)))
        else:
            append(new(Message, (topic, payload, None, msg_id, partition, base_offset + pos)))
        pos = stop
    return messages, base_offset + pos
