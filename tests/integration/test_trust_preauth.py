"""What a peer that has not logged in can hold of a broker.

Real broker processes; the attackers are raw sockets (from other loopback addresses
where the per-address cap is the point). RSS is read from /proc.

* frames being received are held within ``maxBufferedRequestBytes``, whatever the number
  of connections (security off: there is no login to wait for);
* before login only small ``auth``, ``version`` and ``quit`` frames are read: a declared
  big body, or any other request, closes the connection (security on);
* connection slots: a flood of connections that never log in neither keeps a user nor a
  slave out, a connection must log in within ``loginTimeoutMs``, and one address holds at
  most ``maxConnectionsPerAddress``; with TLS, a handshake that never comes is dropped at
  the same deadline.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from metaq.protocol.frames import encode_frame, encode_frame_head
from metaq.tools.launcher import free_port, wait_until
from metaq.zk.paths import ZkPaths
from tests.security_support import TestCA

from .replication_support import put, run
from .test_metrics import scrape, value
from .test_trust_limits import closed_by_peer
from .trust_support import SecuredGroup, put_as, request_as, rss_mb, stats

TOPIC = "t"
MiB = 1024 * 1024
BIG_BODY = 16 * MiB
PUT_HEAD = {"op": "put", "opaque": 1, "topic": TOPIC, "partition": 0}


def connect_from(source_host: str, address: tuple[str, int]) -> socket.socket:
    """A TCP connection to ``address`` from another loopback address (another "host")."""
    return socket.create_connection(address, timeout=10, source_address=(source_host, 0))


def first_reply(sock: socket.socket) -> bytes:
    """What the broker sent on ``sock`` within half a second (b"" if nothing)."""
    sock.settimeout(0.5)
    try:
        return sock.recv(4096)
    except socket.timeout:
        return b""


def test_frames_being_received_are_held_within_the_broker_budget(broker_factory) -> None:  # type: ignore[no-untyped-def]
    budget = 32 * MiB
    metrics_port = free_port("127.0.0.1")
    broker = broker_factory(0, {TOPIC: 1}, {"maxBufferedRequestBytes": budget, "metricsPort": metrics_port})
    put(broker, TOPIC, 0, 20)
    before = rss_mb(broker.pid)
    attackers = [socket.create_connection(broker.address, timeout=30) for _ in range(20)]
    try:
        # Each declares a 16 MiB put and sends 12 MiB of it: a body that never completes.
        def attack(sock: socket.socket) -> None:
            try:
                sock.sendall(encode_frame_head(PUT_HEAD, BIG_BODY) + bytes(12 * MiB))
            except OSError:
                pass

        with ThreadPoolExecutor(len(attackers)) as pool:
            list(pool.map(attack, attackers))
        grown = max(rss_mb(broker.pid) for _ in range(10) if time.sleep(0.1) is None) - before
        assert grown < budget / MiB, f"RSS grew by {grown:.0f} MB, more than maxBufferedRequestBytes ({budget // MiB} MB)"
        wait_until(lambda: stats(broker).get("refused_request_budget") == 19, 30, message="19 of 20 refused")
        now = stats(broker)
        assert BIG_BODY <= now.get("buffered_request_bytes") <= budget
        # The refused ones were told (503, retriable) and stay usable; others still put.
        assert sum(b"maxBufferedRequestBytes" in first_reply(sock) for sock in attackers) == 19
        assert put(broker, TOPIC, 0, 10, size=100_000, batch=10), "a put that arrives in many reads still fits"
        assert value(scrape(metrics_port), 'metaq_refusals_total{reason="request_budget"}') == 19
        assert "maxBufferedRequestBytes" in broker.log_text()
    finally:
        for sock in attackers:
            sock.close()
    wait_until(lambda: stats(broker).get("buffered_request_bytes") == 0, 10, message="the budget freed on close")


def test_before_login_only_small_login_frames_are_read(broker_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    group = SecuredGroup(tmp_path / "security")
    broker = broker_factory(0, {TOPIC: 1}, group.system)
    before = rss_mb(broker.pid)
    big_heads = [socket.create_connection(broker.address, timeout=10) for _ in range(20)]
    try:
        for sock in big_heads:
            sock.sendall(encode_frame_head(PUT_HEAD, BIG_BODY) + bytes(64 * 1024))
        assert all(closed_by_peer(sock, 5) for sock in big_heads), "a declared 16 MiB body before login closes at once"
    finally:
        for sock in big_heads:
            sock.close()
    assert rss_mb(broker.pid) - before < 16, "nothing of the bodies was kept"
    for frame in (
        encode_frame({"op": "version", "opaque": 1}, bytes(8 * 1024)),  # a login op, but too big a body
        encode_frame({"op": "topics", "opaque": 1}),  # not a login op
    ):
        with socket.create_connection(broker.address, timeout=10) as sock:
            sock.sendall(frame)
            assert closed_by_peer(sock, 5)
    with socket.create_connection(broker.address, timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:  # pipelined `version` frames whose answers are never read: no login is coming
            sock.sendall(encode_frame({"op": "version", "opaque": 1}) * 100_000)
        except OSError:
            pass
        assert closed_by_peer(sock, 5)
    assert "before login" in broker.log_text() and "replies unread before login" in broker.log_text()
    with socket.create_connection(broker.address, timeout=10) as sock:
        sock.sendall(b"version\r\n")
        assert sock.recv(100).startswith(b"metaq-py"), "version still answers before login"
    assert stats(broker, "ops").get("refused_before_login") == 23


class Flood:
    """Connections that say ``version`` and never log in, from ``hosts``, ``per_host`` each;
    one closed by the broker is opened again at once (an attacker keeping the slots)."""

    def __init__(self, address: tuple[str, int], hosts: tuple[str, ...], per_host: int) -> None:
        self.address, self.hosts, self.per_host = address, hosts, per_host
        self.selector = selectors.DefaultSelector()
        self.reopened = 0
        self._stop = threading.Event()
        for host in hosts:
            for _ in range(per_host):
                self._open(host)
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def _open(self, host: str) -> None:
        try:
            sock = connect_from(host, self.address)
            sock.sendall(encode_frame({"op": "version", "opaque": 1}))
        except OSError:
            return
        self.selector.register(sock, selectors.EVENT_READ, host)

    def _keep(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.selector.select(0.05):
                sock = key.fileobj
                try:
                    alive = bool(sock.recv(65536))  # type: ignore[union-attr]
                except OSError:
                    alive = False
                if not alive:
                    self.selector.unregister(sock)
                    sock.close()  # type: ignore[union-attr]
                    self.reopened += 1
                    self._open(key.data)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.selector.close()


def test_connections_that_never_log_in_keep_no_user_or_slave_out(broker_factory, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    group = SecuredGroup(tmp_path / "security")
    limits = {"maxConnections": 24, "maxConnectionsPerAddress": 12, "loginTimeoutMs": 2000}
    master = broker_factory(0, {TOPIC: 1}, {**group.system, **limits, "replicationMode": "sync", "unflushThreshold": 0})
    # Two hosts keep every slot taken by connections that never log in.
    flood = Flood(master.address, ("127.0.0.2", "127.0.0.3"), 12)
    try:
        # A user from another address gets in, logs in and is served.
        assert run(request_as(master, "app", {"op": "topics", "opaque": 1})).code == 200
        # So does a slave: it logs in with the group secret and joins the sync set.
        broker_factory(0, {TOPIC: 1}, {**group.system, "unflushThreshold": 0}, {"slaveId": 0})
        sync_set = ZkPaths(zk_root).sync_set(0)
        wait_until(lambda: zk_client.exists(sync_set) and json.loads(zk_client.get(sync_set)[0])["slaves"] == [0],
                   30, message="the slave in the sync set despite the flood")
        assert put_as(master, "app").code == 200, "a sync put is acked: the slave replicates through the flood"
        assert flood.reopened >= 1, "the flood's connections were closed for room, and came back"
        evicted = stats(master, "ops").get("refused_evicted")
    finally:
        flood.stop()
    assert evicted >= 1 and "not logged in, making room" in master.log_text()
    # One host holds at most its cap, and each connection that does not log in goes at the deadline.
    held = [connect_from("127.0.0.2", master.address) for _ in range(12)]
    try:
        extra = connect_from("127.0.0.2", master.address)
        assert closed_by_peer(extra, 5), "a 13th connection from one address is refused"
        extra.close()
        assert all(closed_by_peer(sock, 10) for sock in held), "closed at the login deadline"
    finally:
        for sock in held:
            sock.close()
    counts = stats(master, "ops")
    assert counts.get("refused_per_address") >= 1 and counts.get("refused_login_timeout") >= 12
    assert "maxConnectionsPerAddress=12" in master.log_text() and "loginTimeoutMs" in master.log_text()


def test_a_tls_handshake_that_never_comes_is_closed_at_the_login_deadline(broker_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ca = TestCA.create(tmp_path / "tls")
    cert, key = ca.issue("broker")
    broker = broker_factory(0, {TOPIC: 1}, {"tlsCertFile": str(cert), "tlsKeyFile": str(key), "loginTimeoutMs": 1000})
    with socket.create_connection(broker.address, timeout=10) as silent:  # TCP only: no ClientHello
        started = time.monotonic()
        assert closed_by_peer(silent, 10)
        assert time.monotonic() - started < 5, "not held for asyncio's default 60 s handshake timeout"
