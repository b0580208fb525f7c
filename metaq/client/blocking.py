"""The synchronous facade: the asyncio client running on an event loop in a background thread.

Every blocking method hands a coroutine to that loop and waits for its result, so the
synchronous and the asyncio API behave the same; the exception is the first attempt of a
blocking ``send_message``, made on the calling thread (see ``direct.py``). Listeners run
in the loop's thread, one message at a time per partition; a slow listener delays only
the consumer's own fetching (ZooKeeper's heartbeats run in kazoo's thread).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import inspect
import itertools
import operator
import threading
from typing import Any, Callable, Coroutine, Iterable, Iterator, TypeVar

from ..errors import MetaqError
from ..protocol.commands import OK, REASON_FIELD
from ..protocol.messages import PutRequest
from .accumulator import MAX_BATCH_COUNT, record_size
from .cluster import ClusterSnapshot
from .codec import encode_messages
from .config import ConsumerConfig, MetaClientConfig
from .consumer import AsyncMessageConsumer, ConsumerStats
from .message import Message, Partition, SendResult
from .offsets import OffsetStore
from .direct import DirectConnections, NoReply, NotSent
from .producer import AsyncMessageProducer, SendFailure, classify_reply, lane_key, stored_results, unknown_outcome
from .selector import PartitionSelector
from .session import AsyncMessageSessionFactory

T = TypeVar("T")

#: Plain put headers kept by a blocking producer (per topic, partition and message count).
_MAX_CACHED_PUT_HEADERS = 1024


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed (a dependency except on Windows): less overhead per callback."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str = "metaq-client") -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def in_loop_thread(self) -> bool:
        """Whether the caller is the loop thread itself (a listener, a result callback)."""
        return threading.current_thread() is self._thread

    def refuse_loop_thread(self) -> None:
        """A blocking call made in the loop thread (a listener, a callback) waits for that very
        thread: refused every time, also where its first attempt would not need the loop."""
        if self.in_loop_thread():
            raise RuntimeError("a blocking metaq call from inside a listener would deadlock; use the asyncio API there")

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        try:
            self.refuse_loop_thread()
            if self.loop.is_closed():
                raise MetaqError("this session factory is shut down: create a new one")
        except (RuntimeError, MetaqError):
            coro.close()  # never scheduled: no "coroutine was never awaited" warning
            raise
        return self.submit(coro).result(timeout)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()


class MessageProducer:
    """Blocking producer; see AsyncMessageProducer for the semantics. Also a context manager.

    ``send_message`` puts the message on the calling thread's own connection to the
    broker (``direct.py``) and waits for the reply there: one round trip, no hop to the
    client's loop thread. Only a failed first attempt, or a message that must stay
    behind ones queued by ``send_message_async``, goes through the loop thread.
    """

    def __init__(self, runner: LoopThread, producer: AsyncMessageProducer) -> None:
        self._runner = runner
        self.aio = producer
        config = producer.config
        self._direct = DirectConnections(config.connect_timeout_s, config.request_timeout_s)
        # A broker that left ZooKeeper ends the puts this producer's threads wait for (session.py's pool too).
        producer.cluster.add_departure_listener(self._abandon_direct)
        self._routes: dict[str, tuple[ClusterSnapshot, list[Partition]]] = {}  # topic -> writable partitions
        self._addresses: dict[str, tuple[str, int]] = {}
        self._put_headers: dict[tuple[str, int, int], dict[str, Any]] = {}  # see _plain_put_header
        # Bytes and messages handed to the loop by send_message_async and not yet answered:
        # bounded by buffer_memory, and while any are out send_message queues behind them.
        self._queued = threading.Condition()
        self._queued_bytes = 0
        self._queued_count = 0
        self._room_waiters = 0
        # Messages from send_message_async on their way to the loop thread, in call order.
        self._handoff: collections.deque[tuple[Message, int, concurrent.futures.Future[SendResult], Any]] = collections.deque()
        self._handoff_scheduled = False

    def offsets_for_times(self, topic: str, times: dict[Partition | str, int]) -> dict[Partition, int | None]:
        """See AsyncMessageProducer.offsets_for_times."""
        return self._runner.run(self.aio.offsets_for_times(topic, times))

    def publish(self, topic: str) -> None:
        self._runner.run(self.aio.publish(topic))

    def send_message(self, message: Message, timeout: float | None = None) -> SendResult:
        """Send one message and wait for its SendResult (never raises for a failed send)."""
        if timeout is None and not self._queued_count and not self.aio._closed:
            results = self._send_direct([message])
            if results is not None:
                return results[0]
        return self._runner.run(self.aio.send_message(message, timeout))

    def send_message_async(
        self, message: Message, callback: Callable[[SendResult], object] | None = None
    ) -> "concurrent.futures.Future[SendResult]":
        """Queue the message for a batched put; the future's result (and the callback's argument) is the SendResult.

        Waits (up to ``send_timeout_s``) while ``buffer_memory`` bytes are queued. The
        callback runs in the client's event-loop thread: keep it quick.
        """
        size = record_size(message)
        future: concurrent.futures.Future[SendResult] = concurrent.futures.Future()
        limit = self.aio.config.buffer_memory
        with self._queued:
            if self._queued_bytes + size > limit and self._queued_bytes:
                if self._runner.in_loop_thread():
                    # Room is made by the loop thread handing out results: waiting here would
                    # freeze the whole client for send_timeout_s and then fail anyway.
                    future.set_result(SendResult(False, error_message=f"producer buffer full ({limit} bytes buffered); "
                                                 "a callback or listener cannot wait for room", topic=message.topic))
                    return future
                self._room_waiters += 1
                try:
                    room = self._queued.wait_for(lambda: self._queued_bytes + size <= limit or not self._queued_bytes,
                                                 self.aio.config.send_timeout_s)
                finally:
                    self._room_waiters -= 1
                if not room:
                    future.set_result(SendResult(False, error_message=f"producer buffer full for {self.aio.config.send_timeout_s}s",
                                                 topic=message.topic))
                    return future
            self._queued_bytes += size
            self._queued_count += 1
        self._handoff.append((message, size, future, callback))
        # One wake-up of the loop thread per burst, not per message: it takes all there is.
        if not self._handoff_scheduled:
            self._handoff_scheduled = True
            self._runner.call_soon(self._take_handoff)
        return future

    def _take_handoff(self) -> None:
        # Cleared before draining: a message appended after the drain's last pop sees it
        # cleared and schedules another drain, so none is left behind.
        self._handoff_scheduled = False
        handoff = self._handoff
        while handoff:
            message, size, future, callback = handoff.popleft()
            self.aio.send_message_async(message, self._on_result(size, future, callback))

    def _on_result(self, size: int, future: "concurrent.futures.Future[SendResult]",
                   callback: Callable[[SendResult], object] | None) -> Callable[[SendResult], None]:
        def done(result: SendResult) -> None:
            with self._queued:
                self._queued_bytes -= size
                self._queued_count -= 1
                if self._room_waiters:
                    self._queued.notify_all()
            future.set_result(result)
            if callback is not None:
                callback(result)

        if callback is not None:
            done.__wrapped__ = callback  # type: ignore[attr-defined]  # a failing callback is logged under its own name
        return done

    def send_batch(self, messages: Iterable[Message], timeout: float | None = None) -> list[SendResult]:
        """Send a batch; one put on this thread's connection when it fits one (see send_message)."""
        messages = list(messages)
        if (timeout is None and 0 < len(messages) <= MAX_BATCH_COUNT and not self.aio._per_message
                and not self._queued_count and not self.aio._closed and all(m.topic == messages[0].topic for m in messages)):
            results = self._send_direct(messages)
            if results is not None:
                return results
        return self._runner.run(self.aio.send_batch(messages, timeout))

    def flush(self) -> None:
        """Send everything queued and wait until every message sent so far has its result."""
        self._runner.run(self.aio.flush())

    def close(self) -> None:
        """Send everything queued, wait for the results, refuse new sends."""
        try:
            self._runner.run(self.aio.close())
        finally:
            self.aio.cluster.remove_departure_listener(self._abandon_direct)
            self._direct.close_all()

    def _abandon_direct(self, url: str, reason: str) -> None:
        self._direct.abandon(*self.aio.master_address(url), reason)

    def __enter__(self) -> "MessageProducer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send_direct(self, messages: list[Message]) -> list[SendResult] | None:
        """The first attempt at one put of ``messages`` (one topic) on this thread's connection.

        The selector picks once, with the first message. None when the loop thread must do
        it all (topic not read yet, a broker being skipped, no partition, a failing selector).
        """
        self._runner.refuse_loop_thread()
        aio = self.aio
        credentials = aio.config.credentials
        if credentials.user is not None or credentials.tls_ca_file is not None:
            return None  # this thread's plain socket cannot log in or speak TLS: the pooled path does
        first = messages[0]
        topic = first.topic
        snapshot = aio.cluster.snapshot
        route = self._routes.get(topic)
        if route is None or route[0] is not snapshot:
            if topic not in snapshot.pub:
                return None
            route = self._routes[topic] = (snapshot, snapshot.writable_partitions(topic))
        if aio._suspects:
            return None
        try:
            partition = aio.selector.select(topic, route[1], first)
            host, port = self._address(snapshot.brokers[partition.broker_id].master)  # type: ignore[arg-type]
        except Exception:
            return None  # reported by the loop's path, which retries or explains
        body, starts = encode_messages(messages)
        numbered = None
        if aio.sequencer is not None:
            # Numbered here, on the caller's thread; None: the partition's previous batch is
            # still out, or there is no producer id yet (the loop's path gets one).
            numbered = aio.sequencer.try_begin(lane_key(topic, partition), len(messages))
            if numbered is None:
                return None
        config = aio.config
        if numbered is None:
            request = self._plain_put_header(topic, partition.partition, len(messages))
        else:
            request = PutRequest(topic=topic, partition=partition.partition, count=len(messages), **numbered.put_fields()).to_header()
        try:
            conn = self._direct.get(host, port)
            header = conn.request(request, body)
        except NotSent as exc:
            failure = SendFailure(f"broker {partition.broker_id} ({host}:{port}) unreachable: {exc}", retriable=True)
        except NoReply as exc:
            failure = unknown_outcome(f"outcome unknown: {exc} after sending to partition {partition}", config.retry_unknown_outcome)
        else:
            code = header.get("code")
            if code == OK:
                if numbered is not None:
                    aio.sequencer.end(numbered, True)  # type: ignore[union-attr]
                return stored_results(topic, partition, header, starts, 1)
            failure = classify_reply(int(code or 500), f"{code} {header.get('msg', '')} (partition {partition})",  # type: ignore[assignment]
                                     config.retry_unknown_outcome, reason=header.get(REASON_FIELD))
            failure.renumber = "expected_seq" in header
        if numbered is not None:  # retried (or ended) with the same numbers in the loop thread
            return self._runner.run(aio.send_numbered(topic, partition, messages, body, starts, None, numbered, failure))
        if not failure.retriable:
            return aio._not_stored(topic, partition, messages, failure, 1)
        return self._runner.run(aio.retry_chunk(topic, partition, messages, body, starts, None, failure))

    def _plain_put_header(self, topic: str, partition: int, count: int) -> dict[str, Any]:
        """The header of a put that is not numbered: the same for every such put of ``count``
        messages to a partition, so built once (building it cost a quarter of the client's
        Python per blocking send). Shared: DirectConnection.request copies it, never changes it."""
        key = (topic, partition, count)
        header = self._put_headers.get(key)
        if header is None:
            if len(self._put_headers) >= _MAX_CACHED_PUT_HEADERS:
                self._put_headers.clear()
            header = self._put_headers[key] = PutRequest(topic=topic, partition=partition, count=count).to_header()
        return header

    def _address(self, url: str) -> tuple[str, int]:
        """Where to connect for a master registered as ``url`` (parsed once per url)."""
        address = self._addresses.get(url)
        if address is None:
            address = self._addresses[url] = self.aio.master_address(url)
        return address


class MessageConsumer:
    """Blocking consumer; see AsyncMessageConsumer. Listeners run in the client's loop thread.

    Subscribed without a listener, it is iterated on the caller's thread::

        with factory.create_consumer(ConsumerConfig(group="g")).subscribe("orders") as consumer:
            for message in consumer:
                handle(message)

    Messages cross from the loop thread one fetch at a time, not one by one.
    """

    def __init__(self, runner: LoopThread, consumer: AsyncMessageConsumer) -> None:
        self._runner = runner
        self.aio = consumer
        self._batch: list[Message] = []  # the fetch being iterated, and what is left of it
        self._rest: Iterator[Message] | None = None

    def subscribe(self, topic: str, *args: Any, **kwargs: Any) -> "MessageConsumer":
        """Receive ``topic``: the arguments and rules of ``AsyncMessageConsumer.subscribe``."""
        self.aio.subscribe(topic, *args, **kwargs)
        return self

    def complete_subscribe(self) -> None:
        self._runner.run(self.aio.complete_subscribe())

    def __enter__(self) -> "MessageConsumer":
        self.complete_subscribe()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __iter__(self) -> Iterator[Message]:
        """The messages of topics subscribed without a listener, as they come (see AsyncMessageConsumer).

        Ends at shutdown or after ``iterator_timeout_s`` without a message. Breaking out
        and iterating again goes on where it stopped.
        """
        # chain's next() takes each message from the fetch's list iterator in C; a generator
        # resumed per message (``yield from``) cost the caller's thread more than the loop
        # thread's delivery of the same message to a batch listener.
        return itertools.chain.from_iterable(self._fetches())

    def _fetches(self) -> Iterator[Iterator[Message]]:
        """The iterator of each fetch's messages in turn: the rest of the one being iterated first."""
        while True:
            if self._rest is not None:
                yield self._rest
            batch = self._runner.run(self.aio.getmany(self.aio.config.iterator_timeout_s))
            if not batch:
                self._rest = None
                return
            self._batch, self._rest = batch, iter(batch)

    def getmany(self, timeout_s: float | None = None) -> list[Message]:
        """The messages of the next fetch; the previous ones count as consumed. [] after ``timeout_s`` or at shutdown."""
        if self._rest is not None:
            rest, self._rest = list(self._rest), None
            if rest:
                return rest  # what an interrupted iteration had not handed out yet
        return self._runner.run(self.aio.getmany(timeout_s))

    def commit(self) -> None:
        self._runner.run(self.aio.commit())

    def pause(self) -> None:
        self._runner.call_soon(self.aio.pause)

    def resume(self) -> None:
        self._runner.call_soon(self.aio.resume)

    def owned_partitions(self, topic: str | None = None) -> list[Partition]:
        async def get() -> list[Partition]:
            return self.aio.owned_partitions(topic)

        return self._runner.run(get())

    def offsets_for_times(self, topic: str, times: dict[Partition | str, int]) -> dict[Partition, int | None]:
        """See AsyncMessageConsumer.offsets_for_times."""
        return self._runner.run(self.aio.offsets_for_times(topic, times))

    def seek_to_time(self, time_ms: int, topic: str | None = None) -> dict[tuple[str, Partition], int]:
        """See AsyncMessageConsumer.seek_to_time."""
        return self._runner.run(self.aio.seek_to_time(time_ms, topic))

    @property
    def stats(self) -> ConsumerStats:
        return self.aio.stats

    def shutdown(self) -> None:
        """Stop; a fetch being iterated counts as consumed up to the last message handed out."""
        async def stop() -> None:
            if self._rest is not None:
                self.aio._current_index = len(self._batch) - operator.length_hint(self._rest)
            await self.aio.shutdown()

        self._runner.run(stop())


class BlockingCalls:
    """A blocking face for an asyncio object: its coroutine methods run on the loop thread."""

    def __init__(self, runner: LoopThread, aio: Any) -> None:
        self._runner = runner
        self.aio = aio

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.aio, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._runner.run(attr(*args, **kwargs))

        return call


class TransactionalProducer(BlockingCalls):
    """Blocking AsyncTransactionalProducer: begin_transaction, send_message, send_batch, commit, rollback."""

    def __enter__(self) -> "TransactionalProducer":
        return self

    def __exit__(self, *exc: object) -> None:
        self._runner.run(self.aio.close())


class XAProducer(BlockingCalls):
    """Blocking AsyncXAProducer; ``xa_resource()`` is a blocking XA resource."""

    def xa_resource(self) -> BlockingCalls:
        return BlockingCalls(self._runner, self.aio.xa_resource())


class MessageSessionFactory:
    """MetaQ's MessageSessionFactory, blocking::

        with MessageSessionFactory(MetaClientConfig(zk_connect="127.0.0.1:2181")) as factory:
            producer = factory.create_producer()
            producer.publish("t")
            print(producer.send_message(Message("t", b"hello")))
    """

    def __init__(self, config: MetaClientConfig | None = None, **overrides: Any) -> None:
        self._runner = LoopThread()
        config = config or MetaClientConfig(**overrides)

        async def start() -> AsyncMessageSessionFactory:
            return await AsyncMessageSessionFactory(config).start()

        try:
            self.aio = self._runner.run(start())
        except BaseException:
            self._runner.stop()
            raise

    @property
    def config(self) -> MetaClientConfig:
        return self.aio.config

    def create_producer(self, selector: PartitionSelector | None = None) -> MessageProducer:
        return MessageProducer(self._runner, self.aio.create_producer(selector))

    def create_consumer(self, config: ConsumerConfig, offset_store: OffsetStore | None = None) -> MessageConsumer:
        return MessageConsumer(self._runner, self.aio.create_consumer(config, offset_store))

    def create_transactional_producer(self, selector: PartitionSelector | None = None, *,
                                      transactional_id: str | None = None,
                                      broker_id: int | None = None) -> TransactionalProducer:
        return TransactionalProducer(self._runner, self.aio.create_transactional_producer(
            selector, transactional_id=transactional_id, broker_id=broker_id))

    def create_xa_producer(self, broker_id: int | None = None, selector: PartitionSelector | None = None, *,
                           transactional_id: str | None = None) -> XAProducer:
        return XAProducer(self._runner, self.aio.create_xa_producer(broker_id, selector, transactional_id=transactional_id))

    def shutdown(self) -> None:
        try:
            self._runner.run(self.aio.shutdown(), timeout=60)
        finally:
            self._runner.stop()

    def __enter__(self) -> "MessageSessionFactory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
