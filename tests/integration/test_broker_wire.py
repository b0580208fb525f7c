"""Bad input against a live broker process, its plain-text commands, and `metaq stats`.

One broker serves the whole module. After every bad input the test checks that the
process is still alive and serves a normal put and get on a fresh connection, and,
where a put was refused, that the log end did not move.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import sys
import uuid
from typing import Any, Iterator

import msgpack
import pytest

from metaq import record
from metaq.client.connection import BrokerConnection
from metaq.tools.launcher import BrokerFactory, BrokerProcess
from metaq.protocol.frames import MAGIC, PREFIX, VERSION, FrameDecoder, Frame, encode_frame, CLOSED, NEED_DATA

TOPIC = "t"
MAX_MESSAGE_SIZE = 64 * 1024
# The broker's frame limit: min(64 MiB, 16 * maxMessageSize + 64 KiB).
FRAME_LIMIT = 16 * MAX_MESSAGE_SIZE + 64 * 1024


@pytest.fixture(scope="module")
def broker(zk, tmp_path_factory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("wire"), zk.connect_string, f"/meta-{uuid.uuid4().hex[:12]}")
    try:
        yield factory(
            0, {TOPIC: 2, "closed": {"acceptPublish": "false"}},
            system={"unflushThreshold": 0, "maxMessageSize": MAX_MESSAGE_SIZE},
        )
    finally:
        factory.stop_all()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- helpers ------------------------------------------------------------------------------


def raw_exchange(broker: BrokerProcess, data: bytes, shutdown: bool = False, timeout: float = 5.0) -> tuple[list[Frame], bool]:
    """Send raw bytes; return the reply frames read and whether the broker closed the socket."""
    decoder = FrameDecoder(allow_text=False)
    frames: list[Frame] = []
    with socket.create_connection(broker.address, timeout=timeout) as sock:
        sock.sendall(data)
        if shutdown:
            sock.shutdown(socket.SHUT_WR)
        sock.settimeout(1.0)
        closed = False
        while True:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break  # no more replies, connection still open
            decoder.receive_data(chunk)
            while (event := decoder.next_event()) not in (NEED_DATA, CLOSED):
                assert isinstance(event, Frame), event
                frames.append(event)
            if not chunk:
                closed = True
                break
    return frames, closed


def text_exchange(broker: BrokerProcess, line: bytes, until: bytes | None) -> tuple[bytes, bool]:
    """Send one text line; read until ``until`` appears (or, with None, until the broker closes)."""
    with socket.create_connection(broker.address, timeout=5) as sock:
        sock.sendall(line)
        sock.settimeout(2.0)
        out = b""
        while until is None or until not in out:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                return out, False
            if not chunk:
                return out, True
            out += chunk
        return out, False


async def request(broker: BrokerProcess, header: dict[str, Any], body: bytes = b"") -> Any:
    async with await BrokerConnection.open(broker.host, broker.port) as conn:
        return await conn.request(header, body, timeout=10)


def log_end(broker: BrokerProcess, partition: int = 0) -> int:
    reply = run(request(broker, {"op": "get", "topic": TOPIC, "partition": partition, "offset": 0, "max_size": 1}))
    assert reply.code in (200, 404), reply.header
    return int(reply["log_end"])


def assert_healthy(broker: BrokerProcess) -> None:
    """The broker is alive and serves a normal put and get on a fresh connection."""
    assert broker.alive, f"the broker died; log:\n{broker.log_text(30)}"
    data = f"health-{uuid.uuid4().hex}".encode()

    async def check() -> None:
        async with await BrokerConnection.open(broker.host, broker.port) as conn:
            for _ in range(100):  # 503 only while the broker is still starting
                put = await conn.request({"op": "put", "topic": TOPIC, "partition": 1}, record.encode_record(data))
                if put.code != 503:
                    break
                await asyncio.sleep(0.05)
            assert put.code == 200, put.header
            got = await conn.request({"op": "get", "topic": TOPIC, "partition": 1, "offset": put["offset"], "max_size": 4096})
            assert got.code == 200, got.header
            assert next(record.iter_records(got.body, put["offset"])).data == data

    run(check())


def put_frame(body: bytes, opaque: int = 7, **fields: Any) -> bytes:
    return encode_frame({"op": "put", "opaque": opaque, "topic": TOPIC, "partition": 0, **fields}, body)


# --- malformed frames -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"\x00\x01garbage-bytes\n", "bad frame start byte 0x00"),
        (b"\xff" * 32, "bad frame start byte 0xff"),
        (PREFIX.pack(MAGIC, 9, 2, 0) + b"\x80\x80", "unsupported protocol version 9"),
        (PREFIX.pack(MAGIC, VERSION, 0x7FFFFFFF, 0) + b"x" * 100, "frame header of 2147483647 bytes exceeds the limit"),
        (b"G" * 2000, "text command line longer than"),
    ],
    ids=["garbage", "high-bytes", "bad-version", "huge-header-length", "endless-text-line"],
)
def test_unparseable_stream_gets_a_400_and_a_closed_connection(broker, data: bytes, expected: str) -> None:
    before = log_end(broker)
    frames, closed = raw_exchange(broker, data)
    assert closed, "after an unparseable frame the broker must close the connection"
    assert len(frames) == 1 and frames[0].header["code"] == 400, frames
    assert expected in frames[0].header["msg"]
    assert log_end(broker) == before
    assert_healthy(broker)


def test_header_that_is_not_a_map_costs_only_that_request(broker) -> None:
    not_a_map = msgpack.packb([1, 2, 3])
    bad = PREFIX.pack(MAGIC, VERSION, len(not_a_map), 0) + not_a_map
    not_msgpack = b"\xc1\xc1\xc1"
    bad2 = PREFIX.pack(MAGIC, VERSION, len(not_msgpack), 0) + not_msgpack
    good = encode_frame({"op": "version", "opaque": 42})
    frames, closed = raw_exchange(broker, bad + bad2 + good)
    assert not closed
    assert [f.header["code"] for f in frames] == [400, 400, 200]
    assert "must be a map" in frames[0].header["msg"]
    assert "not valid msgpack" in frames[1].header["msg"]
    assert frames[2].header["opaque"] == 42
    assert_healthy(broker)


def test_oversized_put_gets_a_400_naming_the_size_and_the_connection_stays_usable(broker) -> None:
    before = log_end(broker)
    size = FRAME_LIMIT + 1000
    body = b"\x00" * size

    async def scenario() -> None:
        async with await BrokerConnection.open(broker.host, broker.port) as conn:
            reply = await conn.request({"op": "put", "topic": TOPIC, "partition": 0}, body, timeout=10)
            assert reply.code == 400
            assert f"request body of {size} bytes exceeds the limit of {FRAME_LIMIT} bytes" in reply.message
            # Same connection: the oversized body was skipped, the framing is intact.
            ok = await conn.request({"op": "put", "topic": TOPIC, "partition": 0}, record.encode_record(b"after-oversized"))
            assert ok.code == 200 and ok["offset"] == before, ok.header

    run(scenario())
    assert_healthy(broker)


def test_message_over_max_message_size_is_refused_whole(broker) -> None:
    before = log_end(broker)
    batch = record.encode_record(b"small") + record.encode_record(b"x" * (MAX_MESSAGE_SIZE + 1))
    reply = run(request(broker, {"op": "put", "topic": TOPIC, "partition": 0}, batch))
    assert reply.code == 400
    assert f"exceeds the limit of {MAX_MESSAGE_SIZE} bytes" in reply.message
    assert log_end(broker) == before, "nothing of a refused batch is written, not even its good first record"
    assert_healthy(broker)


@pytest.mark.parametrize("cut", [3, 12, 40])
def test_truncated_frame_then_close_writes_nothing(broker, cut: int) -> None:
    before = log_end(broker)
    frame = put_frame(record.encode_batch([(b"never-stored", None)] * 3))
    frames, closed = raw_exchange(broker, frame[: len(frame) - cut], shutdown=True)
    assert closed
    assert all(f.header["code"] == 400 for f in frames), frames
    assert log_end(broker) == before
    assert_healthy(broker)


def test_put_with_a_corrupted_crc_is_refused_and_nothing_is_written(broker) -> None:
    before = log_end(broker)
    good = record.encode_record(b"fine")
    bad = bytearray(record.encode_record(b"payload-to-corrupt"))
    bad[-1] ^= 0xFF  # the payload no longer matches its CRC
    reply = run(request(broker, {"op": "put", "topic": TOPIC, "partition": 0}, good + bytes(bad)))
    assert reply.code == 400
    assert "checksum mismatch" in reply.message
    assert log_end(broker) == before
    assert_healthy(broker)


@pytest.mark.parametrize(
    "body, expected",
    [
        (b"\x00\x00\x00\x05\x00", "truncated header"),
        (struct.pack(">iiqi", 1000, 0, 0, 0) + b"short", "truncated payload"),
        (struct.pack(">iiqi", -5, 0, 0, 0), "negative length"),
        (struct.pack(">iiqi", 4, record.checksum(b"abcd"), 0, 0x10) + b"abcd", "unknown flag bits"),
        (b"", "put carries no messages"),
    ],
    ids=["short-header", "lying-length", "negative-length", "unknown-flag", "empty"],
)
def test_malformed_records_are_refused(broker, body: bytes, expected: str) -> None:
    before = log_end(broker)
    reply = run(request(broker, {"op": "put", "topic": TOPIC, "partition": 0}, body))
    assert reply.code == 400 and expected in reply.message, reply.header
    assert log_end(broker) == before
    assert_healthy(broker)


def test_unknown_topic_is_a_404_naming_it(broker) -> None:
    for op in ({"op": "put", "partition": 0}, {"op": "get", "partition": 0, "offset": 0}):
        reply = run(request(broker, {**op, "topic": "no-such-topic"}, record.encode_record(b"x")))
        assert reply.code == 404, reply.header
        assert "no-such-topic" in reply.message
    assert_healthy(broker)


def test_partition_out_of_range_is_a_400_naming_num_partitions(broker) -> None:
    for partition in (2, 99, -2):
        for op in ({"op": "put"}, {"op": "get", "offset": 0}):
            reply = run(request(broker, {**op, "topic": TOPIC, "partition": partition}, record.encode_record(b"x")))
            assert reply.code == 400, (partition, reply.header)
            assert "numPartitions is 2" in reply.message
    assert_healthy(broker)


def test_topic_that_refuses_publishing_is_a_403(broker) -> None:
    reply = run(request(broker, {"op": "put", "topic": "closed", "partition": 0}, record.encode_record(b"x")))
    assert reply.code == 403 and "closed" in reply.message


@pytest.mark.parametrize(
    "header, expected",
    [
        ({"op": "put", "topic": TOPIC, "partition": "zero"}, "field 'partition' must be int"),
        ({"op": "put", "topic": 17, "partition": 0}, "field 'topic' must be str"),
        ({"op": "put", "topic": TOPIC, "partition": True}, "field 'partition' must be int"),
        ({"op": "get", "topic": TOPIC, "partition": 0, "offset": 1.5}, "field 'offset' must be int"),
        ({"op": "get", "topic": TOPIC, "partition": 0}, "missing field 'offset'"),
        ({"op": "get", "topic": TOPIC, "partition": 0, "offset": 0, "replica": [1]}, "field 'replica' must be dict"),
        ({"op": "get", "topic": TOPIC, "partition": 0, "offset": 0, "max_size": 0}, "max_size must be positive"),
        ({"op": "frobnicate"}, "unknown command 'frobnicate'"),
        ({"op": 5}, "needs a string 'op'"),
        ({"op": "put", "topic": TOPIC, "partition": 0, "count": 2}, "announced 2 messages but carries 1"),
    ],
)
def test_wrong_field_types_get_a_400(broker, header: dict[str, Any], expected: str) -> None:
    before = log_end(broker)
    reply = run(request(broker, header, record.encode_record(b"x")))
    assert reply.code == 400, reply.header
    assert expected in reply.message
    assert log_end(broker) == before
    assert_healthy(broker)


def test_request_without_an_opaque_gets_a_400(broker) -> None:
    frames, closed = raw_exchange(broker, encode_frame({"op": "version"}) + encode_frame({"op": "version", "opaque": "x"}))
    assert not closed
    assert [(f.header["code"], f.header["opaque"]) for f in frames] == [(400, -1), (400, -1)]
    assert "opaque" in frames[0].header["msg"]
    assert_healthy(broker)


# --- plain text (echo stats | nc) --------------------------------------------------------------


def test_plain_text_stats_version_unknown_and_quit(broker) -> None:
    out, _ = text_exchange(broker, b"stats\r\n", until=b"END\r\n")
    lines = out.decode().split("\r\n")
    assert lines[0] == "STATS" and lines[-2] == "END" and lines[-1] == ""
    pairs = dict(line.split(" ", 1) for line in lines[1:-2])
    assert pairs["broker_id"] == "0" and pairs["role"] == "master" and int(pairs["pid"]) == broker.pid

    out, _ = text_exchange(broker, b"stats offsets\n", until=b"END\r\n")
    assert f"{TOPIC}-0-0 min_offset=0" in out.decode()

    out, _ = text_exchange(broker, b"version\n", until=b"\r\n")
    assert out.decode().startswith("metaq-py ")

    out, _ = text_exchange(broker, b"flush all\n", until=b"\r\n")
    assert out.startswith(b"ERROR ") and b"flush" in out

    out, closed = text_exchange(broker, b"quit\n", until=None)
    assert closed and out == b""

    # Several commands on one connection, as `printf 'version\nstats\nquit\n' | nc` sends them.
    out, closed = text_exchange(broker, b"version\nstats topics\nquit\n", until=None)
    assert closed and out.startswith(b"metaq-py ") and out.endswith(b"END\r\n")

    # `echo stats | nc HOST PORT`: Debian's nc does not half-close after stdin ends, so the
    # broker closes the connection once it has answered (the exchange sends no EOF).
    for line in (b"stats\n", b"flush all\n"):
        out, closed = text_exchange(broker, line, until=None)
        assert closed and (out.endswith(b"END\r\n") or out.startswith(b"ERROR "))
    assert_healthy(broker)


# --- metaq stats HOST:PORT ---------------------------------------------------------------------


def metaq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metaq", *args], capture_output=True, text=True, timeout=30)


def test_metaq_stats_cli(broker) -> None:
    address = f"{broker.host}:{broker.port}"
    done = metaq("stats", address)
    assert done.returncode == 0, done.stderr
    # (text mode: the broker's \r\n line ends read as \n)
    assert done.stdout.startswith("STATS\n") and done.stdout.endswith("END\n")
    assert "broker_id 0" in done.stdout

    done = metaq("stats", address, "offsets")
    assert done.returncode == 0 and f"{TOPIC}-0-1 " in done.stdout

    done = metaq("stats", address, "no-such-item")
    assert done.returncode == 1 and done.stdout.startswith("ERROR unknown stats item")

    closed_port = socket.socket()
    closed_port.bind(("127.0.0.1", 0))
    port = closed_port.getsockname()[1]
    closed_port.close()
    # A malformed address is a usage error (exit 2: argparse's usage, then one line naming it);
    # a well-formed one nobody answers at is a failure (exit 1, one line).
    for bad, code in (("127.0.0.1", 2), ("no-port:", 2), ("127.0.0.1:http", 2), (f"127.0.0.1:{port}", 1)):
        done = metaq("stats", bad)
        assert done.returncode == code, (bad, done)
        assert done.stdout == ""
        error = done.stderr.strip().splitlines()[-1]
        assert len(done.stderr.strip().splitlines()) == 1 or code == 2, (bad, done.stderr)
        assert error.startswith("metaq stats: error:") and "Traceback" not in done.stderr, (bad, done.stderr)
