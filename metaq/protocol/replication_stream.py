"""The replication stream: a master pushes each put's bytes to a caught-up slave; sans-IO.

Theory of operation
-------------------
A slave in sync mode whose partition has caught up (its fetch at the master's log end
found nothing) may *subscribe* to the partition instead of long-polling it: a ``stream``
request on its authenticated replication connection, checked by the master exactly as a
fetch is (slave login, registered slave id, epoch, incarnation) and accepted only when the
slave's log end is the master's. The subscription is named by that request's ``opaque``
(the *stream id*). From then on the master writes, for every put of the partition, right
after the append and before any bookkeeping, one frame on the same connection whose header
is ``{"opaque": stream_id, "code": 200}`` and whose body is a chunk::

    uint32 stream id   (the subscription; repeated so a body is checked on its own)
    uint64 offset      where the bytes start in the master's log
    uint32 epoch       the master's epoch when it appended them
    uint32 length      of the bytes that follow
    uint32 crc32       of the bytes that follow
    bytes              the put's stamped records, byte for byte as appended

The slave appends a chunk in its connection's protocol callback when it continues its log
exactly (offset == its log end), in its epoch, with a matching CRC and whole valid records,
then sends a one-way ``stream_ack`` request whose body is a report::

    uint32 stream id, uint32 epoch, uint64 end offset  (the slave's log end after the append)

A chunk's header also carries the partition's committed offset (``committed``, as of the
push: the acks before it); a frame with code 200, ``committed`` and no body tells it to a
partition that got no chunk for a few milliseconds after it moved, so the slave's consumers
read what the master's do without one more frame per put.

The master takes a report only from the connection that holds the subscription, for a
stream it holds, in its epoch, and not past what it sent; it then records the position as
it records a fetch's (so sync waiters are released by it). A frame with another code closes
the subscription (the master's doubt: a gap, a truncation, a topic change, a slow slave).

Safety never depends on the stream: either side closes it at any doubt, and the slave then
fetches from its log end, where every check of the fetch path applies.

``StreamSender`` (master) and ``StreamReceiver`` (slave) are the two ends of one
subscription. Their states:

    side      state        event                                 next / result
    --------  -----------  ------------------------------------  ------------------------------------
    receiver  SUBSCRIBING  accepted(reply ok)                    STREAMING
    receiver  SUBSCRIBING  accepted(reply not ok)                CLOSED (fetching goes on)
    receiver  STREAMING    chunk continuing the log, CRC ok      STREAMING, Append(data, end)
    receiver  STREAMING    committed notice (200, no body)       STREAMING, Committed(offset)
    receiver  STREAMING    chunk torn, CRC mismatch, offset gap,
                           other epoch, other stream id          CLOSED, Doubt(reason)
    receiver  STREAMING    close frame from the master           CLOSED, Doubt(reason)
    receiver  any          close() (reconnect, stop, forget)     CLOSED
    sender    OPEN         push(offset == sent end, same epoch)  OPEN, chunk bytes
    sender    OPEN         push(gap, other epoch, over bound)    CLOSED, Doubt(reason)
    sender    OPEN         report(epoch, end <= sent end)        OPEN, position accepted
    sender    OPEN         report(other epoch, end > sent end)   OPEN, Refused(reason) (logged)
    sender    any          close()                               CLOSED
    any       CLOSED       anything but close()                  CLOSED (ignored / Doubt)
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

CHUNK = struct.Struct(">IQIII")
CHUNK_HEAD_SIZE = CHUNK.size  # 24
REPORT = struct.Struct(">IIQ")
REPORT_SIZE = REPORT.size  # 16
#: A slave whose unacknowledged streamed bytes pass this is slow: its stream is closed and it
#: fetches (where a large backlog belongs), instead of queueing pushes on its connection.
DEFAULT_MAX_UNACKED = 4 * 1024 * 1024

SUBSCRIBING = "SUBSCRIBING"
STREAMING = "STREAMING"
OPEN = "OPEN"
CLOSED = "CLOSED"


@dataclass(frozen=True)
class Append:
    """Append ``data`` (it continues the log at its log end); the log then ends at ``end``."""

    data: memoryview
    end: int


@dataclass(frozen=True)
class Committed:
    """The master's committed offset of the partition is ``offset``."""

    offset: int


@dataclass(frozen=True)
class Doubt:
    """The stream is closed; fetch from the log end. ``reason`` says why (for the log)."""

    reason: str


@dataclass(frozen=True)
class Refused:
    """A report that must not count (logged by the caller); the stream stays as it was."""

    reason: str


def encode_chunk(stream_id: int, offset: int, epoch: int, data: bytes | bytearray | memoryview) -> bytes:
    return CHUNK.pack(stream_id, offset, epoch, len(data), zlib.crc32(data)) + bytes(data)


def encode_report(stream_id: int, epoch: int, end: int) -> bytes:
    return REPORT.pack(stream_id, epoch, end)


def decode_report(body: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(stream id, epoch, end) of a report; ValueError if the body is not one."""
    if len(body) != REPORT_SIZE:
        raise ValueError(f"a stream report is {REPORT_SIZE} bytes, got {len(body)}")
    return REPORT.unpack(body)


class StreamReceiver:
    """The slave's end of one subscription: decides about each chunk, nothing else."""

    __slots__ = ("stream_id", "epoch", "state", "reason")

    def __init__(self, stream_id: int, epoch: int) -> None:
        self.stream_id = stream_id
        self.epoch = epoch
        self.state = SUBSCRIBING
        self.reason = ""

    def accepted(self, ok: bool, message: str = "") -> None:
        if self.state != SUBSCRIBING:
            return
        if ok:
            self.state = STREAMING
        else:
            self._close(f"subscription refused: {message}")

    def frame(self, header: dict, body: bytes | bytearray | memoryview, log_end: int) -> Append | Committed | Doubt:
        """A frame of this stream arrived; ``log_end``: the slave's log end now."""
        if self.state != STREAMING:
            return self._close(self.reason or f"a frame while {self.state}")
        if header.get("code") != 200:
            return self._close(f"closed by the master: {header.get('msg', '')}")
        if not body:
            committed = header.get("committed")
            if not isinstance(committed, int) or isinstance(committed, bool) or committed < 0:
                return self._close(f"a committed notice without an offset: {committed!r}")
            return Committed(committed)
        if len(body) < CHUNK_HEAD_SIZE:
            return self._close(f"torn chunk: {len(body)} bytes, less than its {CHUNK_HEAD_SIZE}-byte head")
        stream_id, offset, epoch, length, crc = CHUNK.unpack_from(body)
        data = memoryview(body)[CHUNK_HEAD_SIZE:]
        if stream_id != self.stream_id:
            return self._close(f"a chunk of stream {stream_id} on stream {self.stream_id}")
        if len(data) != length:
            return self._close(f"torn chunk: {len(data)} bytes where its head says {length}")
        if epoch != self.epoch:
            return self._close(f"a chunk of epoch {epoch}, the slave is in epoch {self.epoch}")
        if offset != log_end:
            return self._close(f"a chunk at offset {offset}, the log ends at {log_end}")
        if zlib.crc32(data) != crc:
            return self._close(f"a chunk at offset {offset} fails its CRC check")
        return Append(data, offset + length)

    def close(self, reason: str = "closed") -> Doubt:
        return self._close(reason)

    def _close(self, reason: str) -> Doubt:
        if self.state != CLOSED:
            self.state = CLOSED
            self.reason = reason
        return Doubt(self.reason)


class StreamSender:
    """The master's end of one subscription: what it sent, what the slave confirmed."""

    __slots__ = ("stream_id", "epoch", "sent_end", "acked_end", "max_unacked", "state", "reason")

    def __init__(self, stream_id: int, epoch: int, start: int, max_unacked: int = DEFAULT_MAX_UNACKED) -> None:
        self.stream_id = stream_id
        self.epoch = epoch
        self.sent_end = start
        self.acked_end = start
        self.max_unacked = max_unacked
        self.state = OPEN
        self.reason = ""

    def push(self, offset: int, epoch: int, data: bytes | bytearray | memoryview) -> bytes | Doubt:
        """The chunk to send for bytes appended at ``offset`` in ``epoch``, or Doubt (closed)."""
        if self.state != OPEN:
            return Doubt(self.reason)
        if offset != self.sent_end:
            return self.close(f"append at {offset}, the stream had sent up to {self.sent_end}")
        if epoch != self.epoch:
            return self.close(f"epoch {epoch}, the stream is of epoch {self.epoch}")
        if self.sent_end + len(data) - self.acked_end > self.max_unacked:
            return self.close(f"slow slave: more than {self.max_unacked} bytes unacknowledged")
        self.sent_end = offset + len(data)
        return encode_chunk(self.stream_id, offset, epoch, data)

    def report(self, epoch: int, end: int) -> int | Refused:
        """The position a report proves, or Refused (the caller logs it)."""
        if self.state != OPEN:
            return Refused(f"stream {self.stream_id} is closed")
        if epoch != self.epoch:
            return Refused(f"report in epoch {epoch}, the stream is of epoch {self.epoch}")
        if end > self.sent_end:
            return Refused(f"report of end {end}, past what was sent ({self.sent_end})")
        if end > self.acked_end:
            self.acked_end = end
        return end

    def close(self, reason: str) -> Doubt:
        if self.state != CLOSED:
            self.state = CLOSED
            self.reason = reason
        return Doubt(self.reason)
