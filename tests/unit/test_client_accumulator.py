"""The producer's accumulator: linger, size-triggered puts, backpressure, order across retries, close().

Against the fake cluster and connections of test_client_producer; puts can be held open
to see what the accumulator does while they are in flight.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from metaq.client.codec import encode_messages
from metaq.client.accumulator import Accumulator, AccumulatorConfig, record_size
from metaq.client.message import Message, Partition, SendResult
from metaq.client.producer import AsyncMessageProducer
from metaq.client.selector import KeyHashPartitionSelector
from tests.unit.test_client_producer import FakeCluster, FakePool, producer


class HeldPool(FakePool):
    """A FakePool whose puts are answered only when the test releases them."""

    def __init__(self, scripts: dict[int, list[Any]]) -> None:
        super().__init__(scripts)
        self.held: list[tuple[asyncio.Future, asyncio.Future]] = []  # (what the producer awaits, the real reply)
        self.bodies: list[bytes] = []
        for conn in self.conns.values():
            original = conn.send

            def held_send(header, body, original=original):
                self.bodies.append(body)
                reply = original(header, body)
                outer = asyncio.get_running_loop().create_future()
                self.held.append((outer, reply))
                return outer

            conn.send = held_send

    def release_all(self) -> int:
        released = 0
        for outer, reply in self.held:
            if not outer.done():
                if reply.exception() is not None:
                    outer.set_exception(reply.exception())
                else:
                    outer.set_result(reply.result())
                released += 1
        return released

    @property
    def open_puts(self) -> int:
        return sum(not outer.done() for outer, _ in self.held)


async def until(predicate, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


def test_linger_gathers_messages_into_one_put_after_the_linger_time() -> None:
    pool = FakePool({0: [], 1: []})
    p = producer(pool, linger_ms=80)

    async def scenario():
        started = time.monotonic()
        futures = [p.send_message_async(Message("t", b"x")) for _ in range(5)]
        await asyncio.sleep(0.03)
        assert pool.log == []  # still lingering
        results = await asyncio.gather(*futures)
        return results, time.monotonic() - started

    results, elapsed = asyncio.run(scenario())
    assert all(r.success for r in results) and elapsed >= 0.075
    assert len(pool.log) == 1  # one put for all five (one partition: sticky)
    assert [r.offset for r in results] == [i * record_size(Message("t", b"x")) - i * 4 for i in range(5)]


def test_a_full_batch_goes_out_without_waiting_for_the_linger() -> None:
    pool = FakePool({0: [], 1: []})
    p = producer(pool, linger_ms=10_000, batch_size=3 * SIZE)

    async def scenario():
        futures = [p.send_message_async(Message("t", b"x" * 100)) for _ in range(3)]
        return await asyncio.wait_for(asyncio.gather(*futures), 2)

    results = asyncio.run(scenario())
    assert all(r.success for r in results) and len(pool.log) == 1


SIZE = record_size(Message("t", b"x" * 100))


def one_partition(**config: Any) -> tuple[HeldPool, AsyncMessageProducer]:
    """A producer of one broker with one partition, whose puts wait for ``release_all``."""
    pool = HeldPool({0: []})
    return pool, producer(pool, FakeCluster(brokers=1, parts=1), **config)


def test_a_put_carries_at_most_batch_size_bytes() -> None:
    pool, p = one_partition(batch_size=4 * SIZE)

    async def scenario():
        futures = [p.send_message_async(Message("t", b"x" * 100)) for _ in range(10)]
        await until(lambda: pool.open_puts == 1)
        while pool.release_all():
            await asyncio.sleep(0.01)
        return await asyncio.gather(*futures)

    results = asyncio.run(scenario())
    assert all(r.success for r in results)
    assert [len(b) // 120 for b in pool.bodies] == [4, 4, 2]


def test_backpressure_fails_fast_or_waits_for_room() -> None:
    size = SIZE
    pool, p = one_partition(buffer_memory=3 * size)

    async def scenario():
        first = [p.send_message_async(Message("t", b"x" * 100)) for _ in range(3)]
        refused = p.send_message_async(Message("t", b"x" * 100))
        assert refused.done() and not refused.result().success
        assert "buffer full" in refused.result().error_message
        assert p.accumulator.buffered == 3 * size
        waiting = asyncio.ensure_future(p.send(Message("t", b"y" * 100)))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # no room until the put in flight is answered
        await until(lambda: pool.open_puts == 1)
        pool.release_all()
        later = await asyncio.wait_for(waiting, 2)
        await until(lambda: pool.open_puts == 1)
        pool.release_all()
        return await asyncio.gather(*first), await later

    first, later = asyncio.run(scenario())
    assert all(r.success for r in first) and later.success
    assert p.accumulator.buffered == 0


def test_order_within_a_partition_survives_a_retry() -> None:
    # The first put of the key's partition is refused (503) and retried; messages sent
    # meanwhile must not overtake it.
    pool = HeldPool({0: [503], 1: []})
    p = AsyncMessageProducer(FakeCluster(), pool, producer(pool).config, KeyHashPartitionSelector())  # type: ignore[arg-type]

    async def scenario():
        futures = [p.send_message_async(Message("t", f"{i}".encode(), attribute="k")) for i in range(3)]
        await until(lambda: len(pool.held) == 1)
        futures += [p.send_message_async(Message("t", f"{i}".encode(), attribute="k")) for i in range(3, 6)]
        for _ in range(50):  # answer puts as they come: the 503, its retry, then the rest
            pool.release_all()
            await asyncio.sleep(0.005)
        return await asyncio.gather(*futures)

    results = asyncio.run(scenario())
    assert all(r.success for r in results)
    assert len({r.partition for r in results}) == 1
    offsets = [r.offset for r in results]
    assert offsets == sorted(offsets) and len(set(offsets)) == 6
    assert results[0].attempts == 2 and results[5].attempts == 1
    # Puts went out one at a time for the partition: the retry before the later messages.
    assert [len(b) // 26 for b in pool.bodies] == [3, 3, 3]


def test_puts_in_flight_per_connection_are_bounded() -> None:
    pool = HeldPool({0: []})
    cluster = FakeCluster(brokers=1, parts=4)
    p = producer(pool, cluster, max_in_flight_per_connection=2)

    async def scenario():
        futures = []
        for _ in range(4):  # round robin, sticky: each new batch to the next partition...
            futures.append(p.send_message_async(Message("t", b"x")))
            await asyncio.sleep(0.01)
        assert pool.open_puts == 2  # ...but only two puts at a time on the connection
        assert len(p.accumulator.queue("t", Partition(0, 2)).entries) == 2  # the last two share the waiting batch
        while pool.release_all():
            await asyncio.sleep(0.01)
        return await asyncio.gather(*futures)

    results = asyncio.run(scenario())
    assert all(r.success for r in results) and len({r.partition for r in results}) == 3


def test_close_sends_everything_queued_then_refuses() -> None:
    pool = FakePool({0: [], 1: []})
    p = producer(pool, linger_ms=60_000)

    async def scenario():
        futures = [p.send_message_async(Message("t", b"x")) for _ in range(10)]
        await asyncio.wait_for(p.close(), 2)
        assert all(f.done() for f in futures)
        after = await p.send_message(Message("t", b"x"))
        return [f.result() for f in futures], after

    results, after = asyncio.run(scenario())
    assert all(r.success for r in results)
    assert not after.success and "closed" in after.error_message


def test_a_send_path_bug_still_ends_each_message_in_a_result() -> None:
    async def broken(topic: str, partition: Partition, messages: list[Message]) -> list[SendResult]:
        raise RuntimeError("bug")

    async def scenario():
        accumulator = Accumulator(AccumulatorConfig(0, 1 << 20, 1 << 20, 5), broken)
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(3)]
        queue = accumulator.queue("t", Partition(0, 0))
        for future in futures:
            accumulator.append(queue, (Message("t", b"x"), future, record_size(Message("t", b"x")), None))
        results = await asyncio.gather(*futures)
        return results, accumulator.buffered

    results, buffered = asyncio.run(scenario())
    assert all(not r.success and "bug" in r.error_message for r in results)
    assert buffered == 0


def test_producer_is_an_async_context_manager_that_drains() -> None:
    pool = FakePool({0: [], 1: []})

    async def scenario():
        async with producer(pool, linger_ms=60_000) as p:
            futures = [p.send_message_async(Message("t", b"x")) for _ in range(3)]
        return [f.result() for f in futures]

    assert all(r.success for r in asyncio.run(scenario()))


def test_a_put_cancelled_while_its_results_are_handed_out_still_ends_each_message_in_a_result() -> None:
    # Results go out in two halves with a loop turn between (the next put is written
    # there): a cancel at that point must not leave the second half without results.
    pool, p = one_partition()

    async def scenario():
        seen: list[int] = []

        def on_result(i: int) -> Any:
            def callback(result: SendResult) -> None:
                seen.append(i)
                p.send_message_async(Message("t", b"again"))  # gives the halves' split a put to start
                if i == 0:
                    asyncio.current_task().cancel()  # the put's task, at its turn between the halves
            return callback

        futures = [p.send_message_async(Message("t", b"x"), on_result(i)) for i in range(6)]
        await until(lambda: pool.open_puts == 1)
        pool.release_all()
        await asyncio.wait_for(asyncio.wait(futures), 2)
        flushed = asyncio.ensure_future(p.flush())
        while not flushed.done():
            pool.release_all()
            await asyncio.sleep(0.001)
        return [f.result() for f in futures], seen

    results, seen = asyncio.run(scenario())
    assert all(r.success for r in results) and seen == list(range(6))
    # The first put, then the 3 messages the first half's callbacks sent, then the other 3.
    assert pool.bodies == [encode_messages([Message("t", d)] * n)[0] for d, n in ((b"x", 6), (b"again", 3), (b"again", 3))]


def test_flush_waits_for_results_not_yet_handed_out() -> None:
    # flush() called by a callback of the first half of a put's results: the second half
    # is still to be handed out, and flush must wait for it.
    pool, p = one_partition()

    async def scenario():
        flushes: list[asyncio.Future] = []
        done_at_flush: list[bool] = []

        def callback(result: SendResult) -> None:
            p.send_message_async(Message("t", b"y"))
            if not flushes:
                flushes.append(asyncio.ensure_future(p.flush()))
                flushes[0].add_done_callback(lambda _: done_at_flush.append(all(f.done() for f in futures)))

        futures = [p.send_message_async(Message("t", b"x"), callback) for _ in range(4)]
        while not flushes or not flushes[0].done():
            pool.release_all()
            await asyncio.sleep(0.001)
        return done_at_flush

    assert asyncio.run(scenario()) == [True]


def test_a_queued_message_holds_its_record_size_attribute_included() -> None:
    pool, p = one_partition()

    async def scenario():
        messages = [Message("t", b"x" * 10), Message("t", b"y", attribute="key-ü")]
        futures = [p.send_message_async(m) for m in messages]
        held = p.accumulator.buffered
        await until(lambda: pool.open_puts == 1)
        pool.release_all()
        await asyncio.gather(*futures)
        return held, sum(map(record_size, messages))

    held, expected = asyncio.run(scenario())
    assert held == expected
