"""The synchronous facade: the asyncio client running on an event loop in a background thread.

Every blocking method hands a coroutine to that loop and waits for its result, so the
synchronous and the asyncio API behave the same. Listeners run in the loop's thread,
one message at a time per partition; a slow listener delays only the consumer's own
fetching (ZooKeeper's heartbeats run in kazoo's thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Coroutine, Iterable, TypeVar

from .config import ConsumerConfig, MetaClientConfig
from .consumer import AsyncMessageConsumer, ConsumerStats, Listener
from .message import Message, Partition, SendResult
from .offsets import OffsetStore
from .producer import AsyncMessageProducer
from .selector import PartitionSelector
from .session import AsyncMessageSessionFactory

T = TypeVar("T")


class LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str = "metaq-client") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking metaq call from inside a listener would deadlock; use the asyncio API there")
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
    """Blocking producer; see AsyncMessageProducer for the semantics."""

    def __init__(self, runner: LoopThread, producer: AsyncMessageProducer) -> None:
        self._runner = runner
        self.aio = producer

    def publish(self, topic: str) -> None:
        self._runner.run(self.aio.publish(topic))

    def send_message(self, message: Message, timeout: float | None = None) -> SendResult:
        return self._runner.run(self.aio.send_message(message, timeout))

    def send_message_async(
        self, message: Message, callback: Callable[[SendResult], object] | None = None
    ) -> "concurrent.futures.Future[SendResult]":
        """Returns at once; the future's result (and the callback's argument) is the SendResult.

        The callback runs in the client's event-loop thread.
        """
        future = self._runner.submit(self.aio.send_message(message))
        if callback is not None:
            future.add_done_callback(lambda f: None if f.cancelled() else callback(f.result()))
        return future

    def send_batch(self, messages: Iterable[Message], timeout: float | None = None) -> list[SendResult]:
        return self._runner.run(self.aio.send_batch(list(messages), timeout))

    def close(self) -> None:
        self._runner.run(self.aio.close())


class MessageConsumer:
    """Blocking consumer; see AsyncMessageConsumer. Listeners run in the client's loop thread."""

    def __init__(self, runner: LoopThread, consumer: AsyncMessageConsumer) -> None:
        self._runner = runner
        self.aio = consumer

    def subscribe(self, topic: str, max_size: int | None = None, listener: Listener | None = None) -> "MessageConsumer":
        self.aio.subscribe(topic, max_size, listener)
        return self

    def complete_subscribe(self) -> None:
        self._runner.run(self.aio.complete_subscribe())

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

    @property
    def stats(self) -> ConsumerStats:
        return self.aio.stats

    def shutdown(self) -> None:
        self._runner.run(self.aio.shutdown())


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

    def shutdown(self) -> None:
        try:
            self._runner.run(self.aio.shutdown(), timeout=60)
        finally:
            self._runner.stop()

    def __enter__(self) -> "MessageSessionFactory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
