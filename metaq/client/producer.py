"""The producer: partition selection, batched puts, bounded retries, one SendResult per message.

Failure classes (see ``classify_reply``):

    what happened                                     stored?   retried?
    ------------------------------------------------  --------  ------------------------------
    200                                               yes       -
    403, 503 (slave, fenced, sync slaves missing)      no        yes, maybe on another partition
    no connection / connect refused / no master yet   no        yes
    400, 404, 500                                     no        no: the request itself is wrong
    fatal (errors.py): 403 from an ACL, login         no        no: fails at once with the reason
      refused, TLS on one side only, an untrusted
      certificate, acceptPublish=false everywhere
    504, timeout, connection lost after sending       unknown   while retry_unknown_outcome (default)
    (or the broker left ZooKeeper meanwhile)

Retries are bounded by attempts and total time (``retry.RetryPolicy``: exponential back-off), and a
send that runs out of either ends in a SendResult saying why, so nothing is dropped in
silence. The retry machinery is entered only after a failed first attempt: a put that
succeeds costs one request and no retry bookkeeping.

Per-message sends (``send_message_async``, ``send``, ``send_message``) go through the
accumulator (``accumulator.py``), which gathers them into puts per partition;
``send_batch`` sends the caller's batch as it is, in puts of its own.

Idempotent (``idempotence=True``, opt-in): each put is numbered (``idempotence.py``)
and every retry, an unknown outcome's included, resends it with the same numbers to the
same partition (its new master after a failover), which stores it at most once and
answers a resend of a stored batch with the original offsets: the table's "unknown"
row becomes "stored exactly once" as long as a retry gets through. Up to
``max_in_flight_per_partition`` numbered puts of a partition are in flight; the
partition's lane says when each may be written or resent (``send_numbered``, ``_claim``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from functools import partial
from itertools import repeat
from operator import add
from typing import Any, Hashable, Iterable, Iterator, Sequence

from ..addresses import parse_broker_url
from ..protocol import commands as c
from ..protocol.messages import InitProducerRequest, PutRequest
from .accumulator import (
    MAX_BATCH_COUNT,
    RECORD_OVERHEAD,
    Accumulator,
    AccumulatorConfig,
    Callback,
    Entry,
    PartitionQueue,
    record_size,
    resolve,
)
from .cluster import Cluster, ClusterSnapshot
from .codec import encode_messages
from .config import MetaClientConfig
from .connection import BrokerConnection, CannotConnect, ConnectionClosed, reply_within
from .errors import access_denied
from .idempotence import NoProducerId, Numbered, Sequencer
from .message import Message, Partition, SendResult
from .pool import ConnectionPool
from .retry import RetryPolicy
from .selector import NoPartitionAvailable, PartitionSelector, RoundRobinPartitionSelector
from .times import offsets_for_times

log = logging.getLogger(__name__)

#: How long a broker that refused a connection is skipped when choosing partitions,
#: unless a background probe reaches it again sooner.
SUSPECT_SECONDS = 2.0
#: How often a skipped broker is probed: a broker that restarts is used again within this.
PROBE_INTERVAL_S = 0.2


class SendFailure(Exception):
    """One failed put attempt, classified."""

    def __init__(
        self, message: str, *, code: int | None = None, retriable: bool = False, outcome_unknown: bool = False,
        renumber: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retriable = retriable
        self.outcome_unknown = outcome_unknown
        #: The broker's numbering differs from ours (out of order): number anew under a new id.
        self.renumber = renumber


def classify_reply(code: int, message: str, retry_unknown_outcome: bool = False, *,
                   reason: object = None) -> SendFailure | None:
    """None for success, else the SendFailure that a put answered with ``code`` (and ``reason``) means."""
    if code == c.OK:
        return None
    if code in c.RETRIABLE_CODES and not access_denied(code, message, reason):
        return SendFailure(message, code=code, retriable=True)
    if code in c.UNKNOWN_OUTCOME_CODES:
        return SendFailure(message, code=code, outcome_unknown=True, retriable=retry_unknown_outcome)
    return SendFailure(message, code=code)


def unknown_outcome(message: str, retry_unknown_outcome: bool = False) -> SendFailure:
    return SendFailure(message, outcome_unknown=True, retriable=retry_unknown_outcome)


class AsyncMessageProducer:
    """Sends messages to the masters of a topic's partitions. Create with ``factory.create_producer()``.

    Also an async context manager: ``async with factory.create_producer() as producer:``
    closes it (sending everything queued) on the way out.
    """

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
        self._per_message = getattr(self.selector, "per_message", True)
        self._suspects: dict[int, float] = {}  # broker id -> monotonic time until skipped
        self._probes: dict[int, asyncio.Task[None]] = {}  # broker id -> reconnect probe
        self._candidates_cache: dict[str, tuple[ClusterSnapshot, float, list[Partition]]] = {}
        self._sticky: dict[str, PartitionQueue] = {}  # topic -> queue of the batch being filled
        self._unpublished: dict[str, list[tuple[Entry, bool]]] = {}  # topic -> sends waiting for its masters
        self._in_flight: set[asyncio.Future[Any]] = set()  # sends outside the queues: publishing a topic, no master yet
        #: topic -> sends waiting for a master, in send order, with the time each gives up (see _park).
        self._parked: dict[str, deque[tuple[Entry, bool, float]]] = {}
        self.accumulator = Accumulator(
            AccumulatorConfig(config.linger_ms, config.batch_size, config.buffer_memory, config.max_in_flight_per_connection,
                              config.max_in_flight_per_partition if config.idempotence else 1),
            self._send_chunk,
        )
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None  # see _running_loop
        #: Numbers idempotent puts (None: idempotence off).
        self.sequencer: Sequencer | None = Sequencer(config.max_in_flight_per_partition) if config.idempotence else None

    async def offsets_for_times(self, topic: str, times: dict[Partition | str, int]) -> dict[Partition, int | None]:
        """Per partition, the first offset whose message time (its msg id's) is >= the given ms
        since 1970, or None when no readable message is that late (metaq/client/times.py)."""
        return await offsets_for_times(self.cluster, self.pool, topic, times, self.config.request_timeout_s)

    async def publish(self, topic: str) -> None:
        """Start tracking the topic's masters (MetaQ's ``publish``); sending also does this lazily."""
        await self.cluster.watch_topic(topic, publish=True)

    async def __aenter__(self) -> "AsyncMessageProducer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- sending --------------------------------------------------------------------------

    def send_message_async(self, message: Message, callback: Callback | None = None) -> "asyncio.Future[SendResult]":
        """Queue one message for a batched put; returns the future of its SendResult at once.

        ``callback(result)`` runs in the event loop when the result is known (never inside
        this call). With the buffer full (``buffer_memory``) the result is at once a
        failure saying so: use ``await send()`` to wait for room instead.
        """
        accumulator = self.accumulator
        loop = self._loop if accumulator.buffered else self._running_loop()  # (_running_loop, without its call)
        future: asyncio.Future[SendResult] = loop.create_future()  # type: ignore[union-attr]
        attribute = message.attribute
        size = len(message.data) + RECORD_OVERHEAD + (len(attribute) * 4 if attribute else 0)  # record_size, inlined
        if self._closed:
            self._refuse(message, future, callback, "producer is closed")
        elif accumulator.buffered + size > self.config.buffer_memory and not accumulator.has_room(size):
            self._refuse(message, future, callback, f"producer buffer full ({self.config.buffer_memory} bytes buffered); "
                                                    "wait for results or raise buffer_memory")
        elif not self._per_message and (queue := self._sticky.get(message.topic)) is not None and queue.entries:
            # The hot path: the batch being filled for this topic (sticky partitioning).
            accumulator.append(queue, (message, future, size, callback))
        else:
            self._enqueue((message, future, size, callback), linger=True)
        return future

    async def send(self, message: Message, callback: Callback | None = None) -> "asyncio.Future[SendResult]":
        """Queue one message, waiting for room in the buffer if it is full; returns its result's future.

        Like aiokafka's ``send``: ``await (await producer.send(message))`` is the result.
        """
        size = record_size(message)
        if not self._closed and not self.accumulator.has_room(size):
            if not await self.accumulator.wait_for_room(size, self.config.send_timeout_s):
                future: asyncio.Future[SendResult] = self._running_loop().create_future()
                self._refuse(message, future, callback, f"producer buffer full for {self.config.send_timeout_s}s")
                return future
        return self.send_message_async(message, callback)

    async def send_message(self, message: Message, timeout: float | None = None) -> SendResult:
        """Send one message and wait for its result (never raises for a failed send).

        It joins the put of its partition that is being filled, without lingering (its
        caller waits for it); with ``timeout`` it is sent on its own with that retry budget.
        """
        if timeout is not None:
            (result,) = await self.send_batch([message], timeout)
            return result
        size = record_size(message)
        if not self._closed and not self.accumulator.has_room(size):
            await self.accumulator.wait_for_room(size, self.config.send_timeout_s)
        if self._closed:
            return self._failed(message, "producer is closed")
        future: asyncio.Future[SendResult] = self._running_loop().create_future()
        self._enqueue((message, future, size, None), linger=False)
        return await future

    async def flush(self) -> None:
        """Send everything queued now, and wait until every message sent so far has its result."""
        waiting = self.accumulator.flush_all()
        waiting.extend(entry[1] for entries in self._unpublished.values() for entry, _ in entries)
        waiting.extend(entry[1] for parked in self._parked.values() for entry, _, _ in parked)
        waiting.extend(self._in_flight)
        if waiting:
            await asyncio.wait(waiting)

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
            step = 1 if self._per_message else MAX_BATCH_COUNT
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
        """Refuse new sends, send everything queued and wait for every result, stop probing."""
        self._closed = True
        await self.flush()
        for probe in list(self._probes.values()):
            probe.cancel()

    # --- the accumulator's side -------------------------------------------------------------

    def _enqueue(self, entry: Entry, linger: bool) -> None:
        """File a message with the partition it goes to (its topic's masters are known, or soon)."""
        message, future, size, callback = entry
        topic = message.topic
        waiting = self._unpublished.get(topic)
        if waiting is not None or topic not in self.cluster.snapshot.pub:
            # Keep order: everything for this topic waits until its masters have been read.
            if waiting is None:
                waiting = self._unpublished[topic] = []
                self._track(asyncio.ensure_future(self._publish_then_enqueue(topic)))
            # Counted against buffer_memory while it waits, like a parked send: a burst sent
            # before the topic's masters are known is bounded too.
            self.accumulator.hold(size)
            waiting.append((entry, linger))
            return
        if topic in self._parked:
            self._park(topic, entry, linger)  # behind the earlier sends of the topic still waiting for a master
            return
        try:
            partition = self._place(topic, message)
        except Exception as exc:  # a user selector's bug fails its message only
            self._refuse(message, future, callback, f"partition selector failed: {exc}")
            return
        if partition is None:
            self._park(topic, entry, linger)
            return
        queue = self.accumulator.queue(topic, partition)
        if not self._per_message:
            # Sticky, like Kafka's partitioner: fill this partition's batch; pick anew for the next.
            self._sticky[topic] = queue
        self.accumulator.append(queue, entry, linger)

    async def _publish_then_enqueue(self, topic: str) -> None:
        try:
            await self.publish(topic)
        finally:
            for entry, linger in self._unpublished.pop(topic, []):
                self.accumulator.release(entry[2])  # _enqueue counts it again where it goes
                self._enqueue(entry, linger)

    def _place(self, topic: str, message: Message) -> Partition | None:
        """The selector's partition for ``message``; None while it has no master."""
        partitions = self._candidates(topic)
        try:
            return self.selector.select(topic, partitions, message) if partitions else None
        except NoPartitionAvailable:
            return None

    def _park(self, topic: str, entry: Entry, linger: bool) -> None:
        """Hold a send whose partition has no master, and every later send of the topic behind it.

        Invariant (per-key order): parked sends reach their partition queues in the order
        they were sent, and no later send of the topic overtakes them. Retrying each one on
        its own would let a later message of a key reach the new master first.
        """
        parked = self._parked.get(topic)
        if parked is None:
            parked = self._parked[topic] = deque()
            self._track(asyncio.ensure_future(self._file_parked(topic, parked)))
        self.accumulator.hold(entry[2])
        parked.append((entry, linger, time.monotonic() + self.config.send_timeout_s))

    async def _file_parked(self, topic: str, parked: deque[tuple[Entry, bool, float]]) -> None:
        """File parked sends in order as masters come back; fail those older than send_timeout_s."""
        config = self.config
        wait = config.send_retry_min_wait_s
        try:
            while parked:
                (message, future, size, callback), linger, deadline = parked[0]
                try:
                    partition = self._place(topic, message)
                except Exception as exc:
                    partition, error = None, f"partition selector failed: {exc}"
                else:
                    error = None
                if partition is None and error is None:
                    error = self.cluster.snapshot.publish_refusal(topic)
                if partition is None and error is None and time.monotonic() < deadline and not self._closed:
                    self.cluster.request_refresh()
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, config.send_retry_max_wait_s)
                    continue
                parked.popleft()
                self.accumulator.release(size)
                wait = config.send_retry_min_wait_s
                if partition is None:
                    resolve(future, callback, self._failed(message, error or f"no available partition for topic {topic!r} "
                                                                             f"(no master) for {config.send_timeout_s}s; not sent"))
                else:
                    self.accumulator.append(self.accumulator.queue(topic, partition), (message, future, size, callback), linger)
        finally:
            # No await between the last popleft and here: no send can slip in behind an empty deque.
            self._parked.pop(topic, None)
            for (message, future, size, callback), _, _ in parked:  # only when cancelled
                self.accumulator.release(size)
                resolve(future, callback, self._failed(message, "send cancelled; not sent"))

    def _refuse(self, message: Message, future: "asyncio.Future[SendResult]", callback: Callback | None, error: str) -> None:
        """A send that ends before it starts: its result now, its callback soon (not inside the caller's call)."""
        result = self._failed(message, error)
        future.set_result(result)
        if callback is not None:
            asyncio.get_running_loop().call_soon(resolve, future, callback, result)

    # --- internals ------------------------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The running event loop, kept while messages are buffered (then it is theirs).

        Asked anew whenever the buffer is empty. Asking asyncio for it costs a ``getpid()``
        system call per call (CPython checks for a fork), a tenth of a per-message send.
        Every message that enters the buffer comes through here first.
        """
        if not self.accumulator.buffered or self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _track(self, task: "asyncio.Future[Any]") -> None:
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    def _candidates(self, topic: str) -> list[Partition]:
        """Writable partitions, minus those of brokers that just refused us (if others remain).

        Cached per topic until the cluster snapshot changes or a broker's skip ends: this
        runs for every message a per-message selector places.
        """
        snapshot = self.cluster.snapshot
        cached = self._candidates_cache.get(topic)
        now = time.monotonic()
        if cached is not None and cached[0] is snapshot and now < cached[1]:
            return cached[2]
        partitions = snapshot.writable_partitions(topic)
        suspects = {p.broker_id for p in partitions if self._suspects.get(p.broker_id, 0) > now}
        for broker_id in suspects:
            self._start_probe(broker_id)
        healthy = [p for p in partitions if p.broker_id not in suspects]
        until = min((self._suspects[b] for b in suspects), default=float("inf"))
        result = healthy or partitions
        self._candidates_cache[topic] = (snapshot, until, result)
        return result

    def _suspect(self, broker_id: int) -> None:
        self._suspects[broker_id] = time.monotonic() + SUSPECT_SECONDS
        self._candidates_cache.clear()

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
            self._candidates_cache.clear()

        self._probes[broker_id] = asyncio.create_task(probe())

    def master_address(self, url: str) -> tuple[str, int]:
        """Where to connect for a master registered as ``url`` (after ``address_map``)."""
        return self.pool.resolve(*parse_broker_url(url))

    def _failed(self, message: Message, error: str, **fields: object) -> SendResult:
        return SendResult(False, error_message=error, topic=message.topic, **fields)  # type: ignore[arg-type]

    async def _send_chunk(
        self, topic: str, partition: Partition | None, messages: list[Message], timeout: float | None = None
    ) -> Sequence[SendResult]:
        """One put of ``messages``; only if it fails, the retries (see the module's table)."""
        body, starts = encode_messages(messages)
        if self.sequencer is not None:
            return await self.send_numbered(topic, partition, messages, body, starts, timeout)
        if partition is None or partition not in self._candidates(topic):
            return await self.retry_chunk(topic, partition, messages, body, starts, timeout)
        try:
            header = await self._put(topic, partition, body, len(messages))
        except SendFailure as failure:
            if not failure.retriable:
                return self._not_stored(topic, partition, messages, failure, 1)
            return await self.retry_chunk(topic, partition, messages, body, starts, timeout, failure)
        return StoredResults(topic, partition, header, starts, 1)  # built as the accumulator reads them

    async def retry_chunk(
        self,
        topic: str,
        partition: Partition | None,
        messages: list[Message],
        body: bytes,
        starts: list[int],
        timeout: float | None = None,
        failed: SendFailure | None = None,
    ) -> list[SendResult]:
        """The failure path: retries with back-off, each on a partition picked anew.

        ``failed`` is the outcome of a first attempt already made (here or by the
        blocking facade's direct put); it counts against ``send_max_attempts``.
        """
        policy = RetryPolicy(self.config, timeout, attempts=0 if failed is None else 1)
        failure = failed
        while True:
            if failure is not None:
                if not failure.retriable or policy.exhausted:
                    if policy.attempts > 1:
                        log.debug("send to %s gave up after %d attempts: %s", topic, policy.attempts, failure.message)
                    return self._not_stored(topic, partition, messages, failure, policy.attempts)
                await policy.back_off()
            try:
                if policy.attempted() > 1 or partition is None or partition not in self._candidates(topic):
                    partition = self._reselect(topic, messages[0])
                header = await self._put(topic, partition, body, len(messages))
            except SendFailure as exc:
                failure = exc
                continue
            return stored_results(topic, partition, header, starts, policy.attempts)

    async def send_numbered(
        self,
        topic: str,
        partition: Partition | None,
        messages: list[Message],
        body: bytes,
        starts: list[int],
        timeout: float | None = None,
        numbered: Numbered | None = None,
        failed: SendFailure | None = None,
    ) -> list[SendResult]:
        """An idempotent put with its retries: numbered when first written, then resent as is to the same partition.

        The partition's lane (``idempotence.py``) decides when a batch may be written:
        several new ones pipelined on one connection, resends one at a time, head first.
        ``numbered`` and ``failed``: a first attempt already made (the blocking facade's direct
        put). The partition may change only before the batch is numbered.
        """
        sequencer = self.sequencer
        assert sequencer is not None
        policy = RetryPolicy(self.config, timeout, attempts=0 if failed is None else 1)
        failure = failed
        retriable = failed is not None and failed.retriable
        #: Out of order while an earlier batch of the partition is unsettled: expected, resent in turn.
        behind = False
        # Ends unsettled: an attempt may have stored it, or the broker's sequence for us is not ours.
        drop_id = failed is not None and (failed.outcome_unknown or failed.renumber)
        # A new batch's place in its partition's line, taken before the first await (send order).
        def enter(p: Partition) -> tuple[Hashable, object]:
            key = lane_key(topic, p)
            return key, sequencer.enter(key)

        ticket = enter(partition) if numbered is None and partition is not None else None
        try:
            while True:
                if failure is not None:
                    if numbered is not None:
                        sequencer.failed(numbered)
                    if not retriable or policy.exhausted:
                        break
                    if not behind:
                        await policy.back_off()
                try:
                    if numbered is None and (partition is None or partition not in self._candidates(topic)):
                        partition = self._reselect(topic, messages[0])
                    assert partition is not None
                    if numbered is None and (ticket is None or ticket[0] != lane_key(topic, partition)):
                        if ticket is not None:
                            sequencer.leave(*ticket)
                        ticket = enter(partition)
                    conn = await self._master_conn(partition)
                    claimed = await self._claim(topic, partition, len(messages), conn, numbered, failure, policy.deadline,
                                                None if ticket is None else ticket[1])
                    if numbered is not None and claimed is not numbered:
                        drop_id = False  # renumbered: never stored under its old numbers
                    numbered, ticket = claimed, None
                    policy.attempted()
                    header = await self._write_put(conn, topic, partition, body, len(messages), numbered)
                except SendFailure as exc:
                    failure, retriable, behind = exc, exc.retriable, False
                    if numbered is not None and exc.renumber:
                        # Behind an earlier batch being retried, or numbered under an id dropped
                        # since: expected, resent (or renumbered) in its turn. Else the broker's
                        # sequence for us differs from ours: start over under a new id.
                        behind = retriable = not sequencer.is_head(numbered) or not sequencer.is_current(numbered)
                    drop_id = drop_id or (numbered is not None and (exc.outcome_unknown or (exc.renumber and not behind)))
                    continue
                sequencer.end(numbered, True)
                return stored_results(topic, partition, header, starts, policy.attempts)
        except BaseException:
            if numbered is not None:
                sequencer.end(numbered, None)  # cancelled mid-put: maybe stored
            raise
        finally:
            if ticket is not None:
                sequencer.leave(*ticket)
        if numbered is not None:
            sequencer.end(numbered, None if drop_id else False)
        assert failure is not None
        return self._not_stored(topic, partition, messages, failure, policy.attempts)

    async def _claim(self, topic: str, partition: Partition, count: int, conn: BrokerConnection,
                     numbered: Numbered | None, failure: SendFailure | None, deadline: float,
                     ticket: object = None) -> Numbered:
        """The numbers to write the batch with on ``conn`` now, waiting for the lane's turn (see ``idempotence.py``).

        Returns without yielding to the event loop after its last check, so the caller writes
        the batch before anything else is numbered or written.
        """
        sequencer = self.sequencer
        assert sequencer is not None
        key = lane_key(topic, partition)
        while True:
            if not conn.is_open:
                raise SendFailure(f"connection to broker {partition.broker_id} closed", retriable=True)
            if numbered is not None and failure is not None and failure.renumber and sequencer.is_head(numbered) \
                    and not sequencer.is_current(numbered):
                # Out of order as the head, numbered under a dropped id: never stored (the broker
                # stored nothing past the gap), so it takes numbers under the current id.
                renumbered = sequencer.renumber(numbered)
                if renumbered is None:
                    await self._producer_id(partition)
                    continue
                numbered, failure = renumbered, None
            try:
                claimed = sequencer.claim(key, count, conn, numbered, ticket)
            except NoProducerId:
                await self._producer_id(partition)
                continue
            if claimed is not None:
                return claimed
            changed = sequencer.wait(key)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                changed.cancel()
                raise SendFailure(f"partition {partition}: earlier batches still unsettled at the send timeout",
                                  retriable=False)
            try:
                await asyncio.wait_for(changed, remaining)
            except asyncio.TimeoutError:
                pass

    async def _producer_id(self, partition: Partition) -> None:
        """Ask the partition's master for a producer id (one request at a time for the whole producer)."""
        assert self.sequencer is not None
        await self.sequencer.identity.obtain(lambda request: self._init_producer(partition, request))

    async def _init_producer(self, partition: Partition, request: InitProducerRequest) -> dict[str, Any]:
        """Send ``request`` to the partition's master: its 200 reply's header, or SendFailure."""
        broker = self.cluster.snapshot.brokers.get(partition.broker_id)
        if broker is None or not broker.master:
            raise SendFailure(f"broker {partition.broker_id} has no master to get a producer id from", retriable=True)
        host, port = parse_broker_url(broker.master)
        try:
            conn = await self.pool.get(host, port)
            reply = await conn.request(request.to_header(), timeout=self.config.request_timeout_s)
        except (ConnectionClosed, asyncio.TimeoutError) as exc:
            raise SendFailure(f"no producer id from {host}:{port}: {exc or type(exc).__name__}",
                              retriable=not isinstance(exc, CannotConnect)) from None
        if reply.code != c.OK:
            failure = classify_reply(reply.code, f"no producer id from {host}:{port}: {reply.code} {reply.message}",
                                     reason=reply.reason)
            assert failure is not None
            raise failure
        log.debug("idempotent producer id %s from %s:%d", reply.header["producer_id"], host, port)
        return reply.header

    def _not_stored(self, topic: str, partition: Partition | None, messages: list[Message], failure: SendFailure,
                    attempts: int) -> list[SendResult]:
        error = failure.message + (f" (after {attempts} attempts)" if attempts > 1 else "")
        return [
            SendResult(False, partition=partition, error_message=error, topic=topic, code=failure.code,
                       outcome_unknown=failure.outcome_unknown, attempts=attempts)
            for _ in messages
        ]

    def _reselect(self, topic: str, message: Message) -> Partition:
        partitions = self._candidates(topic)
        try:
            return self.selector.select(topic, partitions, message)
        except NoPartitionAvailable as exc:
            refusal = self.cluster.snapshot.publish_refusal(topic)
            if refusal is not None:
                raise SendFailure(refusal) from None
            # Retriable: a master may register (or come back) while we back off.
            self.cluster.request_refresh()
            raise SendFailure(str(exc), retriable=True) from None
        except Exception as exc:
            raise SendFailure(f"partition selector failed: {exc}") from None

    async def _put(self, topic: str, partition: Partition, body: bytes, count: int) -> dict:
        """One plain put attempt: its 200 reply's header, or SendFailure."""
        conn = await self._master_conn(partition)
        return await self._write_put(conn, topic, partition, body, count)

    async def _master_conn(self, partition: Partition) -> BrokerConnection:
        """The connection to ``partition``'s master (SendFailure, retriable, if there is none)."""
        broker = self.cluster.snapshot.brokers.get(partition.broker_id)
        if broker is None or not broker.master:
            raise SendFailure(f"broker {partition.broker_id} has no master for partition {partition}", retriable=True)
        host, port = parse_broker_url(broker.master)
        try:
            return await self.pool.get(host, port)
        except CannotConnect as exc:
            # Fatal: wrong credentials, TLS on one side only; no retry changes that.
            raise SendFailure(f"broker {partition.broker_id} ({host}:{port}): {exc}") from None
        except ConnectionClosed as exc:
            # Nothing was written: safe to retry, and skip this broker for a moment.
            self._suspect(partition.broker_id)
            raise SendFailure(f"broker {partition.broker_id} ({host}:{port}) unreachable: {exc}", retriable=True) from None

    async def _write_put(self, conn: BrokerConnection, topic: str, partition: Partition, body: bytes, count: int,
                         numbered: Numbered | None = None) -> dict:
        """Write one put on ``conn`` at once (before any await) and wait for its reply."""
        retry_unknown = self.config.retry_unknown_outcome
        numbers = numbered.put_fields() if numbered is not None else {}
        try:
            future = conn.send(PutRequest(topic=topic, partition=partition.partition, count=count, **numbers).to_header(), body)
        except ConnectionClosed as exc:
            self._suspect(partition.broker_id)
            raise SendFailure(f"broker {partition.broker_id} unreachable: {exc}", retriable=True) from None
        try:
            reply = await reply_within(future, self.config.request_timeout_s, f"broker {partition.broker_id}")
        except ConnectionClosed as exc:
            explained = await conn.diagnose(exc, self.config.connect_timeout_s)
            if isinstance(explained, CannotConnect):  # a TLS port never read the put: not stored
                raise SendFailure(f"broker {partition.broker_id}: {explained}") from None
            self._suspect(partition.broker_id)
            raise unknown_outcome(f"outcome unknown: {exc} after sending to partition {partition}", retry_unknown) from None
        except asyncio.TimeoutError:
            raise unknown_outcome(
                f"outcome unknown: no reply from broker {partition.broker_id} within {self.config.request_timeout_s}s",
                retry_unknown,
            ) from None
        failure = classify_reply(reply.code, f"{reply.code} {reply.message} (partition {partition})", retry_unknown,
                                 reason=reply.reason)
        if failure is not None:
            failure.renumber = "expected_seq" in reply.header
            raise failure
        return reply.header


def lane_key(topic: str, partition: Partition) -> tuple[str, int, int]:
    """The key of a partition's numbering (``idempotence.Lane``)."""
    return (topic, partition.broker_id, partition.partition)


def stored_results(topic: str, partition: Partition, header: dict, starts: list[int], attempts: int) -> list[SendResult]:
    """One SendResult per record of a put the broker stored (``header`` is its 200 reply)."""
    return list(StoredResults(topic, partition, header, starts, attempts))


class StoredResults(Sequence[SendResult]):
    """The SendResults of a put the broker stored, each built when it is read (``stored_results``: all at once).

    The accumulator hands a put's results to their callbacks one by one: built just before
    its callback and, unless the callback keeps it, freed right after, a result does not add
    to the allocations that set off CPython's cyclic garbage collector (see ``deliver``).
    """

    __slots__ = ("topic", "partition", "first_offset", "first_id", "starts", "attempts")

    def __init__(self, topic: str, partition: Partition, header: dict, starts: list[int], attempts: int) -> None:
        number = header["partition"]
        self.topic = topic
        self.partition = partition if number == partition.partition else Partition(partition.broker_id, int(number))
        self.first_offset, self.first_id = int(header["offset"]), int(header["msg_id"])
        self.starts = starts
        self.attempts = attempts

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        return list(self)[index]  # builds them all: meant to be iterated (or made a list once, stored_results)

    def __iter__(self) -> Iterator[SendResult]:
        count = len(self.starts)
        if self.first_offset < 0:  # a duplicate of a batch stored so long ago that the broker no longer knows where
            offsets: Iterable[int] = repeat(-1, count)
            ids: Iterable[int] = repeat(-1, count)
        else:
            offsets, ids = map(add, repeat(self.first_offset, count), self.starts), range(self.first_id, self.first_id + count)
        # SendResult(True, partition, offset, msg_id, None, topic, OK, False, attempts): no Python frame but __init__'s.
        return map(partial(SendResult, True, self.partition), offsets, ids, repeat(None), repeat(self.topic), repeat(c.OK),
                   repeat(False), repeat(self.attempts))
