"""Typed requests (protocol/messages.py) and reply views (protocol/replies.py)."""

from __future__ import annotations

from types import SimpleNamespace

import msgpack
import pytest

from metaq.protocol import codes
from metaq.protocol.frames import Frame
from metaq.protocol.messages import (
    REQUESTS,
    ChecksumRequest,
    GetRequest,
    PositionRequest,
    PutRequest,
    StatsRequest,
    TopicsRequest,
    parse_request,
    replica_field,
    text_request,
)
from metaq.protocol.replies import ChecksumReply, EpochEndReply, EpochsReply, FetchReply, OffsetReply, PutReply, ReplyError, StatsReply, TopicsReply
from metaq.server.stats import encode_map, render

from tests.unit.test_protocol_compiled import both_implementations  # noqa: F401  (a fixture)

#: Every case runs with the compiled request path and in pure Python (metaq/_speedups.c).
pytestmark = pytest.mark.usefixtures("both_implementations")


def received(request, opaque: int = 7):  # noqa: ANN001, ANN201
    """What the broker parses from a request as the client would send it."""
    header = msgpack.unpackb(msgpack.packb({**request.to_header(), "opaque": opaque}), raw=False)
    return parse_request(Frame(header, bytearray(b"body")))


@pytest.mark.parametrize(
    "request_",
    [
        PutRequest(topic="t", partition=2, count=3),
        GetRequest(topic="t", partition=0, offset=10, max_size=4096, group="g", max_wait_ms=5,
                   replica=replica_field(1, 4, 10)),
        PositionRequest(topic="t", partition=1, replica=replica_field(2, 3, 99)),
        ChecksumRequest(topic="t", partition=0, start=0, end=4096),
        StatsRequest(item="offsets", format="map"),
        TopicsRequest(),
    ],
)
def test_round_trip_keeps_every_field(request_) -> None:  # noqa: ANN001
    parsed = received(request_)
    assert type(parsed) is type(request_)
    assert parsed.to_header() == request_.to_header()
    assert parsed.opaque == 7 and parsed.body == b"body" and parsed.op == request_.OP


def test_optional_fields_take_their_defaults_and_none_is_not_sent() -> None:
    put = PutRequest(topic="t")
    assert put.to_header() == {"op": "put", "topic": "t", "partition": -1}  # count None: left out
    parsed = received(put)
    assert (parsed.partition, parsed.count) == (-1, None)
    get = received(GetRequest(topic="t", partition=0, offset=0))
    assert (get.max_size, get.group, get.max_wait_ms, get.replica) == (1024 * 1024, "", 0, None)


def test_every_command_has_a_class() -> None:
    assert set(REQUESTS) == {"put", "get", "offset", "stats", "version", "quit", "config", "topics",
                             "epoch_end", "epochs", "checksum", "position", "init_producer", "transaction",
                             "offset_for_time", "news", "stream", "stream_ack"}


@pytest.mark.parametrize(
    "header, message",
    [
        ({"op": "position", "topic": "t", "partition": 0}, "position: missing field 'replica'"),
        ({"op": "checksum", "topic": "t", "partition": 0, "start": 0, "end": "9"}, "checksum: field 'end' must be int"),
        ({"op": "get", "topic": 5, "partition": 0, "offset": 0}, "get: field 'topic' must be str"),
        ({"op": "get", "topic": "t", "partition": 0, "offset": False}, "get: field 'offset' must be int"),
        ({"op": "position", "topic": "t", "partition": 0, "replica": [1]}, "position: field 'replica' must be dict"),
        ({"op": "stats", "format": "json"}, "stats: field 'format' must be one of text, map"),
    ],
)
def test_bad_fields_are_a_one_line_400(header: dict, message: str) -> None:
    with pytest.raises(codes.RequestError) as err:
        parse_request(Frame({**header, "opaque": 3}, bytearray()))
    assert (err.value.code, err.value.message, err.value.opaque) == (codes.BAD_REQUEST, message, 3)


def test_text_stats_is_a_stats_request() -> None:
    req = text_request(["stats", "offsets", "12"])
    assert isinstance(req, StatsRequest) and (req.item, req.format) == ("offsets", "text")


def reply(body: bytes = b"", **header):  # noqa: ANN003, ANN201
    return SimpleNamespace(header={"opaque": 1, **header}, body=body)


def test_reply_views_name_their_fields() -> None:
    put = PutReply.of(reply(code=200, partition=1, offset=0, msg_id=9, count=2, end_offset=40, epoch=3))
    assert (put.partition, put.end_offset, put.epoch) == (1, 40, 3)
    assert OffsetReply.of(reply(code=200, offset=0, min_offset=0, max_offset=80)).max_offset == 80
    assert ChecksumReply.of(reply(code=200, start=0, end=10, crc=123)).crc == 123
    assert EpochsReply.of(reply(code=200, entries=[[1, 0], [2, 40]])).entries == [(1, 0), (2, 40)]
    assert EpochEndReply.of(reply(code=200, epoch=2, end_offset=40)) == EpochEndReply(2, 40)
    assert FetchReply.of(reply(b"log", code=200, offset=0, committed=3, log_end=3, epoch=1)).body == b"log"
    topics = TopicsReply.of(reply(code=200, topics={"t": 2}, role="master", epoch=4, replication_mode="sync"))
    assert (topics.topics, topics.replication_mode) == ({"t": 2}, "sync")


def test_a_topic_is_served_as_written_only_in_its_incarnation() -> None:
    """metaq topics create --wait: a member still serving the old incarnation of a topic
    re-created with as many partitions has not applied the create (its acks would be lost)."""
    old = TopicsReply.of(reply(code=200, topics={"x": 2, "seeded": 1}, incarnations={"x": "old"}))
    assert old.serves("x", 2, "old") and not old.serves("x", 2, "new")
    assert not old.serves("x", 3, "old") and not old.serves("x", None, None)
    assert old.serves("seeded", 1, None) and old.serves("seeded", 1, "") and not old.serves("seeded", 1, "new")
    assert old.serves("gone", None, None)  # deleted: not served at all, whatever the id was


def test_reply_views_reject_errors_and_missing_fields() -> None:
    with pytest.raises(ReplyError, match="403 put: not the master") as err:
        PutReply.of(reply(code=403, msg="not the master"))
    assert err.value.code == 403
    with pytest.raises(ReplyError, match="checksum: malformed reply"):
        ChecksumReply.of(reply(code=200, start=0, end=10))


def test_stats_map_and_text_come_from_the_same_pairs() -> None:
    row = {"log_end": 40, "lag_bytes": 0, "lag_messages": 0, "lag_ms": 0, "approx": True,
           "last_fetch_ms_ago": 3, "heartbeat_age_ms": -1}
    pairs = [("pid", 12), ("slave1 t-0-0", row), ("t-0-1", {"min_offset": 0, "max_offset": 8, "committed": 8, "flushed": 8}),
             ("replica t-0-0", {"state": "stopped", "error": "diverged at 40"})]
    text = render(pairs)
    assert text.splitlines() == [
        "STATS",
        "pid 12",
        "slave1 t-0-0 log_end=40 lag_bytes=0 lag_messages=0 lag_ms=0 approx last_fetch_ms_ago=3 heartbeat_age_ms=-1",
        "t-0-1 min_offset=0 max_offset=8 committed=8 flushed=8",
        "replica t-0-0 state=stopped error='diverged at 40'",
        "END",
    ]
    stats = StatsReply.of(reply(encode_map(pairs), code=200, format="map"))
    assert stats.get("pid") == 12
    assert stats.row("t-0-1") == {"min_offset": 0, "max_offset": 8, "committed": 8, "flushed": 8}
    assert stats.slave_rows() == [(1, "t-0-0", row)]
    assert stats.replica_rows() == {"t-0-0": {"state": "stopped", "error": "diverged at 40"}}


def test_stats_reader_refuses_text() -> None:
    with pytest.raises(ReplyError, match="not in format 'map'"):
        StatsReply.of(reply(b"STATS\r\nEND\r\n", code=200))
