"""Fuzzing a live broker (in-process, zk.zkEnable=false, a loopback port) with garbage and
malformed frames over real sockets: it never crashes, never appends a byte to a log, and
still serves a good put/get afterwards."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from metaq.config import parse_server_ini
from metaq.protocol.frames import MAGIC, PREFIX, VERSION, Frame, FrameDecoder, encode_frame
from metaq.record import RecordError, encode_batch, encode_record, iter_records, validate_batch
from metaq.server.broker import Broker

SERVER_INI = """\
[system]
brokerId=5
hostName=127.0.0.1
serverPort=0
dataPath={data}
unflushThreshold=0
maxMessageSize=4096

[zookeeper]
zk.zkEnable=false

[topic=fz]
numPartitions=2
"""
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])


class BrokerThread:
    def __init__(self, tmp: Path) -> None:
        path = tmp / "server.ini"
        path.write_text(SERVER_INI.format(data=tmp / "data"))
        self.config = parse_server_ini(path.read_bytes(), str(path))
        self.loop = asyncio.new_event_loop()
        self.broker: Broker | None = None
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.set_exception_handler(lambda loop, ctx: self.errors.append(ctx.get("exception") or
                                                                           RuntimeError(ctx["message"])))
        self.loop.run_forever()

    def start(self) -> "BrokerThread":
        self.thread.start()
        self.broker = Broker(self.config)
        asyncio.run_coroutine_threadsafe(self.broker.start(), self.loop).result(20)
        return self

    def ends(self) -> dict:
        async def read() -> dict:
            return {key: log.log_end for key, log in self.broker.store.logs().items()}
        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.broker.stop(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, rec: logging.LogRecord) -> None:
        self.records.append(self.format(rec))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    errors = _Errors()
    logging.getLogger("metaq").addHandler(errors)
    server = BrokerThread(tmp_path_factory.mktemp("fuzzbroker")).start()
    server.logged = errors.records
    # Some data first, so that gets have something to read and ends are non-zero.
    with socket.create_connection(("127.0.0.1", server.broker.port), timeout=5) as sock:
        for p in (0, 1):
            assert request(sock, {"op": "put", "topic": "fz", "partition": p, "opaque": p},
                           encode_batch([(b"seed", None)])).header["code"] == 200
    yield server
    server.stop()
    logging.getLogger("metaq").removeHandler(errors)


def request(sock: socket.socket, header: dict, body: bytes = b"") -> Frame:
    sock.sendall(encode_frame(header, body))
    decoder = FrameDecoder()
    while True:
        event = decoder.next_event()
        if isinstance(event, Frame):
            return event
        data = sock.recv(65536)
        assert data, "broker closed the connection"
        decoder.receive_data(data)


def blast(port: int, chunks: list[bytes]) -> None:
    """Send the chunks, half-close, read whatever comes back until the broker closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        try:
            for chunk in chunks:
                sock.sendall(chunk)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except (ConnectionError, socket.timeout, OSError):
            pass


def corrupt_batch(data: st.DataObject) -> bytes:
    msgs = data.draw(st.lists(st.tuples(st.binary(max_size=64), st.none()), min_size=1, max_size=4))
    batch = bytearray(encode_batch(msgs))
    kind = data.draw(st.sampled_from(["flip", "truncate", "extend", "huge"]))
    if kind == "flip":
        pos = data.draw(st.integers(0, len(batch) - 1))
        batch[pos] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        batch = batch[: data.draw(st.integers(1, len(batch) - 1))]
    elif kind == "extend":
        batch += data.draw(st.binary(min_size=1, max_size=19))
    else:
        batch = bytearray(encode_record(b"z" * 5000))  # over maxMessageSize
    try:
        validate_batch(batch, 4096)
    except RecordError:
        return bytes(batch)
    assume(False)
    return b""


values = st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=10), st.binary(max_size=10),
                   st.none(), st.booleans(), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
                   st.dictionaries(st.text(max_size=8), st.integers(-5, 10**12), max_size=4))
ops = st.sampled_from(["put", "get", "offset", "stats", "version", "config", "topics", "epoch_end",
                       "epochs", "checksum", "nope", ""])
fields = st.dictionaries(st.sampled_from(["topic", "partition", "offset", "max_size", "group", "max_wait_ms",
                                          "replica", "count", "epoch", "start", "end", "item", "opaque"]),
                         values, max_size=6)


@st.composite
def attack(draw) -> list[bytes]:
    data = draw(st.data())
    kind = draw(st.sampled_from(["random", "frame", "put", "text", "prefix", "mixed"]))
    if kind == "random":
        return [draw(st.binary(min_size=1, max_size=512))]
    if kind == "text":
        return [draw(st.text(alphabet=st.characters(min_codepoint=1, max_codepoint=127), max_size=80)).encode() + b"\n"]
    if kind == "prefix":
        return [PREFIX.pack(MAGIC, draw(st.integers(0, 255)), draw(st.integers(0, 2**32 - 1)),
                            draw(st.integers(0, 2**32 - 1))) + draw(st.binary(max_size=64))]
    header = {"op": draw(ops), "opaque": draw(values), **draw(fields)}
    if kind == "frame":
        return [encode_frame(header, draw(st.binary(max_size=128)))]
    put = {"op": "put", "topic": draw(st.sampled_from(["fz", "nope", ""])),
           "partition": draw(st.integers(-3, 3)), "opaque": draw(st.integers(0, 100))}
    frame = encode_frame(put, corrupt_batch(data))
    if kind == "put":
        return [frame]
    # mixed: a good ping, the corrupt put, then a truncated frame
    cut = draw(st.integers(1, len(frame) - 1))
    return [encode_frame({"op": "version", "opaque": 1}), frame, frame[:cut]]


def test_good_traffic_roundtrip(live):
    with socket.create_connection(("127.0.0.1", live.broker.port), timeout=5) as sock:
        assert request(sock, {"op": "version", "opaque": 9}).header["code"] == 200


@SETTINGS
@given(attack())
def test_garbage_never_crashes_or_writes(live, chunks):
    before = live.ends()
    blast(live.broker.port, chunks)
    assert live.ends() == before
    assert not live.errors, live.errors
    assert not live.logged, live.logged[-3:]


def test_broker_still_serves_after_the_fuzzing(live):
    ends = live.ends()
    with socket.create_connection(("127.0.0.1", live.broker.port), timeout=5) as sock:
        reply = request(sock, {"op": "put", "topic": "fz", "partition": 0, "opaque": 77},
                        encode_batch([(b"after-fuzz", None)]))
        assert reply.header["code"] == 200, reply.header
        offset = reply.header["offset"]
        assert offset == ends[("fz", 0)]
        got = request(sock, {"op": "get", "topic": "fz", "partition": 0, "offset": offset, "opaque": 78})
        assert got.header["code"] == 200
        assert [r.data for r in iter_records(got.body, offset)] == [b"after-fuzz"]
    assert not live.errors, live.errors
