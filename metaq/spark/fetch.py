"""Blocking access to one replica, for code that runs inside Spark (driver or executor).

PySpark calls ``partitions()`` / ``read()`` synchronously, and ``read()`` is a generator
that Spark pulls rows from. ``ReplicaSession`` therefore owns a private asyncio event loop
and drives the ordinary ``BrokerConnection`` with ``run_until_complete`` one step at a
time: between two steps the loop is idle and the kernel buffers whatever the broker sends,
so a fetch issued before Spark consumes the previous batch overlaps with that work.

Also here: the header walk that finds message boundaries for splitting a partition
(decoding a fetched range is record.decode_columns).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..addresses import broker_url
from ..client.connection import AuthenticationFailed, BrokerConnection, ConnectionClosed, Credentials, Reply
from ..client.routing import Replica
from ..protocol import commands as c
from ..protocol.messages import GetRequest, OffsetForTimeRequest, OffsetRequest, StatsRequest
from ..protocol.replies import OffsetForTimeReply, OffsetReply, ReplyError, StatsReply
from ..record import HEADER, HEADER_SIZE, KNOWN_FLAGS, RecordError

_unpack_from = HEADER.unpack_from


class ReplicaError(Exception):
    """This replica cannot serve the request now (down, refusing, corrupt): try another."""


class AccessRefused(Exception):
    """The broker refused our login or its ACL refused the request.

    Not a ReplicaError: every replica of a group checks the same users and ACLs, so trying
    another (or waiting ``timeoutMs``) cannot help; the query fails at once, naming the
    options to fix.
    """


def _login_hint(credentials: Credentials, refusal: str) -> str:
    if credentials.user is None:
        if refusal.startswith("not authenticated"):
            return "the cluster has security on: log in with options user and passwordFile (and tlsCa if its brokers use TLS)"
        return "no login given (options user and passwordFile)"
    return f"check options user ({credentials.user!r}) and passwordFile"


def describe(replica: Replica) -> str:
    return f"{replica.role} of broker {replica.broker_id} at {broker_url(replica.host, replica.port)}"


@dataclass(frozen=True)
class OffsetInfo:
    min_offset: int
    committed: int


class ReplicaSession:
    """A connection to one replica with its own event loop; every call blocks."""

    def __init__(self, replica: Replica, timeout: float = 10.0, credentials: Credentials = Credentials()) -> None:
        self.replica = replica
        self.timeout = timeout
        self.credentials = credentials
        self._loop = asyncio.new_event_loop()
        self._conn: BrokerConnection | None = None
        self._inflight: set[asyncio.Future[Reply]] = set()
        try:
            self._conn = self._loop.run_until_complete(credentials.open(replica.host, replica.port, timeout))
        except AuthenticationFailed as exc:
            self.close()
            raise AccessRefused(f"{describe(replica)} refused the login: {exc}; {_login_hint(credentials, str(exc))}") from None
        except (ConnectionClosed, asyncio.TimeoutError, OSError) as exc:
            self.close()
            raise ReplicaError(f"{describe(replica)}: {exc or type(exc).__name__}") from None

    def close(self) -> None:
        # A get still in flight (a reader that failed over, or stopped early) must not
        # leave an unretrieved exception behind for asyncio to complain about.
        for future in self._inflight:
            if future.done():
                if not future.cancelled():
                    future.exception()
            else:
                future.cancel()
        self._inflight.clear()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if not self._loop.is_closed():
            # Let the transport's close callbacks run, then drop the loop.
            try:
                self._loop.run_until_complete(asyncio.sleep(0))
            except Exception:
                pass
            self._loop.close()

    def __enter__(self) -> "ReplicaSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- requests ---------------------------------------------------------------------

    def send(self, header: dict[str, Any]) -> "asyncio.Future[Reply]":
        """Write a request now; the reply is collected later with ``wait``."""

        async def _send() -> "asyncio.Future[Reply]":
            assert self._conn is not None
            return self._conn.send(header)

        try:
            future = self._loop.run_until_complete(_send())
        except ConnectionClosed as exc:
            raise ReplicaError(f"{describe(self.replica)}: {exc}") from None
        self._inflight.add(future)
        return future

    def wait(self, future: "asyncio.Future[Reply]", timeout: float | None = None) -> Reply:
        self._inflight.discard(future)
        try:
            reply = self._loop.run_until_complete(asyncio.wait_for(future, timeout or self.timeout))
        except (ConnectionClosed, asyncio.TimeoutError, OSError) as exc:
            raise ReplicaError(f"{describe(self.replica)}: {exc or type(exc).__name__}") from None
        if reply.code == c.FORBIDDEN:
            raise AccessRefused(
                f"{describe(self.replica)} refused the request: {reply.code} {reply.message}; "
                f"{_login_hint(self.credentials, reply.message)}"
            )
        return reply

    def request(self, header: dict[str, Any], timeout: float | None = None) -> Reply:
        return self.wait(self.send(header), timeout)

    def offsets(self, topic: str, partition: int) -> OffsetInfo:
        """The replica's first offset and committed offset (what consumers may read)."""
        reply = self._offset(topic, partition, 0)
        return OffsetInfo(reply.min_offset, reply.max_offset)

    def offset_for_time(self, topic: str, partition: int, time_ms: int) -> OffsetForTimeReply:
        """The replica's first offset whose message time is >= ``time_ms`` (``latest``: none is)."""
        header = OffsetForTimeRequest(topic=topic, partition=partition, time_ms=time_ms).to_header()
        try:
            return OffsetForTimeReply.of(self.request(header))
        except ReplyError as exc:
            raise ReplicaError(f"{describe(self.replica)}: offset_for_time {topic}-{partition}: {exc}") from None

    def segment_start(self, topic: str, partition: int, offset: int) -> int:
        """Start of the segment holding ``offset`` (a message boundary, <= offset)."""
        return self._offset(topic, partition, offset).offset

    def _offset(self, topic: str, partition: int, offset: int) -> OffsetReply:
        try:
            return OffsetReply.of(self.request(OffsetRequest(topic=topic, partition=partition, offset=offset).to_header()))
        except ReplyError as exc:
            raise ReplicaError(f"{describe(self.replica)}: offset {topic}-{partition}: {exc}") from None

    def send_get(self, topic: str, partition: int, offset: int, max_size: int, max_wait_ms: int = 0) -> "asyncio.Future[Reply]":
        return self.send(
            GetRequest(topic=topic, partition=partition, offset=offset, max_size=max_size, max_wait_ms=max_wait_ms).to_header()
        )

    def stats(self, item: str = "") -> StatsReply:
        try:
            return StatsReply.of(self.request(StatsRequest(item=item, format="map").to_header()))
        except ReplyError as exc:
            raise ReplicaError(f"{describe(self.replica)}: stats: {exc}") from None


# --- finding message boundaries ------------------------------------------------------------


def first_boundary_at_or_after(
    session: ReplicaSession, topic: str, partition: int, boundary: int, target: int, limit: int, chunk: int = 1 << 20,
    max_records: int | None = None,
) -> int:
    """The first message boundary >= ``target``, walking record headers from ``boundary``
    (or, with ``max_records``, the boundary after that many records if it comes first).

    ``boundary`` must be a known message boundary <= ``target`` (a range start, an earlier
    split point, or a segment start). Returns ``limit`` if no boundary lies in
    [target, limit). Only headers are interpreted; when a record ends beyond the fetched
    bytes the next fetch starts at its end, so large messages are skipped, not read.
    """
    pos = boundary
    records = 0
    while pos < target and (max_records is None or records < max_records):
        if pos >= limit:
            return limit
        reply = session.request(GetRequest(topic=topic, partition=partition, offset=pos, max_size=min(chunk, limit - pos)).to_header())
        if reply.code != c.OK:
            raise ReplicaError(f"{describe(session.replica)}: get {topic}-{partition}@{pos}: {reply.code} {reply.message}")
        body = reply.body
        base, end = pos, pos + len(body)
        if len(body) < HEADER_SIZE:
            raise ReplicaError(f"{describe(session.replica)}: truncated record header at {pos} of {topic}-{partition}")
        while pos < target and pos + HEADER_SIZE <= end and (max_records is None or records < max_records):
            length, _crc, _id, flag = _unpack_from(body, pos - base)
            if length < 0 or flag & ~KNOWN_FLAGS:
                raise RecordError(f"record at offset {pos} of {topic}-{partition}: bad header (not a message boundary?)")
            pos += HEADER_SIZE + length
            records += 1
    return min(pos, limit)
