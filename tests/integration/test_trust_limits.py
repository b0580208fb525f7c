"""A broker's memory and connections are bounded against one hostile client.

Real broker processes; the hostile client is a raw socket. RSS is read from /proc.

* 400k pipelined ``stats`` from a client that never reads: the broker stops reading
  (maxQueuedReplyBytes) instead of queueing every reply; RSS stays bounded;
* slowloris: a frame whose body never completes is closed after requestBodyTimeoutMs;
* an idle connection is closed after connectionIdleTimeoutMs;
* past maxConnections a new connection is refused with a log line.
"""

from __future__ import annotations

import socket
import time

from metaq.protocol.frames import NEED_DATA, Frame, FrameDecoder, encode_frame, encode_frame_head
from metaq.protocol.messages import StatsRequest
from metaq.protocol.replies import StatsReply
from metaq.tools.launcher import wait_until

from .replication_support import put
from .trust_support import rss_mb

TOPIC = "t"



def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """True once the broker closed the connection (EOF or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_a_client_that_never_reads_cannot_grow_the_broker(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(0, {TOPIC: 1}, {"maxQueuedReplyBytes": 1024 * 1024})
    put(broker, TOPIC, 0, 20)  # something for stats to say
    before = rss_mb(broker.pid)
    frames = b"".join(encode_frame({"op": "stats", "opaque": n}) for n in range(400_000))
    with socket.create_connection(broker.address) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        try:
            sock.sendall(frames)  # blocks once the broker stops reading: the point of the test
        except socket.timeout:
            pass
        time.sleep(1)
        grown = rss_mb(broker.pid) - before
    assert grown < 40, f"RSS grew by {grown:.0f} MB for a client that reads nothing"
    with socket.create_connection(broker.address, timeout=5) as other:
        other.sendall(b"version\r\n")
        assert other.recv(100).startswith(b"metaq-py"), "the broker still serves others"


def test_slowloris_and_idle_connections_are_closed(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(0, {TOPIC: 1}, {"requestBodyTimeoutMs": 1000, "connectionIdleTimeoutMs": 2000})
    with socket.create_connection(broker.address) as slow, socket.create_connection(broker.address) as idle:
        slow.sendall(encode_frame_head({"op": "put", "opaque": 1, "topic": TOPIC, "partition": 0}, 1_000_000) + b"x" * 1000)
        started = time.monotonic()
        assert closed_by_peer(slow, 5), "a body that never completes must not hold the connection"
        assert time.monotonic() - started < 4
        assert closed_by_peer(idle, 5)
    assert "requestBodyTimeoutMs" in broker.log_text() and "connectionIdleTimeoutMs" in broker.log_text()


def test_connections_past_the_limit_are_refused_with_a_log_line(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(0, {TOPIC: 1}, {"maxConnections": 4})
    held = [socket.create_connection(broker.address) for _ in range(4)]
    try:
        wait_until(lambda: _connections_counted(held[0]) == 4, 5, message="4 connections counted")
        extra = socket.create_connection(broker.address)
        assert closed_by_peer(extra, 5)
        extra.close()
        assert "refusing connection" in broker.log_text() and "maxConnections=4" in broker.log_text()
    finally:
        for sock in held:
            sock.close()
    with socket.create_connection(broker.address, timeout=5) as again:
        again.sendall(b"version\r\n")
        assert again.recv(100).startswith(b"metaq-py"), "freed slots are usable again"


def _connections_counted(sock: socket.socket) -> int:
    """``curr_connections`` asked over a held connection (binary stats: a plain-text answer would close it)."""
    sock.settimeout(5)
    sock.sendall(encode_frame(StatsRequest(format="map").to_header() | {"opaque": 1}))
    decoder = FrameDecoder(max_body=1 << 20)
    while True:
        event = decoder.next_event()
        if isinstance(event, Frame):
            return int(StatsReply.of(event).get("curr_connections"))
        if event is not NEED_DATA:
            raise AssertionError(f"unexpected reply event {event!r}")
        decoder.receive_data(sock.recv(65536))
