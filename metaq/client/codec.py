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


def decode_messages(buf: bytes | bytearray, base_offset: int, topic: str, partition: Partition) -> tuple[list[Message], list[int]]:
    """Whole records of a fetched range as Messages, and each one's end offset.

    A trailing partial record is left out; a checksum mismatch raises RecordError.
    """
    data = bytes(buf)
    messages: list[Message] = []
    ends: list[int] = []
    pos, end = 0, len(data)
    while end - pos >= HEADER_SIZE:
        length, crc, msg_id, flag = _unpack_from(data, pos)
        if length < 0:
            raise RecordError(f"record at offset {base_offset + pos}: negative length {length}")
        stop = pos + HEADER_SIZE + length
        if stop > end:
            break
        payload = data[pos + HEADER_SIZE : stop]
        if _crc32(payload) & 0x7FFFFFFF != crc:
            raise RecordError(f"record at offset {base_offset + pos}: checksum mismatch")
        attribute = None
        if flag:
            attribute, payload = decode_payload(flag, payload)
        messages.append(Message(topic, payload, attribute, msg_id, partition, base_offset + pos))
        ends.append(base_offset + stop)
        pos = stop
    return messages, ends
