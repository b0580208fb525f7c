"""The client against real ZooKeeper and real broker processes: produce, consume, offsets,
recover store, broadcast, consume-from-end."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from metaq.client import ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig, Partition
from metaq.zk.paths import ZkPaths, parse_offset
from tests.harness import wait_until

# Group commit: acks wait for fsync, and consumers see a message as soon as it is acked.
SYSTEM = {"unflushThreshold": 0}
TOPIC = "orders"


@pytest.fixture
def two_brokers(broker_factory):
    return [broker_factory(b, {TOPIC: 2}, system=SYSTEM) for b in (0, 1)]


@pytest.fixture
def factory(zk, zk_root):
    with MessageSessionFactory(MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000)) as f:
        yield f


def consumer_config(tmp_path, **overrides: Any) -> ConsumerConfig:
    settings = dict(group="g", commit_interval_s=0.5, recover_dir=str(tmp_path / "recover"),
                    fetch_wait_ms=200, recover_interval_s=0.2)
    settings.update(overrides)
    return ConsumerConfig(**settings)


class Collector:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    def __call__(self, message: Message) -> None:
        self.messages.append(message)

    def data(self) -> list[bytes]:
        return [m.data for m in self.messages]

    def wait_for(self, count: int, timeout: float = 15.0) -> None:
        wait_until(lambda: len(self.messages) >= count, timeout, message=f"{count} messages (have {len(self.messages)})")


def test_producer_spreads_over_all_partitions_of_both_brokers(two_brokers, factory, tmp_path) -> None:
    producer = factory.create_producer()
    producer.publish(TOPIC)
    results = [producer.send_message(Message(TOPIC, f"m{i}".encode(), attribute="a")) for i in range(20)]
    # Round robin moves on per send call: each batch goes to the next partition in one put.
    for k in range(4):
        batch = producer.send_batch([Message(TOPIC, f"b{i}".encode()) for i in range(k * 10, k * 10 + 10)])
        assert len({str(r.partition) for r in batch}) == 1
        results += batch
    assert all(r.success for r in results), [r.error_message for r in results if not r.success]
    assert Counter(str(r.partition) for r in results) == {"0-0": 15, "0-1": 15, "1-0": 15, "1-1": 15}

    collector = Collector()
    consumer = factory.create_consumer(consumer_config(tmp_path))
    consumer.subscribe(TOPIC, 64 * 1024, collector)
    consumer.complete_subscribe()
    collector.wait_for(60)
    time.sleep(0.3)
    assert Counter(collector.data()) == Counter([f"m{i}".encode() for i in range(20)] + [f"b{i}".encode() for i in range(40)])
    # What the consumer saw is exactly what the producer was told: partition, offset, id.
    sent = {(str(r.partition), r.offset): r.msg_id for r in results}
    got = {(str(m.partition), m.offset): m.id for m in collector.messages}
    assert got == sent
    assert all(m.attribute == "a" for m in collector.messages if m.data.startswith(b"m"))
    assert consumer.owned_partitions(TOPIC) == [Partition(0, 0), Partition(0, 1), Partition(1, 0), Partition(1, 1)]


def test_offsets_survive_a_consumer_restart(two_brokers, factory, zk_client, zk_root, tmp_path) -> None:
    producer = factory.create_producer()
    for k in range(3):  # three batches: three partitions get messages, one stays empty
        assert all(r.success for r in producer.send_batch([Message(TOPIC, f"first{i}".encode()) for i in range(k * 10, k * 10 + 10)]))
    first = Collector()
    consumer = factory.create_consumer(consumer_config(tmp_path))
    consumer.subscribe(TOPIC, None, first)
    consumer.complete_subscribe()
    first.wait_for(30)
    consumer.shutdown()  # commits
    paths = ZkPaths(zk_root)
    stored = {p: parse_offset(zk_client.get(paths.offset("g", TOPIC, p))[0]) for p in ("0-0", "0-1", "1-0", "1-1")}
    ends = {}
    for m in first.messages:
        ends[str(m.partition)] = max(ends.get(str(m.partition), (0, 0)), (m.offset, m.id))
    assert len(ends) == 3
    for name, (msg_id, offset) in stored.items():
        if name in ends:  # "{msgId}-{offset}": the last message's id, the offset after it
            assert msg_id == ends[name][1] and offset > ends[name][0]
        else:  # the start position, committed as soon as the partition was taken
            assert (msg_id, offset) == (-1, 0)

    assert all(r.success for r in producer.send_batch([Message(TOPIC, f"second{i}".encode()) for i in range(20)]))
    second = Collector()
    again = factory.create_consumer(consumer_config(tmp_path))
    again.subscribe(TOPIC, None, second)
    again.complete_subscribe()
    second.wait_for(20)
    time.sleep(0.5)
    assert sorted(second.data()) == sorted(f"second{i}".encode() for i in range(20))


def test_consume_from_the_end_skips_earlier_messages(two_brokers, factory, tmp_path) -> None:
    producer = factory.create_producer()
    assert all(r.success for r in producer.send_batch([Message(TOPIC, b"old") for _ in range(10)]))
    collector = Collector()
    consumer = factory.create_consumer(consumer_config(tmp_path, consume_from_max_offset=True))
    consumer.subscribe(TOPIC, None, collector)
    consumer.complete_subscribe()
    wait_until(lambda: consumer.stats.commits >= 1, 10, message="start positions committed")
    assert all(r.success for r in producer.send_batch([Message(TOPIC, b"new") for _ in range(10)]))
    collector.wait_for(10)
    time.sleep(0.3)
    assert collector.data() == [b"new"] * 10


def test_failing_listener_message_goes_to_recover_store_and_is_redelivered(two_brokers, factory, tmp_path) -> None:
    calls: Counter[bytes] = Counter()
    healed = False
    delivered: list[bytes] = []

    def listener(message: Message) -> None:
        calls[message.data] += 1
        if message.data == b"poison" and not healed:
            raise RuntimeError("cannot handle poison yet")
        delivered.append(message.data)

    config = consumer_config(tmp_path, max_retries=3, failure_store="local")
    consumer = factory.create_consumer(config)
    consumer.subscribe(TOPIC, None, listener)
    consumer.complete_subscribe()
    producer = factory.create_producer()
    assert all(r.success for r in producer.send_batch([Message(TOPIC, d) for d in (b"a", b"poison", b"b", b"c", b"d")]))
    # The poison message is parked after 3 tries; the others flow on.
    wait_until(lambda: consumer.stats.recovered == 1 and len(delivered) == 4, 10, message="poison parked, others delivered")
    assert calls[b"poison"] >= 3 and sorted(delivered) == [b"a", b"b", b"c", b"d"]
    recover_dir = config.resolved_recover_dir()
    assert consumer.aio.recover_store.count(TOPIC) == 1
    assert len(list((recover_dir / TOPIC).glob("*.rec"))) == 1
    healed = True
    wait_until(lambda: b"poison" in delivered, 10, message="poison redelivered from the recover store")
    wait_until(lambda: consumer.aio.recover_store.count(TOPIC) == 0, 5, message="recover store emptied")
    assert consumer.stats.redelivered == 1


def test_broadcast_delivers_every_message_to_every_member(two_brokers, factory, zk_client, zk_root, tmp_path) -> None:
    members = []
    for k in range(2):
        collector = Collector()
        consumer = factory.create_consumer(
            consumer_config(tmp_path, broadcast=True, offset_store_path=str(tmp_path / f"member{k}.json"))
        )
        consumer.subscribe(TOPIC, None, collector)
        consumer.complete_subscribe()
        members.append((consumer, collector))
    producer = factory.create_producer()
    expected = [f"news{i}".encode() for i in range(25)]
    assert all(r.success for r in producer.send_batch([Message(TOPIC, d) for d in expected]))
    for consumer, collector in members:
        collector.wait_for(25)
    time.sleep(0.3)
    for consumer, collector in members:
        assert sorted(collector.data()) == sorted(expected)
        assert len(consumer.owned_partitions()) == 4
        consumer.shutdown()
    # Offsets are local, one file per member; nothing in ZooKeeper's group nodes.
    for k in range(2):
        stored = json.loads((tmp_path / f"member{k}.json").read_text())["g"][TOPIC]
        # Beside the offsets, the topic incarnation each was committed in ("": a server.ini topic).
        incarnations = stored.pop("incarnations")
        assert set(stored) == set(incarnations) == {"0-0", "0-1", "1-0", "1-1"}
    assert not zk_client.exists(ZkPaths(zk_root).offsets("g", TOPIC))
    assert not zk_client.exists(ZkPaths(zk_root).owners("g", TOPIC))


def test_a_plain_listener_returning_a_coroutine_is_awaited(two_brokers, zk, zk_root, tmp_path) -> None:
    # e.g. ``lambda m: queue.put(m)``: not a coroutine function, but what it returns must
    # run before the message counts as delivered and its offset moves on.
    import asyncio

    from metaq.client import AsyncMessageSessionFactory

    async def scenario() -> list[bytes]:
        config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000)
        async with AsyncMessageSessionFactory(config) as factory:
            producer = factory.create_producer()
            results = await producer.send_batch([Message(TOPIC, f"q{i}".encode()) for i in range(6)])
            assert all(r.success for r in results)
            queue: asyncio.Queue[Message] = asyncio.Queue()
            consumer = factory.create_consumer(consumer_config(tmp_path))
            consumer.subscribe(TOPIC, None, lambda m: queue.put(m))
            await consumer.complete_subscribe()
            got = [await asyncio.wait_for(queue.get(), 15) for _ in range(6)]
            assert consumer.stats.delivered >= 6
            await consumer.shutdown()
            return sorted(m.data for m in got)

    assert asyncio.run(scenario()) == sorted(f"q{i}".encode() for i in range(6))


def test_iterating_a_consumer_resumes_where_it_stopped(two_brokers, factory, tmp_path) -> None:
    """``for message in consumer``: an interrupted iteration goes on with the next message;
    at shutdown what was handed out counts as consumed, and a new member starts after it."""
    producer = factory.create_producer()
    results = producer.send_batch([Message(TOPIC, f"it{i:02d}".encode()) for i in range(40)])
    assert all(results) and len({r.partition for r in results}) == 1  # one put: one partition, in order
    config = consumer_config(tmp_path, iterator_timeout_s=3)
    seen: list[bytes] = []
    with factory.create_consumer(config).subscribe(TOPIC) as consumer:
        for message in consumer:
            seen.append(message.data)
            if len(seen) == 15:
                break
        for message in consumer:  # goes on where the first loop stopped
            seen.append(message.data)
            if len(seen) == 25:
                break
    assert seen == [f"it{i:02d}".encode() for i in range(25)]
    with factory.create_consumer(config).subscribe(TOPIC) as again:
        rest = [m.data for m in again]  # ends after iterator_timeout_s without a message
    assert rest == [f"it{i:02d}".encode() for i in range(25, 40)]


def test_batch_listener_gets_whole_fetches_and_retries_them(two_brokers, factory, tmp_path) -> None:
    producer = factory.create_producer()
    assert all(producer.send_batch([Message(TOPIC, f"b{i}".encode()) for i in range(30)]))
    batches: list[list[bytes]] = []
    failures = 0

    def on_batch(messages: list[Message]) -> None:
        nonlocal failures
        if failures < 2:  # the first two calls fail: the same batch comes again
            failures += 1
            raise RuntimeError("not yet")
        batches.append([m.data for m in messages])

    # failure_store="local": a failed batch is called again at once, as a whole (MetaQ's way).
    consumer = factory.create_consumer(consumer_config(tmp_path, failure_store="local"))
    consumer.subscribe(TOPIC, batch_listener=on_batch)
    consumer.complete_subscribe()
    wait_until(lambda: sum(map(len, batches)) >= 30, 15, message="30 messages in batches")
    consumer.shutdown()
    assert len(batches) == 1 and batches[0] == [f"b{i}".encode() for i in range(30)]
    assert consumer.stats.listener_failures == 2 and consumer.stats.delivered == 30


def test_async_iteration_and_getmany(two_brokers, zk, zk_root, tmp_path) -> None:
    import asyncio

    from metaq.client import AsyncMessageSessionFactory

    async def scenario() -> list[bytes]:
        config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000)
        async with AsyncMessageSessionFactory(config) as factory:
            async with factory.create_producer() as producer:
                futures = [producer.send_message_async(Message(TOPIC, f"a{i:02d}".encode())) for i in range(20)]
            assert all(f.result().success for f in futures)
            got = []
            async with factory.create_consumer(consumer_config(tmp_path, iterator_timeout_s=2)).subscribe(TOPIC) as consumer:
                got += [m.data for m in await consumer.getmany(timeout_s=10)]
                async for message in consumer:
                    got.append(message.data)
            return got

    got = asyncio.run(scenario())
    assert sorted(got) == [f"a{i:02d}".encode() for i in range(20)]


def test_a_window_refilled_from_result_callbacks_keeps_a_put_on_the_wire_while_they_run(broker_factory, zk, zk_root) -> None:
    # 1,000 sends outstanding, each result's callback sending the next (bench/vs_redis.py's
    # per-message async workload): the callbacks of one put run while the partition's next
    # put is on the wire, not between one put and the next; the partition keeps send order;
    # and the client frees each message and future as its result is handed out, so the
    # cyclic garbage collector (set off by allocations outnumbering frees) seldom runs.
    import asyncio
    import gc

    from metaq.client import AsyncMessageSessionFactory

    topic, partition, total, window = "window", Partition(0, 0), 20_000, 1000
    broker_factory(0, {topic: 1}, system=SYSTEM)

    async def scenario() -> tuple[list[int], list[str], int, int]:
        config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000)
        async with AsyncMessageSessionFactory(config) as factory:
            async with factory.create_producer() as producer:
                await producer.publish(topic)
                queue = producer.accumulator.queue(topic, partition)
                offsets = [-1] * total  # ints, not the results: the test itself must not hold objects the GC counts
                failures: list[str] = []
                done = asyncio.get_running_loop().create_future()
                sent = answered = overlapped = 0

                def on_result(result: Any) -> None:
                    nonlocal answered, overlapped
                    if result.success and result.partition == partition:
                        offsets[answered] = result.offset  # results come in send order (checked below)
                    else:
                        failures.append(f"{result.partition}: {result.error_message}")
                    answered += 1
                    overlapped += queue.in_flight > 0  # a put of this partition on the wire now
                    if sent < total:
                        send_next()
                    elif answered == total:
                        done.set_result(None)

                def send_next() -> None:
                    nonlocal sent
                    sent += 1
                    producer.send_message_async(Message(topic, b"m"), on_result)

                collections = [0]

                def count(phase: str, info: dict) -> None:
                    collections[0] += phase == "start"

                gc.callbacks.append(count)
                try:
                    for _ in range(window):
                        send_next()
                    await asyncio.wait_for(done, 60)
                finally:
                    gc.callbacks.remove(count)
                return offsets, failures, overlapped, collections[0]

    offsets, failures, overlapped, collections = asyncio.run(scenario())
    assert not failures, failures[:3]
    assert offsets == sorted(set(offsets))  # stored in send order, each once
    # Deterministic, not timing: after the first put's reply every callback but the first
    # half of one put's runs with the next put in flight (before: none did).
    assert overlapped >= total // 2, f"{overlapped} of {total} callbacks ran with a put in flight"
    # Before: ~4 objects per message stayed alive until its put's last callback, and this
    # test saw 82 collections; now ~5.
    assert collections <= 40, f"{collections} garbage collections for {total} messages"
