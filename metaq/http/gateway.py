"""What the HTTP API does, on top of the real client (no HTTP types in here).

The gateway is a client of the cluster like any other: produce goes through the
client's producer (partition choice, re-routing to a new master, bounded retries, one
SendResult per message), fetch picks a replica with the consumers' ``choose_replica``
and sends an ordinary ``get``. So the rules live in one place: a fetch sees a partition
only up to its committed offset because the broker serves an ordinary ``get`` no
further, on a master and on a slave alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import NoNodeError

from ..client import AsyncMessageSessionFactory, Message, MetaClientConfig, SendResult
from ..client.codec import decode_messages
from ..client.connection import ConnectionClosed, Reply
from ..client.message import Partition
from ..client.routing import Replica, choose_replica
from ..protocol import commands as c
from ..protocol.messages import GetRequest, OffsetForTimeRequest, OffsetRequest, Request
from ..protocol.replies import aborted_spans
from ..record import HEADER_SIZE, RecordError
from ..txn.reader import drop_aborted
from .errors import HttpError

#: The brokers' default maxMessageSize; the gateway refuses larger messages before sending.
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024
#: Longest long-poll a fetch may ask for.
MAX_WAIT_MS = 30_000


@dataclass
class FetchResult:
    replica: Replica
    offset: int
    next_offset: int
    committed: int
    messages: list[Message] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)


class Gateway:
    def __init__(self, config: MetaClientConfig, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        self.factory = AsyncMessageSessionFactory(config)
        self.max_message_size = max_message_size
        self.producer = self.factory.create_producer()

    @property
    def cluster(self):
        return self.factory.cluster

    async def start(self) -> "Gateway":
        await self.factory.start()
        return self

    async def close(self) -> None:
        await self.factory.shutdown()

    # --- topics ------------------------------------------------------------------------------

    async def _children(self, path: str) -> list[str]:
        try:
            return sorted(await self.cluster.call(self.cluster.zk.get_children, path))
        except NoNodeError:
            return []

    async def require_topic(self, topic: str) -> None:
        """404 unless some broker (master or slave) serves ``topic``; then track it.

        Checked in ZooKeeper before watching, so a request for a made-up topic name
        does not leave a watch behind.
        """
        if self.cluster.snapshot.sub.get(topic):
            return
        if not topic or "/" in topic:
            raise HttpError(400, f"not a topic name: {topic!r}")
        if not await self._children(self.cluster.paths.topics_sub(topic)):
            raise HttpError(404, f"unknown topic {topic!r}: no broker serves it")
        await self.cluster.watch_topic(topic, publish=True, subscribe=True)

    async def topic_names(self) -> list[str]:
        names = []
        for topic in await self._children(self.cluster.paths.topics_sub()):
            if await self._children(self.cluster.paths.topics_sub(topic)):
                names.append(topic)
        return names

    async def describe(self, topic: str) -> list[dict[str, Any]]:
        """Each readable partition of ``topic`` with its replicas and whether it takes writes now."""
        await self.require_topic(topic)
        snapshot = self.cluster.snapshot
        writable = set(snapshot.writable_partitions(topic))
        rows = []
        for partition in snapshot.readable_partitions(topic):
            broker = snapshot.brokers.get(partition.broker_id)
            rows.append({
                "partition": str(partition),
                # As registered in ZooKeeper (meta://host:port).
                "master": broker.master if broker else None,
                "slaves": [url for _, url in broker.slaves] if broker else [],
                "writable": partition in writable,
            })
        return rows

    # --- produce -----------------------------------------------------------------------------

    async def produce(self, topic: str, messages: list[Message]) -> list[SendResult]:
        await self.require_topic(topic)
        return await self.producer.send_batch(messages)

    # --- fetch -------------------------------------------------------------------------------

    async def offsets(self, topic: str, partition: Partition, read_from: str) -> tuple[Replica, Reply]:
        request = OffsetRequest(topic=topic, partition=partition.partition, offset=0)
        replica, reply = await self._request(topic, partition, read_from, request)
        if not reply.ok:
            raise _broker_error(reply, replica)
        return replica, reply

    async def offset_for_time(self, topic: str, partition: Partition, time_ms: int, read_from: str) -> tuple[Replica, Reply]:
        """The broker's ``offset_for_time`` answer: the first offset whose message time is >= ``time_ms``."""
        request = OffsetForTimeRequest(topic=topic, partition=partition.partition, time_ms=time_ms)
        replica, reply = await self._request(topic, partition, read_from, request)
        if not reply.ok:
            raise _broker_error(reply, replica)
        return replica, reply

    async def fetch(
        self, topic: str, partition: Partition, offset: int, max_bytes: int, wait_ms: int, read_from: str
    ) -> FetchResult:
        request = GetRequest(
            topic=topic, partition=partition.partition, offset=offset, max_size=max_bytes, max_wait_ms=wait_ms, group="http"
        )
        replica, reply = await self._request(topic, partition, read_from, request, wait_ms / 1000)
        if reply.ok and not _whole_record(reply.body):
            # The record at ``offset`` is larger than max_bytes: fetch exactly it (as Kafka
            # returns a first record larger than the limit rather than nothing).
            needed = _record_size(reply.body)
            if needed is None or needed > self.max_message_size + HEADER_SIZE:
                raise HttpError(400, f"offset {offset} is not the start of a message in {topic} {partition}")
            replica, reply = await self._request(
                topic, partition, read_from, dataclasses.replace(request, max_size=needed, max_wait_ms=0)
            )
        if reply.code == c.OK:
            return self._decoded(topic, partition, offset, replica, reply)
        if reply.code == c.MOVED:
            raise HttpError(301, reply.message, offset=int(reply["offset"]))
        if reply.code == c.NOT_FOUND and "committed" in reply.header:
            if offset > int(reply["log_end"]):
                raise HttpError(404, f"offset {offset} is beyond the log end {reply['log_end']} of {_name(replica)}")
            # Nothing committed past ``offset`` yet (the broker held the request wait_ms).
            return FetchResult(replica, offset, offset, int(reply["committed"]))
        raise _broker_error(reply, replica)

    def _decoded(self, topic: str, partition: Partition, offset: int, replica: Replica, reply: Reply) -> FetchResult:
        try:
            messages, end = decode_messages(reply.body, offset, topic, partition)
        except RecordError as exc:
            if str(exc).startswith(f"record at offset {offset}:"):
                raise HttpError(400, f"offset {offset} is not the start of a message in {topic} {partition}") from None
            raise HttpError(502, f"{_name(replica)} returned damaged data: {exc}") from None
        messages = drop_aborted(messages, aborted_spans(reply.header))  # records of rolled-back transactions
        if not messages and end > offset:  # only control records (batch headers): move past them
            return FetchResult(replica, offset, end, int(reply["committed"]))
        if not messages:
            raise HttpError(502, f"{_name(replica)} returned no whole message at offset {offset} (is maxTransferSize below the message size?)")
        # A message ends where the next one starts; the last one ends at ``end``.
        ends = [message.offset for message in messages[1:]] + [end]
        return FetchResult(replica, offset, end, int(reply["committed"]), messages, ends)

    async def _request(
        self, topic: str, partition: Partition, read_from: str, request: Request, extra_timeout: float = 0.0
    ) -> tuple[Replica, Reply]:
        """Send ``request`` (for ``topic`` and ``partition``) to a replica of ``partition`` chosen by ``read_from``; one retry elsewhere."""
        await self.require_topic(topic)
        snapshot = self.cluster.snapshot
        if partition not in snapshot.readable_partitions(topic):
            raise HttpError(404, f"topic {topic!r} has no partition {partition}")
        broker = snapshot.brokers.get(partition.broker_id)
        timeout = self.factory.config.request_timeout_s + extra_timeout
        failed: Replica | None = None
        error: BaseException | None = None
        for _ in range(2):
            replica = choose_replica(broker, read_from, avoid=failed)
            if replica is None:
                raise HttpError(503, f"no {read_from} replica of broker {partition.broker_id} is registered")
            try:
                conn = await self.factory.pool.get(replica.host, replica.port)
                reply = await conn.request(request.to_header(), timeout=timeout)
                return replica, reply
            except (ConnectionClosed, OSError, asyncio.TimeoutError) as exc:
                failed, error = replica, exc
                self.cluster.request_refresh()
        raise HttpError(503, f"{_name(failed)} did not answer: {error or type(error).__name__}")


def _name(replica: Replica | None) -> str:
    return f"broker {replica.broker_id} {replica.role} at {replica.address}" if replica else "the broker"


def _record_size(body: bytes | bytearray) -> int | None:
    if len(body) < 4:
        return None
    length = int.from_bytes(body[:4], "big", signed=True)
    return HEADER_SIZE + length if length >= 0 else None


def _whole_record(body: bytes | bytearray) -> bool:
    size = _record_size(body)
    return size is not None and size <= len(body)


def _broker_error(reply: Reply, replica: Replica) -> HttpError:
    """A broker's error reply as the same class of HTTP error; 5xx from a broker is a bad gateway."""
    status = reply.code if reply.code in (c.BAD_REQUEST, c.FORBIDDEN, c.NOT_FOUND, c.SERVICE_UNAVAILABLE) else 502
    return HttpError(status, f"{_name(replica)}: {reply.message}")
