"""Blocking puts on the caller's own thread: the blocking producer's fast path.

Handing a send to the client's event-loop thread and waiting for the answer costs two
thread wake-ups per message, more than the put's round trip itself. A thread that calls
``MessageProducer.send_message`` therefore writes the put on a socket of its own
(one per thread and broker, like redis-py's connection per client) and reads the reply
itself. Only the first attempt goes this way: anything but a 200 hands the message to
the asyncio producer's retry path in the loop thread, so failures are classified and
retried in one place.
"""

from __future__ import annotations

import itertools
import socket
import threading
from typing import Any

import msgpack

from ..protocol.frames import MAGIC, PREFIX, PREFIX_SIZE, VERSION

_unpack_prefix = PREFIX.unpack_from
_pack_prefix = PREFIX.pack
_packb = msgpack.packb
_unpackb = msgpack.unpackb


class NotSent(ConnectionError):
    """The request did not reach the broker whole: nothing was stored."""


class NoReply(ConnectionError):
    """The request went out but no reply came back: the outcome is unknown."""


class DirectConnection:
    """One blocking, non-pipelined connection: a request, then its reply."""

    def __init__(self, host: str, port: int, connect_timeout: float, request_timeout: float) -> None:
        self.address = f"{host}:{port}"
        try:
            self._sock = socket.create_connection((host, port), connect_timeout)
        except OSError as exc:
            raise NotSent(f"cannot connect to {self.address}: {exc}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(request_timeout)
        self._opaques = itertools.count(1)
        self.broken = False
        self._abandoned: str | None = None  # why another thread ended a request in flight

    def request(self, header: dict[str, Any], body: bytes) -> dict[str, Any]:
        """Send one request, return its reply header (raises NotSent or NoReply; then unusable)."""
        opaque = next(self._opaques)
        packed = _packb({**header, "opaque": opaque}, use_bin_type=True)
        try:
            self._sock.sendall(_pack_prefix(MAGIC, VERSION, len(packed), len(body)) + packed + body)
        except OSError as exc:
            # A partial frame is dropped by the broker when the connection closes.
            self.close()
            raise NotSent(f"send to {self.address} failed: {exc}") from None
        try:
            reply = self._read_reply()
        except (OSError, ValueError) as exc:
            self.close()
            raise NoReply(self._abandoned or f"no reply from {self.address}: {exc or type(exc).__name__}") from None
        if reply.get("opaque") != opaque:
            self.close()
            raise NoReply(f"reply from {self.address} does not match the request")
        return reply

    def _read_reply(self) -> dict[str, Any]:
        buf = self._recv_at_least(b"", PREFIX_SIZE)
        magic, version, header_len, body_len = _unpack_prefix(buf)
        if magic != MAGIC or version != VERSION:
            raise ValueError("not a metaq frame")
        total = PREFIX_SIZE + header_len + body_len
        buf = self._recv_at_least(buf, total)
        header = _unpackb(buf[PREFIX_SIZE : PREFIX_SIZE + header_len], raw=False)
        if not isinstance(header, dict):
            raise ValueError("reply header is not a map")
        return header

    def _recv_at_least(self, buf: bytes, size: int) -> bytes:
        while len(buf) < size:
            chunk = self._sock.recv(max(65536, size - len(buf)))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            buf += chunk
        return buf

    def close(self) -> None:
        self.broken = True
        try:
            self._sock.close()
        except OSError:
            pass

    def abandon(self, reason: str) -> None:
        """From another thread: end the request in flight now (its recv returns) as outcome unknown."""
        self._abandoned = reason
        self.broken = True
        try:
            # shutdown, not close: it wakes a recv blocked in the owning thread (close does not).
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class DirectConnections:
    """Each thread's own connections, by address; all closed by ``close_all``."""

    def __init__(self, connect_timeout: float, request_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._local = threading.local()
        self._all: list[DirectConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def get(self, host: str, port: int) -> DirectConnection:
        mine: dict[tuple[str, int], DirectConnection] | None = getattr(self._local, "connections", None)
        if mine is None:
            mine = self._local.connections = {}
        conn = mine.get((host, port))
        if conn is None or conn.broken:
            conn = DirectConnection(host, port, self.connect_timeout, self.request_timeout)
            with self._lock:
                if self._closed:
                    conn.close()
                    raise NotSent("producer is closed")
                self._all = [c for c in self._all if not c.broken] + [conn]
            mine[(host, port)] = conn
        return conn

    def abandon(self, host: str, port: int, reason: str) -> None:
        """Every thread's connection to ``host:port``: see ``DirectConnection.abandon``."""
        address = f"{host}:{port}"
        with self._lock:
            doomed = [conn for conn in self._all if conn.address == address and not conn.broken]
        for conn in doomed:
            conn.abandon(f"{address} abandoned: {reason}")

    def close_all(self) -> None:
        with self._lock:
            self._closed = True
            connections, self._all = self._all, []
        for conn in connections:
            conn.close()
