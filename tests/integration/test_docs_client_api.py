"""docs/client.md's Python API promises, checked against a real broker and ZooKeeper (one
broker for the module)."""

from __future__ import annotations

import asyncio
import time
import uuid
import warnings
from typing import Iterator

import pytest

from metaq.client import (AsyncMessageSessionFactory, ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig,
                          MetaqError)
from metaq.tools.launcher import BrokerFactory, BrokerProcess
from tests.harness import wait_until

TOPIC = "orders"


@pytest.fixture(scope="module")
def cluster(zk, tmp_path_factory) -> Iterator[tuple[BrokerProcess, str]]:
    root = f"/meta-{uuid.uuid4().hex[:12]}"
    factory = BrokerFactory(tmp_path_factory.mktemp("docs-client"), zk.connect_string, root)
    try:
        yield factory(0, {TOPIC: 2}, system={"unflushThreshold": 0}), root
    finally:
        factory.stop_all()


@pytest.fixture
def factory(zk, cluster) -> Iterator[MessageSessionFactory]:
    with MessageSessionFactory(MetaClientConfig(zk_connect=zk.connect_string, zk_root=cluster[1],
                                                zk_session_timeout_ms=4000)) as f:
        yield f


def test_a_blocking_send_from_inside_a_listener_raises_every_time_and_stores_nothing(factory, tmp_path) -> None:
    """'a blocking client call from inside one raises, as it would deadlock': also when the
    producer already knows the topic (its first attempt would go on the caller's own socket)."""
    producer = factory.create_producer()
    assert producer.send_message(Message(TOPIC, b"trigger")).success  # the producer has read the topic
    outcomes: list[str] = []

    def listener(message: Message) -> None:
        try:
            result = producer.send_message(Message(TOPIC, b"from-listener"))
            outcomes.append(f"sent: {result.success}")
        except RuntimeError as exc:
            outcomes.append(str(exc))

    consumer = factory.create_consumer(ConsumerConfig(group="listener-sends", fetch_wait_ms=200,
                                                      recover_dir=str(tmp_path / "recover")))
    consumer.subscribe(TOPIC, listener=listener)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no coroutine left un-awaited
        consumer.complete_subscribe()
        wait_until(lambda: outcomes, 15, message="the listener to run")
        consumer.shutdown()
    assert outcomes and all("would deadlock" in outcome for outcome in outcomes), outcomes
    reader = factory.create_consumer(ConsumerConfig(group="check", iterator_timeout_s=1.5,
                                                    recover_dir=str(tmp_path / "recover")))
    with reader.subscribe(TOPIC) as iterated:
        assert [m.data for m in iterated] == [b"trigger"]
    producer.close()


def test_buffer_memory_bounds_the_sends_made_before_the_topic_is_known(zk, cluster) -> None:
    """'buffer_memory: bytes queued or in flight at most: then send_message_async (asyncio)
    fails the message at once ("producer buffer full")', also for the first burst of a new
    producer, whose sends wait for the topic's masters to be read."""
    config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=cluster[1], zk_session_timeout_ms=4000,
                              buffer_memory=2000, batch_size=1000)

    async def burst() -> list:
        async with AsyncMessageSessionFactory(config) as factory:
            async with factory.create_producer() as producer:
                futures = [producer.send_message_async(Message(TOPIC, b"x" * 500)) for _ in range(10)]
                assert producer.accumulator.buffered <= config.buffer_memory
                await producer.flush()
                assert producer.accumulator.buffered == 0
                return [future.result() for future in futures]

    results = asyncio.run(burst())
    stored = [r for r in results if r.success]
    refused = [r for r in results if not r.success]
    assert 1 <= len(stored) <= 2000 // 500 and len(stored) + len(refused) == 10, results
    assert all(r.error_message.startswith("producer buffer full") for r in refused), refused


@pytest.mark.parametrize(("topic", "max_size", "named"), [
    ("", None, "topic name is empty"),
    ("a/b", None, "may only use letters, digits"),
    (None, None, "topic name must be a string"),
    (TOPIC, 0, "max_size must be an int >= 1"),
    (TOPIC, -5, "max_size must be an int >= 1"),
])
def test_subscribe_refuses_a_bad_topic_or_max_size_naming_it(factory, tmp_path, topic, max_size, named) -> None:
    consumer = factory.create_consumer(ConsumerConfig(group="bad-subscribe", recover_dir=str(tmp_path / "recover")))
    with pytest.raises(ValueError, match=named):
        consumer.subscribe(topic, max_size, print)
    consumer.shutdown()


def test_a_shut_down_factory_says_so(zk, cluster) -> None:
    config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=cluster[1], zk_session_timeout_ms=4000)
    factory = MessageSessionFactory(config)
    producer = factory.create_producer()
    factory.shutdown()
    with pytest.raises(MetaqError, match="this session factory is shut down: create a new one"):
        factory.create_producer()
    with pytest.raises(MetaqError, match="this session factory is shut down"):
        producer.send_message(Message(TOPIC, b"late"))  # was: RuntimeError('Event loop is closed')

    async def asyncio_side() -> None:
        async with AsyncMessageSessionFactory(config) as aio_factory:
            pass
        with pytest.raises(MetaqError, match="this session factory is shut down"):
            aio_factory.create_consumer(ConsumerConfig(group="late"))

    asyncio.run(asyncio_side())


def test_read_from_slave_without_a_slave_says_so_once_per_partition(factory, tmp_path, caplog) -> None:
    """docs/client.md, "Reading from replicas": `slave` reads slaves only; with none registered
    the consumer waits, and says why instead of staying silent."""
    consumer = factory.create_consumer(ConsumerConfig(group="slave-only", read_from="slave", fetch_retry_max_s=0.2,
                                                      recover_dir=str(tmp_path / "recover")))
    consumer.subscribe(TOPIC, listener=print)
    with caplog.at_level("DEBUG", logger="metaq.client.consumer"):
        consumer.complete_subscribe()
        # Each fetch attempt logs its failure at debug level: wait for several per partition.
        wait_until(lambda: len([r for r in caplog.records if "no slave replica of broker 0" in r.getMessage()]) >= 6, 15,
                   message="several fetch attempts without a slave")
        consumer.shutdown()
    warnings_ = [r.getMessage() for r in caplog.records if "no slave of broker 0" in r.getMessage()]
    assert sorted(w.split(":")[0] for w in warnings_) == [f"{TOPIC}-0-0", f"{TOPIC}-0-1"], warnings_
    assert "read_from='prefer-slave' reads the master meanwhile" in warnings_[0]


def test_a_callback_sending_into_a_full_buffer_fails_at_once_instead_of_freezing_the_client(zk, cluster) -> None:
    """The blocking send_message_async waits for room, but not in the client's loop thread
    (a result callback): room is made there, so waiting would freeze every producer and
    consumer of the factory for send_timeout_s."""
    config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=cluster[1], zk_session_timeout_ms=4000,
                              buffer_memory=2000, batch_size=1000, send_timeout_s=3)
    with MessageSessionFactory(config) as factory, factory.create_producer() as producer:
        assert producer.send_message(Message(TOPIC, b"warm-up")).success
        refilled: list = []
        took: list[float] = []

        def refill(result) -> None:
            started = time.monotonic()
            refilled.extend(producer.send_message_async(Message(TOPIC, b"y" * 500)) for _ in range(10))
            took.append(time.monotonic() - started)

        producer.send_message_async(Message(TOPIC, b"first"), callback=refill).result(10)
        wait_until(lambda: took, 10, message="the callback to return")
        producer.flush()
        results = [future.result(10) for future in refilled]
    assert took[0] < config.send_timeout_s / 2, took  # no wait for room inside the loop thread
    refused = [r for r in results if not r.success]
    assert refused and all("a callback or listener cannot wait for room" in r.error_message for r in refused), results
    assert any(r.success for r in results)


def test_a_failing_send_callback_is_logged_under_its_own_name_and_sending_goes_on(factory, caplog) -> None:
    """docs/client.md: a callback=... runs in the client's loop thread; one that raises is
    logged (naming the application's function, not the client's wrapper) and changes nothing else."""
    def my_failing_callback(result) -> None:
        raise RuntimeError("boom")

    with factory.create_producer() as producer, caplog.at_level("ERROR", logger="metaq.client.accumulator"):
        futures = [producer.send_message_async(Message(TOPIC, b"cb"), callback=my_failing_callback) for _ in range(3)]
        producer.flush()
        assert all(future.result(10).success for future in futures)
        assert producer.send_message_async(Message(TOPIC, b"after")).result(10).success
    failures = [r.getMessage() for r in caplog.records if r.getMessage().startswith("send callback")]
    assert len(failures) == 3 and all("my_failing_callback" in f for f in failures), failures
