"""Regressions found by the chaos suite (python -m chaos run --scenario random --seed 1)."""

from __future__ import annotations

import asyncio

from metaq.ha.sync_set import SyncReplication


def test_regression_deposed_master_sync_set_publish_retry() -> None:
    """A master fenced while a sync-set publish was failing (ZK session lost) kept retrying
    that publish after ``stop()``; once its new session was up it overwrote the *new*
    master's sync set in ZooKeeper (seen: ``[1]`` replaced by ``[]``), so the new master's
    slave was no longer eligible and the next master failure got no failover.
    After stop(), no publish may happen any more."""

    async def scenario() -> list[frozenset[int]]:
        written: list[frozenset[int]] = []
        failing = [False]

        async def publish(members: frozenset[int]) -> None:
            if failing[0]:
                raise RuntimeError("ZooKeeper session lost")
            written.append(members)

        sync = SyncReplication(1, 1000, "degrade", publish, log_end=lambda t, p: 0,
                               flushed_end=lambda t, p: 0, partitions=lambda: [],
                               position=lambda slave, t, p: None)
        await sync.start()
        written.clear()
        failing[0] = True
        sync._desired_members = lambda: frozenset({1})  # type: ignore[method-assign]
        sync._schedule_publish()
        await asyncio.sleep(0.05)  # the first attempt failed; a retry is pending
        await sync.stop()  # fenced
        failing[0] = False  # the session is back
        await asyncio.sleep(0.7)
        sync._schedule_publish()  # late events after stop must not publish either
        await asyncio.sleep(0.1)
        return written

    assert asyncio.run(scenario()) == []


def test_stop_ends_the_publishing_task_instead_of_leaving_it_behind() -> None:
    """The task publishing membership changes is owned: ``stop()`` returns with it ended, even
    while its write to ZooKeeper has not answered (nobody waits for that answer any more)."""

    async def scenario() -> asyncio.Task[None] | None:
        answered = asyncio.Event()

        async def publish(members: frozenset[int]) -> None:
            if members:
                await answered.wait()  # ZooKeeper does not answer

        sync = SyncReplication(1, 1000, "degrade", publish, log_end=lambda t, p: 0,
                               flushed_end=lambda t, p: 0, partitions=lambda: [],
                               position=lambda slave, t, p: None)
        await sync.start()
        sync._desired_members = lambda: frozenset({1})  # type: ignore[method-assign]
        sync._schedule_publish()
        await asyncio.sleep(0.05)
        publisher = sync._publisher
        assert publisher is not None and not publisher.done()
        await asyncio.wait_for(sync.stop(), 1)
        return publisher

    publisher = asyncio.run(scenario())
    assert publisher is not None and publisher.done()


def test_regression_a_master_back_from_fenced_in_the_same_term_keeps_its_sync_set() -> None:
    """Campaign seed 4005: a sync master briefly lost its ZooKeeper connection, came back with
    the same session (so the same epoch) and started its sync set anew: it published ``[]``
    and acked alone. When ZooKeeper then lost it for good (its session expired), its caught-up
    slave was "not in the last sync set []" and could not take over: no master until the old
    one came back. The same term resumes with its members, published before any ack."""

    async def scenario() -> tuple[list[frozenset[int]], SyncReplication, SyncReplication]:
        written: list[frozenset[int]] = []
        ends = {("t", 0): 120}

        async def publish(members: frozenset[int]) -> None:
            written.append(members)

        def sync_set() -> SyncReplication:
            return SyncReplication(1, 1000, "degrade", publish, log_end=lambda t, p: ends[(t, p)],
                                   flushed_end=lambda t, p: ends[(t, p)], partitions=lambda: list(ends),
                                   position=lambda slave, t, p: 120 if slave == 1 else None)

        first = sync_set()
        await first.start()
        first.slave_position(1, "t", 0)  # caught up: joins
        await asyncio.sleep(0.1)
        assert first.members == frozenset({1})
        term = first.term(epoch=6)
        await first.stop()  # fenced
        ends[("t", 0)] = 130  # appended, never acked, while fenced: the resumed term starts where the first did
        again = sync_set()
        await again.start(resume=term)
        other = sync_set()
        await other.start()  # a new term (another epoch) starts empty, as before
        await asyncio.gather(again.stop(), other.stop())
        return written, again, other

    written, again, other = asyncio.run(scenario())
    assert written[:3] == [frozenset(), frozenset({1}), frozenset({1})], written
    assert again.members == frozenset({1}) and not again.too_small
    assert again.term(6).term_start == {("t", 0): 120}
    assert other.term(7).term_start == {("t", 0): 130}, "a new term starts at the log end it takes over"
    assert written[3] == frozenset() and other.members == frozenset()
