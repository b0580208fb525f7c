"""The consumer: one fetch loop per owned partition, long-poll, listener retries, offset commits.

Three ways to receive, per subscribed topic:

* a ``listener(message)``, called per message (MetaQ's API);
* a ``batch_listener(messages)``, called with the messages of one fetch;
* no listener: the application iterates, ``async for message in consumer`` (or
  ``getmany()`` for a fetch's messages at once), as with aiokafka or kafka-python.

A subscription's message filter (filters.py) drops messages before any of these; the
position still moves past them. So does the read-committed filter, always on: the broker
serves only up to the last stable offset, and the consumer skips control records (batch
headers, transaction markers) and records of rolled-back transactions (the fetch reply's
``aborted`` spans; metaq/txn/reader.py).

Delivery is at least once. A partition's position is advanced only after its listener
returned for a message (a batch listener: for the batch), or after a failed message was
stored: by default in the group's retry topic (retry_topics.py; the group consumes it as
one more topic, each message when due), with ``failure_store="local"`` after
``max_retries`` calls in the local recover store (recover.py). An iterated batch
counts as consumed when the application asks for the next one or shuts the consumer
down. Positions are committed every ``commit_interval_s``, before every rebalance and at
shutdown. A consumer that dies redelivers at most what it consumed since its last commit.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Union

from ..config import check_topic_name
from ..protocol import commands as c
from ..protocol.messages import GetRequest, OffsetRequest
from ..protocol.replies import aborted_spans
from ..record import RecordError, damaged_first_record
from ..txn.reader import drop_aborted
from .cluster import Cluster, ClusterSnapshot
from .codec import decode_messages
from .config import ConsumerConfig, MetaClientConfig
from .connection import BrokerConnection, CannotConnect, ConnectionClosed
from .errors import access_denied
from .failure_router import FailureRouter
from .filters import MessageFilter, accept_function, accepted
from .message import Message, Partition
from .offsets import LocalOffsetStore, OffsetStore, Position, ZkOffsetStore, initial_position
from .pool import ConnectionPool
from .rebalance import Assignment, BroadcastAssignment, GroupAssignment, claim_all
from .recover import RecoverManager, RecoverStore
from .retry_topics import due_at_ms, parse_envelope
from .routing import Replica, choose_replica
from .times import offsets_for_times, time_offsets

log = logging.getLogger(__name__)

Listener = Callable[[Message], Union[None, Awaitable[None]]]
BatchListener = Callable[[list[Message]], Union[None, Awaitable[None]]]


@dataclass
class ConsumerStats:
    #: Messages a listener took (redeliveries from the recover store included), or that
    #: were handed to an iterating application.
    delivered: int = 0
    listener_failures: int = 0
    recovered: int = 0  # messages moved to the recover store
    redelivered: int = 0  # messages from the recover store that finally succeeded
    rebalances: int = 0
    commits: int = 0
    filtered: int = 0  # messages a filter rejected (skipped, offsets moved past them)
    retried: int = 0  # failed messages stored in the group's retry topic
    dead_lettered: int = 0  # messages stored in the group's dead-letter topic
    failure_send_errors: int = 0  # failed tries to store a failed message there (each tried again)


@dataclass
class Subscription:
    """A topic's receiver: ``listener`` per message, ``batch_listener`` per fetch, or neither (iterated)."""

    topic: str
    max_size: int
    listener: Listener | None = None
    batch_listener: BatchListener | None = None
    accept: Callable[[str, Message], bool] | None = None  # the message filter, if any
    #: The group's retry topic (retry_topics.py): delivered when due to the original topic's
    #: listener, and always read from the stored offset (none: the oldest), whatever the start settings.
    retries: bool = False

    def __post_init__(self) -> None:
        target = self.listener or self.batch_listener
        self.is_async = target is not None and (
            inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(getattr(target, "__call__", None))
        )

    def call(self, message: Message) -> object:
        """Deliver one message (a redelivery from the recover store, or a retry)."""
        if self.listener is not None:
            return self.listener(message)
        assert self.batch_listener is not None
        return self.batch_listener([message])


class _HandedBatch:
    """The messages of one fetch, handed to the iterating application."""

    __slots__ = ("fetcher", "messages", "end", "consumed")

    def __init__(self, fetcher: "PartitionFetcher", messages: list[Message], end: int) -> None:
        self.fetcher = fetcher
        self.messages = messages
        self.end = end
        self.consumed = asyncio.Event()


class _FetcherState:
    """A fetcher's place: the offset to fetch next and the id of the message before it.

    Kept as two plain fields (not a Position per message) because the delivery loop
    updates them for every message.
    """

    def __init__(self, position: Position | None) -> None:
        self.next_offset: int | None = position.offset if position else None
        self.last_msg_id: int = position.msg_id if position else -1
        #: Where the next fetch starts when it is ahead of next_offset: an iterated
        #: consumer fetches the next batch while the application works through this one.
        self.fetch_offset: int | None = None
        self.committed: Position | None = position
        self.replica: Replica | None = None
        self.failed_replica: Replica | None = None

    @property
    def position(self) -> Position | None:
        return None if self.next_offset is None else Position(self.last_msg_id, self.next_offset)

    @position.setter
    def position(self, value: Position) -> None:
        self.last_msg_id, self.next_offset = value.msg_id, value.offset
        self.fetch_offset = None

    def advance(self, messages: list[Message], done: int, end: int) -> None:
        """The first ``done`` messages of a fetch (ending at ``end``) are consumed."""
        if done:
            self.last_msg_id = messages[done - 1].id  # type: ignore[assignment]
            self.next_offset = messages[done].offset if done < len(messages) else end

    @property
    def fetch_from(self) -> int | None:
        return self.fetch_offset if self.fetch_offset is not None else self.next_offset


class PartitionFetcher:
    """Fetches one partition in a loop and hands each message to the consumer's listener."""

    def __init__(self, consumer: "AsyncMessageConsumer", subscription: Subscription, partition: Partition, position: Position | None,
                 incarnation: str | None = None) -> None:
        self.consumer = consumer
        self.subscription = subscription
        self.topic = subscription.topic
        self.partition = partition
        #: The topic's incarnation when the fetcher started (None: unknown, or a store that
        #: does not keep them): its commits are stored as of that incarnation.
        self.incarnation = incarnation
        self.state = _FetcherState(position)
        self._stopping = False
        self._in_wait = False
        self._task: asyncio.Task[None] | None = None
        self.handed: _HandedBatch | None = None  # the last batch handed to the iterating application
        self._fatal_reported: str | None = None  # the last fatal reason logged (once, not per retry)
        self._slaveless_reported = False  # read_from='slave' found a master but no slave (said once per stretch)
        #: A position the broker vouched for (a record starts there) or this fetcher realigned to:
        #: a fetch there that again finds no message is an error, never another realign (no loop).
        self._vouched: int | None = None

    @property
    def position(self) -> Position | None:
        return self.state.position

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"metaq-fetch-{self.topic}-{self.partition}")

    async def stop(self) -> None:
        """Stop between two messages: a message being delivered is finished first."""
        self._stopping = True
        if self._task is None:
            return
        if self._in_wait:
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _wait(self, awaitable: Awaitable[Any]) -> Any:
        # The only points where stop() may cancel us: fetches and back-off sleeps.
        self._in_wait = True
        try:
            if self._stopping:
                raise asyncio.CancelledError
            return await awaitable
        finally:
            self._in_wait = False

    async def _run(self) -> None:
        config = self.consumer.config
        backoff = config.fetch_retry_min_s
        max_size = self.subscription.max_size
        while not self._stopping:
            try:
                replica = self._choose_replica()
                if replica is None:
                    raise _FetchError(f"no {config.read_from} replica of broker {self.partition.broker_id} registered")
                conn = await self._wait(self.consumer.pool.get(replica.host, replica.port))
                if self.state.position is None:
                    await self._init_position(conn)
                    continue
                reply = await self._wait(self._fetch(conn, max_size))
                try:
                    handled = await self._handle(reply, max_size)
                except _Misaligned as misaligned:
                    await self._realign(conn, misaligned)
                    continue
                if self._vouched is not None and self.state.fetch_from != self._vouched:
                    self._vouched = None  # the position moved on: a later realign is a new one
                if handled == "grow":
                    max_size = min(max_size * 2, config.max_fetch_size)
                    continue
                max_size = self.subscription.max_size
                self.state.failed_replica = None
                backoff = config.fetch_retry_min_s
                if handled == "idle":
                    await self._wait(asyncio.sleep(config.fetch_retry_min_s))
            except asyncio.CancelledError:
                if self._stopping:
                    return
                raise
            except Exception as exc:  # the loop must survive anything but stop()
                if not isinstance(exc, (_FetchError, ConnectionClosed, asyncio.TimeoutError, RecordError)):
                    log.exception("%s-%s: unexpected fetch error", self.topic, self.partition)
                self._fetch_failed(exc)
                try:
                    await self._wait(asyncio.sleep(backoff))
                except asyncio.CancelledError:
                    return
                backoff = min(backoff * 2, config.fetch_retry_max_s)

    def _choose_replica(self) -> Replica | None:
        broker = self.consumer.cluster.snapshot.brokers.get(self.partition.broker_id)
        read_from = self.consumer.config.read_from
        replica = choose_replica(broker, read_from, avoid=self.state.failed_replica)
        if replica is None and read_from == "slave" and broker is not None and broker.master:
            # Not a failover (the master is there): the policy itself keeps this partition
            # unread, possibly for good, so the user is told once instead of at debug level.
            if not self._slaveless_reported:
                self._slaveless_reported = True
                log.warning("%s-%s: no slave of broker %d is registered and read_from='slave' never reads the master: "
                            "waiting for a slave (read_from='prefer-slave' reads the master meanwhile)",
                            self.topic, self.partition, self.partition.broker_id)
        elif replica is not None:
            self._slaveless_reported = False
        if replica != self.state.replica and replica is not None:
            if self.state.replica is not None:
                log.info("%s-%s: now reading from broker %d %s (%s)", self.topic, self.partition, replica.broker_id, replica.role, replica.address)
            self.state.replica = replica
        return replica

    def _fetch_failed(self, exc: BaseException) -> None:
        message = str(exc) or type(exc).__name__
        replica = self.state.replica
        # A replica that failed us (unreachable, error reply, lagging) is avoided next time if another qualifies.
        replica_failed = not isinstance(exc, _FetchError) or exc.replica_failed
        if replica is not None and replica_failed:
            self.state.failed_replica = replica
            self.consumer.cluster.request_refresh()
        # Fatal (errors.py): no retry fixes it until someone changes a setting. A consumer keeps
        # trying (an operator may grant the ACL), but says why once instead of at debug level.
        if isinstance(exc, CannotConnect) or getattr(exc, "fatal", False):
            if message != self._fatal_reported:
                self._fatal_reported = message
                log.warning("%s-%s: cannot read: %s (retrying until the settings change)", self.topic, self.partition, message)
            return
        if getattr(exc, "stuck", False):  # no retry is likely to help: said once, at ERROR
            if message != self._fatal_reported:
                self._fatal_reported = message
                log.error("%s-%s: cannot read: %s (retrying)", self.topic, self.partition, message)
            return
        log.debug("%s-%s: fetch failed: %s", self.topic, self.partition, message)

    async def _init_position(self, conn: BrokerConnection) -> None:
        """Where a partition without a stored offset starts: ``ConsumerConfig.start_offset``."""
        reply = await self._wait(
            conn.request(
                OffsetRequest(topic=self.topic, partition=self.partition.partition, offset=0).to_header(),
                timeout=self.consumer.client_config.request_timeout_s,
            )
        )
        if not reply.ok:
            raise _FetchError(f"offset query failed: {reply.code} {reply.message}", replica_failed=True,
                              fatal=access_denied(reply.code, reply.message, reply.reason))
        config = self.consumer.config
        # A retry topic starts at its oldest: a retry stored before this fetcher began must not be skipped.
        offset = int(reply["min_offset"]) if self.subscription.retries else config.start_offset(int(reply["min_offset"]), int(reply["max_offset"]))
        self.state.position = initial_position(offset)
        # Commit the starting point at once: if we die before the first periodic commit, the
        # next owner must not start again from the (by then later) end and skip messages.
        await self.consumer.commit_partition(self)
        log.info("%s-%s: no stored offset, starting at %d (%s)", self.topic, self.partition, offset,
                 "the oldest message: a retry topic" if self.subscription.retries else config.describe_start())

    async def _fetch(self, conn: BrokerConnection, max_size: int):
        config = self.consumer.config
        assert self.state.position is not None
        header = GetRequest(
            topic=self.topic,
            partition=self.partition.partition,
            offset=self.state.fetch_from,
            max_size=max_size,
            group=config.group,
            max_wait_ms=config.fetch_wait_ms,
        ).to_header()
        return await conn.request(header, timeout=self.consumer.client_config.request_timeout_s + config.fetch_wait_ms / 1000)

    async def _handle(self, reply, max_size: int) -> str:
        """Process one fetch reply: "data", "grow" (record larger than max_size), or "idle"."""
        assert self.state.position is not None
        if reply.code == c.OK:
            base = int(reply["offset"])
            try:
                messages, end = decode_messages(reply.body, base, self.topic, self.partition)
            except RecordError as exc:
                if damaged_first_record(reply.body):
                    raise _Misaligned(base, f"no message starts at {base} ({exc})") from None
                raise
            if messages and reply.get("aborted"):
                # Read committed: the broker stopped at the last stable offset (decode_messages left
                # out the control records); skip the records of rolled-back transactions.
                messages = drop_aborted(messages, aborted_spans(reply.header))
                if not messages:
                    await self._skip_to(end)
                    return "data"
            if messages and self.subscription.accept is not None:
                kept = accepted(self.subscription.accept, self.consumer.config.group, messages)
                self.consumer.stats.filtered += len(messages) - len(kept)
                if not kept:
                    await self._skip_to(end)
                    return "data"
                messages = kept  # a consumed prefix of kept moves the position past the rejected ones too
            if messages:
                delivered = await self.consumer._deliver_batch(self, messages, end)
                return "data" if delivered else "idle"
            if end > base:  # only control records (batch headers, markers): consumed, nothing delivered
                await self._skip_to(end)
                return "data"
            if len(reply.body) >= max_size and max_size < self.consumer.config.max_fetch_size:
                return "grow"
            # The broker serves whole segments' records up to a record boundary (the committed
            # offset, a segment's end): a first record that never ends in them does not start here.
            raise _Misaligned(base, f"no message starts at {base} (a fetch of {len(reply.body)} bytes holds no whole one)")
        if reply.code == c.MOVED:
            new_offset = int(reply["offset"])
            log.warning("%s-%s: offset %d is gone (before the log start); moving to %d", self.topic, self.partition, self.state.position.offset, new_offset)
            self.state.position = initial_position(new_offset)
            return "data"
        if reply.code == c.NOT_FOUND and "committed" in reply.header:
            # No data yet; the broker already held the request for fetch_wait_ms. A replica
            # behind our offset (a lagging slave) answers at once: back off, maybe switch.
            log_end = int(reply.get("log_end", 0))  # type: ignore[arg-type]
            if self.state.fetch_from > log_end:  # type: ignore[operator]
                if self.state.replica is not None and self.state.replica.role == "master":
                    # A slave may lag; the master's log never ends below a position read from it,
                    # unless it changed (a failover took its tail back, an unflushed tail lost).
                    raise _Misaligned(self.state.fetch_from, f"offset {self.state.fetch_from} is past the master's log end {log_end}")
                raise _FetchError(f"{self.state.replica.role if self.state.replica else 'replica'} is behind offset {self.state.fetch_from}", replica_failed=True)
            return "data" if self.consumer.config.fetch_wait_ms > 0 else "idle"
        raise _FetchError(f"fetch failed: {reply.code} {reply.message}", replica_failed=True,
                          fatal=access_denied(reply.code, reply.message, reply.reason))


    async def _skip_to(self, end: int) -> None:
        """Everything fetched up to ``end`` was filtered out: consume it without delivering."""
        await self._handed_consumed()
        self.state.position = Position(self.state.last_msg_id, end)

    async def _handed_consumed(self) -> None:
        previous = self.handed
        if previous is not None and not previous.consumed.is_set():
            # Iterated: the batch before is still with the application; moving past it would lose it.
            await self._wait(previous.consumed.wait())

    async def _realign(self, conn: BrokerConnection, misaligned: "_Misaligned") -> None:
        """No message starts at the fetch position: ask the broker where to resume (``offset`` with
        ``realign``), move there and say so once (docs/client.md "Realigning a position")."""
        at = misaligned.offset
        if at == self._vouched:
            raise misaligned.vouched()
        reply = await self._wait(
            conn.request(
                OffsetRequest(topic=self.topic, partition=self.partition.partition, offset=at, realign=True).to_header(),
                timeout=self.consumer.client_config.request_timeout_s,
            )
        )
        if not reply.ok:
            raise _FetchError(f"realign query failed: {reply.code} {reply.message}", replica_failed=True,
                              fatal=access_denied(reply.code, reply.message, reply.reason))
        offset = int(reply["offset"])
        self._vouched = offset
        if offset == at:
            raise misaligned.vouched()
        await self._handed_consumed()
        self.state.position = initial_position(offset)
        log.warning("%s-%s: %s: the log changed under this position, e.g. an async failover took back records; "
                    "resuming at %d, %s", self.topic, self.partition, misaligned.reason, offset,
                    _realigned_to(reply.get("realign"), reply.get("epoch")))


def _realigned_to(how: object, epoch: object) -> str:
    """The WARNING's words for the ``realign`` field of the broker's answer."""
    if how == "epoch_start":
        return f"the start of epoch {epoch}"
    if how == "next_record":
        return "the next message start (the partition has no epoch history)"
    if how == "log_end":
        return "the log end (the partition has no epoch history)"
    if how == "log_start":
        return "the log start"
    return "the start of the segment holding it (the broker predates realign)"


class _Misaligned(Exception):
    """No message starts at ``offset`` of the log a fetch read: the position needs realigning."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason

    def vouched(self) -> "_FetchError":
        """The error when the broker says a message does start there: no realign, no loop."""
        return _FetchError(f"{self.reason}, though the broker says a message starts there "
                           f"(a message larger than max_fetch_size, or damaged bytes)", stuck=True)


class _FetchError(Exception):
    def __init__(self, message: str, replica_failed: bool = False, fatal: bool = False, stuck: bool = False) -> None:
        super().__init__(message)
        self.replica_failed = replica_failed
        self.fatal = fatal
        self.stuck = stuck  # not fatal (no setting fixes it), but no retry is likely to: logged once


class AsyncMessageConsumer:
    """Consumes subscribed topics as a member of ``config.group``. Create with ``factory.create_consumer()``."""

    def __init__(self, cluster: Cluster, pool: ConnectionPool, client_config: MetaClientConfig, config: ConsumerConfig,
                 offset_store: OffsetStore | None = None) -> None:
        self.cluster = cluster
        self.pool = pool
        self.client_config = client_config
        self.config = config
        self.stats = ConsumerStats()
        path = config.resolved_offset_store_path()
        if offset_store is None and config.offset_store_url:
            from .offsets_sql import SqlOffsetStore  # imported on use: most consumers never need SQLAlchemy

            offset_store = SqlOffsetStore(config.offset_store_url)
        self.offset_store: OffsetStore = offset_store or (LocalOffsetStore(path) if path else ZkOffsetStore(cluster))
        self.recover_store = RecoverStore(config.resolved_recover_dir())
        self.recover = RecoverManager(self.recover_store, config.recover_interval_s)
        #: failure_store="topic": the group's retry and dead-letter topics (None: the local store,
        #: also for a broadcast consumer, whose failures are its own: each member gets every message).
        self.failures = (FailureRouter(cluster, pool, client_config, config, self.stats)
                         if config.failure_store == "topic" and not config.broadcast else None)
        self.subscriptions: dict[str, Subscription] = {}
        self.fetchers: dict[tuple[str, Partition], PartitionFetcher] = {}
        self.paused = False
        self.assignment: Assignment = (
            BroadcastAssignment(self._request_rebalance) if config.broadcast
            else GroupAssignment(cluster, config.group, config.consumer_id, lambda: list(self.subscriptions), self._request_rebalance)
        )
        self._rebalance_needed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_partitions: dict[str, tuple[Partition, ...]] = {}
        self._started = False
        self._closed = False
        # Iteration: fetched batches waiting for the application (None: shut down), the
        # batch being iterated and how many of its messages were handed out.
        self._handed_queue: asyncio.Queue[_HandedBatch | None] = asyncio.Queue()
        self._current: _HandedBatch | None = None
        self._current_index = 0

    # --- public API --------------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        max_size: int | None = None,
        listener: Listener | None = None,
        *,
        batch_listener: BatchListener | None = None,
        message_filter: MessageFilter | None = None,
    ) -> "AsyncMessageConsumer":
        """Receive ``topic`` (call complete_subscribe() once all are registered, or just iterate).

        ``listener(message)`` is called per message, ``batch_listener(messages)`` with the
        messages of one fetch (in order, all of one partition); either may be a plain
        function (called in the event loop: keep it quick) or a coroutine function. If it
        raises, the message(s) go to the group's retry topic and come again when due, up to
        ``max_reconsume_times`` times, then to its dead-letter topic (``failure_store="local"``:
        called again at once up to ``max_retries`` times, then the recover store). With
        neither, iterate the consumer.
        ``message_filter`` (MetaQ's ConsumerMessageFilter: ``accept(group, message)``, or a
        callable) drops messages before any of these; offsets still move past them.
        """
        if self._started:
            raise RuntimeError("subscribe() must come before complete_subscribe()")
        if listener is not None and batch_listener is not None:
            raise ValueError("subscribe() takes a listener or a batch_listener, not both")
        # The name becomes ZooKeeper paths (owners, offsets): the brokers' rule, checked here.
        check_topic_name(topic)
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1):
            raise ValueError(f"subscribe(): max_size must be an int >= 1 (None: fetch_size), got {max_size!r}")
        accept = accept_function(message_filter) if message_filter is not None else None
        subscription = Subscription(topic, max_size or self.config.fetch_size, listener, batch_listener, accept)
        self.subscriptions[topic] = subscription
        if listener is not None or batch_listener is not None:
            self.recover.register(topic, lambda m, s=subscription: self._deliver(s, m, redelivery=True))
        return self

    async def __aenter__(self) -> "AsyncMessageConsumer":
        await self.complete_subscribe()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def __aiter__(self) -> "AsyncMessageConsumer":
        return self

    async def __anext__(self) -> Message:
        """The next message of a topic subscribed without a listener (``async for``).

        Ends when the consumer shuts down, or after ``iterator_timeout_s`` without a message.
        """
        batch = self._current
        if batch is not None and self._current_index < len(batch.messages) and not batch.fetcher._stopping:
            self._current_index += 1
            return batch.messages[self._current_index - 1]
        messages = await self.getmany(self.config.iterator_timeout_s)
        if not messages:
            raise StopAsyncIteration
        self._current_index = 1
        return messages[0]

    async def getmany(self, timeout_s: float | None = None) -> list[Message]:
        """The messages of the next fetch (all of one partition, in order); [] after ``timeout_s`` or at shutdown.

        The messages returned by the previous call (or iterated) count as consumed now:
        the partition's position moves past them.
        """
        if not self._started:
            await self.complete_subscribe()
        batch = self._current
        if batch is not None and self._current_index < len(batch.messages) and not batch.fetcher._stopping:
            rest = batch.messages[self._current_index:]  # what an interrupted iteration had not handed out
            self._current_index = len(batch.messages)
            return rest
        self._finish_current()
        while not self._closed:
            try:
                batch = await asyncio.wait_for(self._handed_queue.get(), timeout_s) if timeout_s is not None \
                    else await self._handed_queue.get()
            except asyncio.TimeoutError:
                return []
            if batch is None:
                self._handed_queue.put_nowait(None)  # wake any other waiter too
                break
            if batch.fetcher._stopping:  # its partition went to another member meanwhile
                batch.consumed.set()
                continue
            self._current, self._current_index = batch, len(batch.messages)
            self.stats.delivered += len(batch.messages)
            return batch.messages
        return []

    async def complete_subscribe(self) -> None:
        """Join the group, get partitions, start fetching."""
        if self._started:
            return
        if not self.subscriptions:
            raise ValueError("subscribe to at least one topic before complete_subscribe()")
        self._started = True
        if self.failures is not None and any(s.listener or s.batch_listener for s in self.subscriptions.values()):
            # The group's retries are one more topic of the group: split among its members, offsets committed alike.
            # (Also while the topic does not exist yet: its partitions are taken once it is created.)
            self.subscriptions.setdefault(self.failures.retry_topic, Subscription(self.failures.retry_topic, self.config.fetch_size, retries=True))
        for topic in self.subscriptions:
            await self.cluster.watch_topic(topic, subscribe=True)
            self._last_partitions[topic] = tuple(self.cluster.snapshot.readable_partitions(topic))
        self.cluster.add_listener(self._on_cluster_change)
        await self.assignment.start()
        self._rebalance_needed.set()
        self._tasks = [
            asyncio.create_task(self._rebalance_loop(), name="metaq-rebalance"),
            asyncio.create_task(self._commit_loop(), name="metaq-commit"),
        ]
        self.recover.start()

    def pause(self) -> None:
        """Stop delivering (fetchers finish the message at hand and idle); offsets stay put."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def owned_partitions(self, topic: str | None = None) -> list[Partition]:
        return sorted(p for (t, p) in self.fetchers if topic is None or t == topic)

    async def offsets_for_times(self, topic: str, times: dict[Partition | str, int]) -> dict[Partition, int | None]:
        """Per partition, the first offset whose message time (its msg id's) is >= the given ms
        since 1970, or None when no readable message is that late (metaq/client/times.py)."""
        return await offsets_for_times(self.cluster, self.pool, topic, times, self.client_config.request_timeout_s)

    async def seek_to_time(self, time_ms: int, topic: str | None = None) -> dict[tuple[str, Partition], int]:
        """Move every partition this member owns (of ``topic``, or of all) to the first message
        at or after ``time_ms`` (ms since 1970), or to the end when none is that late, and commit
        the new positions; returns them. Each partition's fetcher stops between two messages,
        moves, and starts again; partitions it takes later start at the group's offsets as usual."""
        by_topic: dict[str, list[Partition]] = {}
        for owned_topic, partition in self.fetchers:
            if topic is None or owned_topic == topic:
                by_topic.setdefault(owned_topic, []).append(partition)
        moved: dict[tuple[str, Partition], int] = {}
        for owned_topic, partitions in by_topic.items():
            found = await time_offsets(self.cluster, self.pool, owned_topic, {p: time_ms for p in partitions},
                                       self.client_config.request_timeout_s)
            for partition, answer in found.items():
                fetcher = self.fetchers.get((owned_topic, partition))
                if fetcher is None:
                    continue  # a rebalance took it meanwhile
                await fetcher.stop()
                fetcher.state.position = initial_position(answer.offset)
                fetcher._stopping = False
                fetcher.start()
                await self.commit_partition(fetcher)
                moved[(owned_topic, partition)] = answer.offset
                log.info("group %s: %s-%s moved to offset %d (time %d)", self.config.group, owned_topic, partition,
                         answer.offset, time_ms)
        return moved

    async def commit(self) -> None:
        """Commit the position of every owned partition now."""
        by_topic: dict[str, list[PartitionFetcher]] = {}
        for (topic, _), fetcher in list(self.fetchers.items()):
            by_topic.setdefault(topic, []).append(fetcher)
        for topic, fetchers in by_topic.items():
            await self._commit_fetchers(topic, fetchers)

    async def shutdown(self) -> None:
        """Stop fetching, commit, release owned partitions, leave the group."""
        if self._closed:
            return
        self._closed = True
        self._finish_current()
        self._handed_queue.put_nowait(None)
        self.cluster.remove_listener(self._on_cluster_change)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.recover.stop()
        for key in list(self.fetchers):
            await self._drop(*key)
        await self.assignment.stop()
        if self.failures is not None:
            await self.failures.close()

    # --- delivery ----------------------------------------------------------------------------

    async def _deliver_batch(self, fetcher: PartitionFetcher, messages: list[Message], end: int) -> int:
        """Deliver one fetch's messages in order; returns how many were consumed (or handed over)."""
        subscription = fetcher.subscription
        if subscription.retries:
            return await self._deliver_retries(fetcher, messages, end)
        if subscription.listener is None:
            if subscription.batch_listener is None:
                return await self._hand_over(fetcher, messages, end)
            return await self._deliver_whole(fetcher, messages, end)
        state = fetcher.state
        stats = self.stats
        listener = subscription.listener
        is_async = subscription.is_async
        done = counted_elsewhere = 0  # delivered; and deliveries that _deliver counted itself
        # The position is written only before an await and at the end: nothing else runs
        # in between (one event loop), so a commit never sees it lag behind a delivery.
        for message in messages:
            if self.paused or fetcher._stopping:
                break
            if is_async:
                state.advance(messages, done, end)
                await self._deliver_or_recover(subscription, message, wait=fetcher._wait)
                counted_elsewhere += 1
            else:
                try:
                    result = listener(message)
                    if result is not None and asyncio.iscoroutine(result):  # a plain callable may return one
                        state.advance(messages, done, end)
                        await result
                except Exception as exc:
                    state.advance(messages, done, end)
                    counted_elsewhere += 1
                    self._failed(message, exc, 1)
                    await self._deliver_or_recover(subscription, message, error=exc, wait=fetcher._wait)
            done += 1
        stats.delivered += done - counted_elsewhere
        state.advance(messages, done, end)
        return done

    async def _deliver_whole(self, fetcher: PartitionFetcher, messages: list[Message], end: int) -> int:
        """A batch listener's delivery: the whole fetch, retried as a whole, then parked message by message."""
        if self.paused or fetcher._stopping:
            return 0
        subscription = fetcher.subscription
        batch_listener = subscription.batch_listener
        assert batch_listener is not None
        attempts = 1 if self.failures is not None else self.config.max_retries  # the retry topic retries, later
        error: Exception | None = None
        for attempt in range(1, attempts + 1):
            try:
                result = batch_listener(messages)
                if result is not None and asyncio.iscoroutine(result):
                    await result
            except Exception as exc:
                self.stats.listener_failures += 1
                log.warning("batch listener failed on %d messages of %s-%s from %s (attempt %d of %d): %s", len(messages),
                            fetcher.topic, fetcher.partition, messages[0].offset, attempt, attempts, exc)
                error = exc
                continue
            self.stats.delivered += len(messages)
            break
        else:
            for done, message in enumerate(messages):  # one bad batch must not stall the partition
                fetcher.state.advance(messages, done, end)
                await self._park(message, error or "batch listener failed", 1, fetcher._wait)
        fetcher.state.advance(messages, len(messages), end)
        return len(messages)

    async def _hand_over(self, fetcher: PartitionFetcher, messages: list[Message], end: int) -> int:
        """Queue a fetch for the iterating application, once the previous one of this partition is consumed.

        So a partition has at most one batch with the application and one fetched ahead.
        """
        previous = fetcher.handed
        if previous is not None and not previous.consumed.is_set():
            await fetcher._wait(previous.consumed.wait())
        batch = fetcher.handed = _HandedBatch(fetcher, messages, end)
        fetcher.state.fetch_offset = end
        self._handed_queue.put_nowait(batch)
        return len(messages)

    def _finish_current(self) -> None:
        """The batch with the application is consumed as far as it was handed out."""
        batch, self._current = self._current, None
        if batch is not None:
            if not batch.fetcher._stopping:
                batch.fetcher.state.advance(batch.messages, self._current_index, batch.end)
                if self._current_index < len(batch.messages):
                    batch.fetcher.state.fetch_offset = None  # only at shutdown: the rest is fetched again
            batch.consumed.set()

    async def _attempt(self, subscription: Subscription, message: Message, attempt: int, attempts: int) -> Exception | None:
        """One call of the listener; the exception it raised (counted and logged), or None."""
        try:
            result = subscription.call(message)
            if asyncio.iscoroutine(result):
                await result
        except Exception as exc:
            self._failed(message, exc, attempt, attempts)
            return exc
        self.stats.delivered += 1
        return None

    def _failed(self, message: Message, exc: Exception, attempt: int, attempts: int | None = None) -> None:
        self.stats.listener_failures += 1
        of = f" of {attempts if attempts is not None else self.config.max_retries}" if self.failures is None else ""
        log.warning("listener failed on %s-%s@%s (attempt %d%s): %s", message.topic, message.partition, message.offset,
                    attempt, of, exc)

    async def _deliver(self, subscription: Subscription, message: Message, redelivery: bool = False, failed: int = 0) -> bool:
        """Call the listener up to max_retries times (minus ``failed``); True once it returned normally."""
        attempts = 1 if redelivery else self.config.max_retries
        for attempt in range(failed + 1, attempts + 1):
            if await self._attempt(subscription, message, attempt, attempts) is None:
                if redelivery:
                    self.stats.redelivered += 1
                return True
        return False

    async def _deliver_or_recover(self, subscription: Subscription, message: Message, error: Exception | None = None,
                                  wait: Callable[[Awaitable[Any]], Awaitable[Any]] | None = None) -> None:
        """Deliver a message whose listener raised ``error`` (None: not called yet) until stored or taken."""
        if self.failures is not None:
            # Broker-side retry: one call here; the retries come through the group's retry topic.
            if error is None:
                error = await self._attempt(subscription, message, 1, 1)
            if error is not None:
                await self._park(message, error, 1, wait)
            return
        if await self._deliver(subscription, message, failed=1 if error is not None else 0):
            return
        await self._recover(message)

    async def _park(self, message: Message, error: Exception | str, attempts: int,
                    wait: Callable[[Awaitable[Any]], Awaitable[Any]] | None) -> None:
        """Store a failed message where failure_store says, so its partition can move on."""
        if self.failures is None:
            await self._recover(message)
        else:
            await self.failures.send_back(message, error, attempts, wait or _no_wait)

    async def _deliver_retries(self, fetcher: PartitionFetcher, messages: list[Message], end: int) -> int:
        """A partition of the group's retry topic: each message once due, to its original topic's listener.

        Waits on this partition only (the fetcher's cancellable wait): other partitions, the
        retry topic's other delay levels included, go on meanwhile.
        """
        assert self.failures is not None
        done = 0
        for retried in messages:
            if self.paused or fetcher._stopping:
                break
            fetcher.state.advance(messages, done, end)
            try:
                info = parse_envelope(retried.attribute or "")
            except ValueError as exc:
                self.stats.filtered += 1
                log.error("group %s: %s-%s@%s is no retry of this client (%s): skipped", self.config.group, retried.topic,
                          retried.partition, retried.offset, exc)
                done += 1
                continue
            delay_s = (due_at_ms(retried, info) - time.time() * 1000) / 1000
            if delay_s > 0:
                await fetcher._wait(asyncio.sleep(delay_s))
                if self.paused or fetcher._stopping:
                    break
            message = info.original(retried.data)
            subscription = self.subscriptions.get(info.topic)
            if subscription is None or (subscription.listener is None and subscription.batch_listener is None):
                error: Exception | None = LookupError(f"this member has no listener for topic {info.topic!r}")
            else:
                error = await self._attempt(subscription, message, info.attempts + 1, self.config.max_reconsume_times + 1)
            if error is not None:
                await self.failures.send_back(message, error, info.attempts + 1, fetcher._wait)
            done += 1
        fetcher.state.advance(messages, done, end)
        return done

    async def _recover(self, message: Message) -> None:
        # One bad message must not stall the partition: park it on disk and move on.
        await asyncio.to_thread(self.recover_store.append, message)
        self.stats.recovered += 1
        log.error("message %s-%s@%s failed %d times; saved to the recover store %s", message.topic, message.partition,
                  message.offset, self.config.max_retries, self.recover_store.directory)

    # --- offsets -----------------------------------------------------------------------------

    async def commit_partition(self, fetcher: PartitionFetcher) -> None:
        await self._commit_fetchers(fetcher.topic, [fetcher])

    async def _commit_fetchers(self, topic: str, fetchers: list[PartitionFetcher]) -> None:
        changed = {}
        for fetcher in fetchers:
            position = fetcher.state.position
            if position is not None and position != fetcher.state.committed:
                changed[fetcher.partition] = position
        if not changed:
            return
        if self._keeps_incarnations:
            incarnations = {f.partition: f.incarnation for f in fetchers if f.partition in changed}
            await self.offset_store.commit(self.config.group, topic, changed, incarnations=incarnations)  # type: ignore[arg-type, call-arg]
        else:
            await self.offset_store.commit(self.config.group, topic, changed)  # type: ignore[arg-type]
        for fetcher in fetchers:
            if fetcher.partition in changed:
                fetcher.state.committed = changed[fetcher.partition]
        self.stats.commits += 1

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.commit_interval_s)
            try:
                await self.commit()
            except Exception as exc:
                log.warning("offset commit failed (will retry): %s", exc)

    # --- rebalancing -------------------------------------------------------------------------

    def _request_rebalance(self) -> None:
        self._rebalance_needed.set()

    def _on_cluster_change(self, snapshot: ClusterSnapshot) -> None:
        # Only a change of the partition set moves partitions between members; a master or
        # slave coming or going is handled per fetch by choose_replica.
        for topic in self.subscriptions:
            partitions = tuple(snapshot.readable_partitions(topic))
            if partitions != self._last_partitions.get(topic):
                self._last_partitions[topic] = partitions
                self._request_rebalance()

    async def _rebalance_loop(self) -> None:
        while True:
            await self._rebalance_needed.wait()
            self._rebalance_needed.clear()
            try:
                complete = await self._rebalance()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("rebalance failed (%s); retrying", exc or type(exc).__name__)
                complete = False
            if not complete and not self._rebalance_needed.is_set():
                await asyncio.sleep(0.5)
                self._rebalance_needed.set()

    async def _rebalance(self) -> bool:
        """One pass; False when some partition could not be claimed yet."""
        self.stats.rebalances += 1
        await self.commit()
        complete = True
        for topic, subscription in self.subscriptions.items():
            partitions = self.cluster.snapshot.readable_partitions(topic)
            mine = set(await self.assignment.compute(topic, partitions))
            current = {p for (t, p) in self.fetchers if t == topic}
            for partition in sorted(current - mine):
                await self._drop(topic, partition)
            unclaimed = await claim_all(
                self.assignment, topic, sorted(mine - current), self._start_fetcher,
                timeout=self.config.claim_timeout_s, interrupted=self._rebalance_needed.is_set,
            )
            if unclaimed:
                complete = False
                log.info("group %s: %s still owned by others, will retry", self.config.group, [str(p) for p in unclaimed])
        return complete

    @property
    def _keeps_incarnations(self) -> bool:
        """A store the brokers cannot clean (file, SQL) keeps each offset's topic incarnation
        (offsets.py); the ZooKeeper offsets are deleted by the brokers instead."""
        return bool(getattr(self.offset_store, "keeps_incarnations", False))

    async def _incarnation(self, topic: str, partition: Partition) -> str | None:
        """The topic's current incarnation in the partition's broker group; None when unknown."""
        from ..zk.topic_config import read_group_topics

        try:
            group = await self.cluster.call(read_group_topics, self.cluster.zk, self.cluster.paths, partition.broker_id)
        except Exception as exc:  # ZooKeeper busy: unknown, so a stored offset is kept (offsets.applies)
            log.warning("group %s: cannot read the incarnation of %s-%s: %r", self.config.group, topic, partition, exc)
            return None
        return group.incarnations.get(topic, "") if topic in group.topics else None

    async def _load_position(self, topic: str, partition: Partition, incarnation: str | None) -> Position | None:
        if not self._keeps_incarnations:
            return await self.offset_store.load(self.config.group, topic, partition)
        # Invariant: never resume in one incarnation of a topic at an offset of another (offsets.applies).
        return await self.offset_store.load(self.config.group, topic, partition, incarnation=incarnation)  # type: ignore[call-arg]

    async def _start_fetcher(self, topic: str, partition: Partition) -> None:
        incarnation = await self._incarnation(topic, partition) if self._keeps_incarnations else None
        # MetaQ's setConsumeFromMaxOffset(always=True): stored offsets are ignored (never the retry topic's: they hold pending retries).
        ignore_stored = self.config.always_consume_from_max_offset and not self.subscriptions[topic].retries
        position = None if ignore_stored else await self._load_position(topic, partition, incarnation)
        fetcher = PartitionFetcher(self, self.subscriptions[topic], partition, position, incarnation)
        self.fetchers[(topic, partition)] = fetcher
        fetcher.start()
        log.info("group %s: consuming %s-%s from %s", self.config.group, topic, partition,
                 f"offset {position.offset}" if position else "its start position")

    async def _drop(self, topic: str, partition: Partition) -> None:
        fetcher = self.fetchers.pop((topic, partition), None)
        if fetcher is not None:
            await fetcher.stop()
            try:
                await self._commit_fetchers(topic, [fetcher])
            finally:
                await self.assignment.release(topic, partition)


async def _no_wait(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
