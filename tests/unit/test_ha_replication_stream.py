"""The replication stream's sans-IO ends (metaq/protocol/replication_stream.py), the slave's
mode table and the master's hub (metaq/ha/stream.py): every transition, torn frames, CRC
mismatches, gaps, epochs, refused reports."""

from __future__ import annotations

import asyncio
import zlib

import pytest

from metaq.ha.stream import TRANSITIONS, Mode, ModeEvent, ReplicaMode, StreamHub
from metaq.protocol.replication_stream import (
    CHUNK, CHUNK_HEAD_SIZE, CLOSED, OPEN, STREAMING, SUBSCRIBING, Append, Committed, Doubt, Refused,
    StreamReceiver, StreamSender, decode_report, encode_chunk, encode_report,
)

OK = {"code": 200, "opaque": 7}


def streaming(epoch: int = 3) -> StreamReceiver:
    receiver = StreamReceiver(7, epoch)
    receiver.accepted(True)
    return receiver


# --- receiver ----------------------------------------------------------------------------------


def test_receiver_subscribing_to_streaming_and_a_refusal_closes() -> None:
    receiver = StreamReceiver(7, 3)
    assert receiver.state == SUBSCRIBING
    receiver.accepted(True)
    assert receiver.state == STREAMING
    refused = StreamReceiver(7, 3)
    refused.accepted(False, "not caught up")
    assert refused.state == CLOSED and "not caught up" in refused.reason


def test_receiver_appends_a_chunk_that_continues_the_log() -> None:
    receiver = streaming()
    result = receiver.frame(OK, encode_chunk(7, 100, 3, b"abcdef"), log_end=100)
    assert isinstance(result, Append) and bytes(result.data) == b"abcdef" and result.end == 106
    assert receiver.state == STREAMING


def test_receiver_takes_a_committed_notice() -> None:
    assert streaming().frame({**OK, "committed": 90}, b"", log_end=100) == Committed(90)
    bad = streaming()
    assert isinstance(bad.frame({**OK, "committed": "x"}, b"", log_end=100), Doubt) and bad.state == CLOSED


@pytest.mark.parametrize("cut", [0, 1, CHUNK_HEAD_SIZE - 1, CHUNK_HEAD_SIZE, CHUNK_HEAD_SIZE + 3])
def test_receiver_closes_on_a_torn_chunk(cut: int) -> None:
    receiver = streaming()
    body = encode_chunk(7, 100, 3, b"abcdef")[:cut] or b"\0"  # an empty body is a committed notice
    result = receiver.frame(OK, body, log_end=100)
    assert isinstance(result, Doubt) and "torn" in result.reason and receiver.state == CLOSED


@pytest.mark.parametrize("chunk,log_end,why", [
    (encode_chunk(7, 90, 3, b"abcdef"), 100, "offset"),      # a gap (or an overlap)
    (encode_chunk(7, 100, 4, b"abcdef"), 100, "epoch"),       # another epoch
    (encode_chunk(8, 100, 3, b"abcdef"), 100, "stream 8"),    # another stream's chunk
    (CHUNK.pack(7, 100, 3, 6, zlib.crc32(b"abcdef") ^ 1) + b"abcdef", 100, "CRC"),
])
def test_receiver_closes_at_any_doubt(chunk: bytes, log_end: int, why: str) -> None:
    receiver = streaming()
    result = receiver.frame(OK, chunk, log_end=log_end)
    assert isinstance(result, Doubt) and why in result.reason and receiver.state == CLOSED
    # Closed stays closed: a good chunk after a doubt is not appended.
    assert isinstance(receiver.frame(OK, encode_chunk(7, log_end, 3, b"x"), log_end), Doubt)


def test_receiver_closes_on_the_masters_close_frame_and_on_close() -> None:
    receiver = streaming()
    result = receiver.frame({"code": 503, "opaque": 7, "msg": "slow slave"}, b"", log_end=0)
    assert isinstance(result, Doubt) and "slow slave" in result.reason
    other = streaming()
    assert other.close("reconnect") == Doubt("reconnect") and other.state == CLOSED
    early = StreamReceiver(7, 3)  # a chunk before the subscription's reply
    assert isinstance(early.frame(OK, encode_chunk(7, 0, 3, b"x"), 0), Doubt)


# --- sender ------------------------------------------------------------------------------------


def test_sender_pushes_contiguous_chunks_and_takes_reports_up_to_what_it_sent() -> None:
    sender = StreamSender(7, 3, start=100)
    chunk = sender.push(100, 3, b"abc")
    assert chunk == encode_chunk(7, 100, 3, b"abc") and sender.sent_end == 103
    assert sender.push(103, 3, b"de") == encode_chunk(7, 103, 3, b"de")
    assert sender.report(3, 103) == 103 and sender.acked_end == 103
    assert sender.report(3, 105) == 105
    assert sender.state == OPEN


@pytest.mark.parametrize("epoch,end,why", [(2, 100, "epoch"), (3, 106, "past what was sent")])
def test_sender_refuses_a_report_in_another_epoch_or_ahead_of_what_was_sent(epoch: int, end: int, why: str) -> None:
    sender = StreamSender(7, 3, start=100)
    sender.push(100, 3, b"abcde")
    result = sender.report(epoch, end)
    assert isinstance(result, Refused) and why in result.reason
    assert sender.acked_end == 100


@pytest.mark.parametrize("offset,epoch,size,why", [
    (101, 3, 1, "sent up to 100"),   # an append the stream did not carry came first
    (100, 4, 1, "epoch"),
    (100, 3, 65, "slow slave"),
])
def test_sender_closes_on_a_gap_an_epoch_change_or_a_slow_slave(offset: int, epoch: int, size: int, why: str) -> None:
    sender = StreamSender(7, 3, start=100, max_unacked=64)
    result = sender.push(offset, epoch, b"x" * size)
    assert isinstance(result, Doubt) and why in result.reason and sender.state == CLOSED
    assert isinstance(sender.push(100, 3, b"x"), Doubt)
    assert isinstance(sender.report(3, 100), Refused)


def test_reports_encode_and_decode() -> None:
    assert decode_report(encode_report(7, 3, 1 << 40)) == (7, 3, 1 << 40)
    with pytest.raises(ValueError, match="16 bytes"):
        decode_report(b"\0" * 15)


# --- the slave's mode table --------------------------------------------------------------------


def test_every_mode_transition_is_a_row_and_nothing_else_moves() -> None:
    for mode in Mode:
        for event in ModeEvent:
            replica = ReplicaMode()
            replica.mode = mode
            moved = replica.apply(event)
            assert moved == ((mode, event) in TRANSITIONS)
            assert replica.mode == TRANSITIONS.get((mode, event), mode)
    # Every way out of the stream leads to fetching.
    assert {after for (before, _), after in TRANSITIONS.items() if before is not Mode.FETCHING} <= {Mode.STREAMING, Mode.FETCHING}


# --- the master's hub --------------------------------------------------------------------------


class Conn:
    def __init__(self) -> None:
        self.sent: list[tuple[dict, bytes]] = []
        self.peer = "peer"

    def send_reply(self, header: dict, body: bytes = b"") -> None:
        self.sent.append((dict(header), bytes(body)))


def push(hub: StreamHub, key: tuple[str, int], offset: int, epoch: int, data: bytes) -> None:
    """What the leader append entry does: push to the streams in the partition's record, if any."""
    subs = hub.records.replication(*key).streams
    if subs:
        hub.push(subs, offset, epoch, data)


def test_hub_pushes_to_subscribers_and_binds_reports_to_their_connection() -> None:
    hub = StreamHub()
    assert not hub
    conn, other = Conn(), Conn()
    hub.subscribe(conn, 0, ("t", 0), 7, epoch=3, start=0)
    push(hub, ("t", 0), 0, 3, b"abc")  # no committed_of set: the chunk carries none
    push(hub, ("t", 1), 0, 3, b"abc")  # nobody streams t-1
    assert conn.sent == [({"opaque": 7, "code": 200}, encode_chunk(7, 0, 3, b"abc"))]
    assert hub.report(other, 7, 3, 3) is None and hub.reports_refused == 1  # another connection
    assert hub.report(conn, 8, 3, 3) is None  # a stream it does not hold
    assert hub.report(conn, 7, 3, 3) == (0, ("t", 0), 3)
    assert hub.report(conn, 7, 3, 9) is None  # ahead of what was sent: refused, and closed
    assert not hub and conn.sent[-1][0]["code"] == 503
    refused = hub.reports_refused
    assert hub.report(conn, 7, 3, 3) is None  # crossed the close on the wire: dropped, not counted
    assert hub.reports_refused == refused


def test_hub_closes_streams_on_an_unstreamed_append_a_dropped_partition_and_a_closed_connection() -> None:
    hub = StreamHub()
    conn = Conn()
    hub.subscribe(conn, 0, ("t", 0), 7, epoch=3, start=0)
    hub.appended(("t", 0), 0)  # nothing new: stays
    assert hub
    hub.appended(("t", 0), 40)  # a change of the log the stream did not carry
    assert not hub and "not streamed" in conn.sent[-1][0]["msg"]
    hub.subscribe(conn, 0, ("t", 0), 8, epoch=3, start=40)
    record = hub.records.replication("t", 0)
    hub.records.drop([("t", 0)])  # the partition's record closes its streams as it goes
    assert not hub and "no longer served" in conn.sent[-1][0]["msg"] and record.streams is None
    hub.subscribe(conn, 0, ("t", 0), 9, epoch=3, start=40)
    hub.subscribe(conn, 0, ("t", 0), 10, epoch=3, start=40)  # again on the same connection: the newer wins
    assert hub.streams() == 1
    hub.connection_closed(conn)
    assert not hub and hub.report(conn, 10, 3, 40) is None


def test_hub_tells_committed_offsets_with_chunks_or_after_a_quiet_moment() -> None:
    async def go() -> list:
        hub = StreamHub()
        conn = Conn()
        committed = {"value": 0}
        hub.committed_of = lambda key: committed["value"]
        hub.subscribe(conn, 0, ("t", 0), 7, epoch=3, start=0)
        push(hub, ("t", 0), 0, 3, b"abc")  # the chunk carries committed 0
        committed["value"] = 3
        hub.committed_moved(("t", 0))
        hub.committed_moved(("t", 0))
        hub.committed_moved(("t", 1))  # not streamed: nothing
        await asyncio.sleep(0.05)  # no chunk since: one notice
        push(hub, ("t", 0), 3, 3, b"de")  # carries 3
        hub.committed_moved(("t", 0))  # still 3 when the notice would go: not sent again
        await asyncio.sleep(0.05)
        return [(header, len(body)) for header, body in conn.sent]

    assert asyncio.run(go()) == [
        ({"opaque": 7, "code": 200, "committed": 0}, CHUNK_HEAD_SIZE + 3),
        ({"opaque": 7, "code": 200, "committed": 3}, 0),
        ({"opaque": 7, "code": 200, "committed": 3}, CHUNK_HEAD_SIZE + 2),
    ]
