"""The producer: partition selection, batched puts, bounded retries, one SendResult per message.

Failure classes (see ``classify_reply``):

    what happened                                     stored?   retried?
    ------------------------------------------------  --------  ------------------------------
    200                                               yes       -
    403, 503 (slave, fenced, sync slaves missing)      no        yes, maybe on another partition
    no connection / connect refused / no master yet   no        yes
    400, 404, 500                                     no        no: the request itself is wrong
    504, timeout, connection lost after sending       unknown   while retry_unknown_outcome (default)

Retries are bounded by attempts and total time (tenacity, exponential back-off), and a
send that runs out of either ends in a SendResult saying why, so nothing is dropped in
silence.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Callable, Iterable

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from ..addresses import parse_broker_url
from ..protocol import commands as c
from ..protocol.messages import PutRequest
from .cluster import Cluster
from .codec import encode_messages
from .config import MetaClientConfig
from .connection import ConnectionClosed
from .message import Message, Partition, SendResult
from .pool import ConnectionPool
from .selector import NoPartitionAvailable, PartitionSelector, RoundRobinPartitionSelector

log = logging.getLogger(__name__)

#: The broker takes at most this many messages in one put.
MAX_BATCH_COUNT = 4096
#: How long a broker that refused a connection is skipped when choosing partitions,
#: unless a background probe reaches it again sooner.
SUSPECT_SECONDS = 2.0
#: How often a skipped broker is probed: a broker that restarts is used again within this.
PROBE_INTERVAL_S = 0.2


class SendFailure(Exception):
    """One failed put attempt, classified."""

    def __init__(
        self, message: str, *, code: int | None = None, retriable: bool = False, outcome_unknown: bool = False
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retriable = retriable
        self.outcome_unknown = outcome_unknown


def classify_reply(code: int, message: str, retry_unknown_outcome: bool = False) -> SendFailure | None:
    """None for success, else the SendFailure that a put answered with ``code`` means."""
    if code == c.OK:
        return None
    if code in c.RETRIABLE_CODES:
        return SendFailure(message, code=code, retriable=True)
    if code in c.UNKNOWN_OUTCOME_CODES:
        return SendFailure(message, code=code, outcome_unknown=True, retriable=retry_unknown_outcome)
    return SendFailure(message, code=code)


def unknown_outcome(message: str, retry_unknown_outcome: bool = False) -> SendFailure:
    return SendFailure(message, outcome_unknown=True, retriable=retry_unknown_outcome)


class AsyncMessageProducer:
    """Sends messages to the masters of a topic's partitions. Create with ``factory.create_producer()``."""

    def __init__(
        self,
        cluster: Cluster,
        pool: ConnectionPool,
        config: MetaClientConfig,
        selector: PartitionSelector | None = None,
    ) -> None:
        self.cluster = cluster
        self.pool = pool
        self.config = config
        self.selector: PartitionSelector = selector or RoundRobinPartitionSelector()
        self._suspects: dict[int, float] = {}  # broker id -> monotonic time until skipped
        self._probes: dict[int, asyncio.Task[None]] = {}  # broker id -> reconnect probe
        self._in_flight: set[asyncio.Task[object]] = set()
        self._closed = False

    async def publish(self, topic: str) -> None:
        """Start tracking the topic's masters (MetaQ's ``publish``); sending also does this lazily."""
        await self.cluster.watch_topic(topic, publish=True)

    # --- sending --------------------------------------------------------------------------

    async def send_message(self, message: Message, timeout: float | None = None) -> SendResult:
        """Send one message; always returns a SendResult (never raises for a failed send)."""
        (result,) = await self.send_batch([message], timeout)
        return result

    def send_message_async(
        self, message: Message, callback: Callable[[SendResult], object] | None = None
    ) -> "asyncio.Task[SendResult]":
        """Start sending; the task's result (and ``callback``'s argument) is the SendResult."""
        task = asyncio.create_task(self.send_message(message))
        self._track(task)
        if callback is not None:
            task.add_done_callback(lambda t: None if t.cancelled() else callback(t.result()))
        return task

    async def send_batch(self, messages: Iterable[Message], timeout: float | None = None) -> list[SendResult]:
        """Send many messages with as few puts as possible: one SendResult each, in order.

        Messages are grouped by the partition the selector picks (so with round robin a
        batch is spread over the partitions) and each group goes out in puts of at most
        4096 messages, concurrently.
        """
        messages = list(messages)
        if self._closed:
            return [self._failed(m, "producer is closed") for m in messages]
        results: list[SendResult | None] = [None] * len(messages)
        groups: dict[tuple[str, Partition | None], list[int]] = defaultdict(list)
        by_topic: dict[str, list[int]] = defaultdict(list)
        for i, message in enumerate(messages):
            by_topic[message.topic].append(i)
        for topic, indexes in by_topic.items():
            if topic not in self.cluster.snapshot.pub:
                await self.publish(topic)
            partitions = self._candidates(topic)
            # One pick per message, or (per_message = False) one per put-sized chunk.
            step = 1 if getattr(self.selector, "per_message", True) else MAX_BATCH_COUNT
            for start in range(0, len(indexes), step):
                chunk = indexes[start : start + step]
                try:
                    partition = self.selector.select(topic, partitions, messages[chunk[0]]) if partitions else None
                except NoPartitionAvailable:
                    partition = None  # retried below until a master shows up or time runs out
                except Exception as exc:  # a user selector's bug fails its messages, not the batch
                    for j in chunk:
                        results[j] = self._failed(messages[j], f"partition selector failed: {exc}")
                    continue
                groups[(topic, partition)].extend(chunk)
        jobs = []
        for (topic, partition), indexes in groups.items():
            for start in range(0, len(indexes), MAX_BATCH_COUNT):
                chunk = indexes[start : start + MAX_BATCH_COUNT]
                jobs.append((chunk, self._send_chunk(topic, partition, [messages[i] for i in chunk], timeout)))
        outcomes = await asyncio.gather(*(job for _, job in jobs))
        for (chunk, _), chunk_results in zip(jobs, outcomes):
            for i, result in zip(chunk, chunk_results):
                results[i] = result
        return results  # type: ignore[return-value]

    async def close(self) -> None:
        """Wait for sends in flight (each still ends in its SendResult), then refuse new ones."""
        self._closed = True
        if self._in_flight:
            await asyncio.gather(*list(self._in_flight), return_exceptions=True)
        for probe in list(self._probes.values()):
            probe.cancel()

    # --- internals ------------------------------------------------------------------------

    def _track(self, task: "asyncio.Task[SendResult]") -> None:
        self._in_flight.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._in_flight.discard)  # type: ignore[arg-type]

    def _candidates(self, topic: str) -> list[Partition]:
        """Writable partitions, minus those of brokers that just refused us (if others remain)."""
        partitions = self.cluster.snapshot.writable_partitions(topic)
        now = time.monotonic()
        suspects = {p.broker_id for p in partitions if self._suspects.get(p.broker_id, 0) > now}
        for broker_id in suspects:
            self._start_probe(broker_id)
        healthy = [p for p in partitions if p.broker_id not in suspects]
        return healthy or partitions

    def _start_probe(self, broker_id: int) -> None:
        """Reconnect to a skipped broker in the background; success ends its suspicion.

        Without this a broker that restarted quickly would still be skipped for the rest of
        SUSPECT_SECONDS, and a producer sending steadily would keep all its load elsewhere.
        """
        if broker_id in self._probes or self._closed:
            return
        broker = self.cluster.snapshot.brokers.get(broker_id)
        if broker is None or not broker.master:
            return
        host, port = parse_broker_url(broker.master)

        async def probe() -> None:
            try:
                await asyncio.sleep(PROBE_INTERVAL_S)  # at most one connect attempt per interval
                await self.pool.get(host, port)
            except (ConnectionClosed, OSError, asyncio.TimeoutError):
                return
            finally:
                self._probes.pop(broker_id, None)
            self._suspects.pop(broker_id, None)

        self._probes[broker_id] = asyncio.create_task(probe())

    def _failed(self, message: Message, error: str, **fields: object) -> SendResult:
        return SendResult(False, error_message=error, topic=message.topic, **fields)  # type: ignore[arg-type]

    async def _send_chunk(
        self, topic: str, partition: Partition | None, messages: list[Message], timeout: float | None
    ) -> list[SendResult]:
        body, starts = encode_messages(messages)
        config = self.config
        total = timeout if timeout is not None else config.send_timeout_s
        retrying = AsyncRetrying(
            stop=stop_after_attempt(config.send_max_attempts) | stop_after_delay(total),
            wait=wait_exponential(multiplier=config.send_retry_min_wait_s, max=config.send_retry_max_wait_s),
            retry=retry_if_exception(lambda exc: isinstance(exc, SendFailure) and exc.retriable),
            reraise=True,
        )
        attempts = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    if attempts > 1 or partition is None or partition not in self._candidates(topic):
                        partition = self._reselect(topic, messages[0])
                    header = await self._put(topic, partition, body, len(messages))
        except SendFailure as failure:
            if attempts > 1:
                log.debug("send to %s gave up after %d attempts: %s", topic, attempts, failure.message)
            return [
                SendResult(
                    False,
                    partition=partition,
                    error_message=failure.message + (f" (after {attempts} attempts)" if attempts > 1 else ""),
                    topic=topic,
                    code=failure.code,
                    outcome_unknown=failure.outcome_unknown,
                    attempts=attempts,
                )
                for _ in messages
            ]
        stored_in = Partition(partition.broker_id, int(header["partition"]))  # type: ignore[union-attr]
        first_offset, first_id = int(header["offset"]), int(header["msg_id"])
        return [
            SendResult(True, stored_in, first_offset + start, first_id + i, None, topic, c.OK, False, attempts)
            for i, start in enumerate(starts)
        ]

    def _reselect(self, topic: str, message: Message) -> Partition:
        partitions = self._candidates(topic)
        try:
            return self.selector.select(topic, partitions, message)
        except NoPartitionAvailable as exc:
            # Retriable: a master may register (or come back) while we back off.
            self.cluster.request_refresh()
            raise SendFailure(str(exc), retriable=True) from None
        except Exception as exc:
            raise SendFailure(f"partition selector failed: {exc}") from None

    async def _put(self, topic: str, partition: Partition, body: bytes, count: int) -> dict:
        broker = self.cluster.snapshot.brokers.get(partition.broker_id)
        if broker is None or not broker.master:
            raise SendFailure(f"broker {partition.broker_id} has no master for partition {partition}", retriable=True)
        host, port = parse_broker_url(broker.master)
        retry_unknown = self.config.retry_unknown_outcome
        try:
            conn = await self.pool.get(host, port)
            future = conn.send(PutRequest(topic=topic, partition=partition.partition, count=count).to_header(), body)
        except ConnectionClosed as exc:
            # Nothing was written: safe to retry, and skip this broker for a moment.
            self._suspects[partition.broker_id] = time.monotonic() + SUSPECT_SECONDS
            raise SendFailure(f"broker {partition.broker_id} ({host}:{port}) unreachable: {exc}", retriable=True) from None
        try:
            reply = await asyncio.wait_for(future, self.config.request_timeout_s)
        except ConnectionClosed as exc:
            self._suspects[partition.broker_id] = time.monotonic() + SUSPECT_SECONDS
            raise unknown_outcome(f"outcome unknown: {exc} after sending to partition {partition}", retry_unknown) from None
        except asyncio.TimeoutError:
            raise unknown_outcome(
                f"outcome unknown: no reply from {host}:{port} within {self.config.request_timeout_s}s", retry_unknown
            ) from None
        failure = classify_reply(reply.code, f"{reply.code} {reply.message} (partition {partition})", retry_unknown)
        if failure is not None:
            raise failure
        return reply.header
