"""Deferred (metaq/deferred.py) and the waits built on it: a sync put's ack and a parked
fetch are handed on inside the event that releases them, not on a later turn of the loop."""

from __future__ import annotations

import asyncio
import logging

import pytest

from metaq.ha.sync_set import SyncReplication, SyncWaitFailed
from tests.unit.sync_set_support import sync_over
from metaq.deferred import Deferred
from metaq.server.waiters import EndWaiters, ParkedFetches


def test_callbacks_run_at_once_in_order_and_a_failing_one_does_not_stop_the_others(caplog) -> None:
    seen: list[str] = []
    deferred: Deferred[int] = Deferred()
    deferred.add_done_callback(lambda d: seen.append(f"first {d.result()}"))
    deferred.add_done_callback(lambda d: 1 / 0)
    deferred.add_done_callback(lambda d: seen.append(f"third {d.result()}"))
    with caplog.at_level(logging.ERROR, logger="metaq.deferred"):
        deferred.set_result(7)
    assert seen == ["first 7", "third 7"]
    assert "ZeroDivisionError" in caplog.text
    deferred.add_done_callback(lambda d: seen.append("late"))  # already done: called now
    assert seen[-1] == "late"
    with pytest.raises(asyncio.InvalidStateError):
        deferred.set_result(8)


def test_then_carries_results_and_exceptions_and_cancel_releases_once() -> None:
    source: Deferred[int] = Deferred()
    doubled = source.then(lambda d: d.result() * 2)
    source.set_result(21)
    assert doubled.done() and doubled.result() == 42

    failing: Deferred[int] = Deferred()
    derived = failing.then(lambda d: d.result())
    failing.set_exception(SyncWaitFailed(504, "outcome unknown"))
    assert isinstance(derived.exception(), SyncWaitFailed)

    released: list[str] = []
    parked: Deferred[None] = Deferred()
    parked.on_cancel(lambda: released.append("timer and watch"))
    timed = parked.then(lambda d: d.result())  # as metrics.py wraps a reply
    assert timed.cancel() and not parked.cancel() and not timed.cancel()
    assert released == ["timer and watch"] and parked.cancelled()
    with pytest.raises(asyncio.CancelledError):
        parked.result()


def test_awaiting_a_deferred_works_for_code_off_the_hot_path() -> None:
    async def scenario() -> int:
        deferred: Deferred[int] = Deferred()
        asyncio.get_running_loop().call_later(0.01, deferred.set_result, 5)
        return await deferred

    assert asyncio.run(scenario()) == 5


class Parking:
    """Each partition's parked fetches, as ``Partitions`` holds them (one per open partition)."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], ParkedFetches] = {}

    def parking(self, topic: str, partition: int) -> ParkedFetches:
        return self.held.setdefault((topic, partition), ParkedFetches(f"{topic}-{partition}"))

    def parked(self, topic: str, partition: int) -> ParkedFetches | None:
        return self.held.get((topic, partition))

    def every_parked(self) -> list[ParkedFetches]:
        return list(self.held.values())


def test_notify_calls_each_watcher_once_and_a_withdrawn_one_never() -> None:
    waiters = EndWaiters(Parking())
    calls: list[str] = []
    waiters.watch("t", 0, lambda: calls.append("a"))
    withdraw = waiters.watch("t", 0, lambda: calls.append("b"))
    waiters.watch("t", 1, lambda: calls.append("other partition"))
    withdraw()
    waiters.notify("t", 0)
    waiters.notify("t", 0)  # each watch is for one notify
    assert calls == ["a"]


def test_a_commit_alone_wakes_consumers_fetches_and_leaves_slaves_parked() -> None:
    """``notify_committed`` (a sync master's commit after every put, a flush) wakes only the
    fetches watching ``on_commit``; ``notify`` (an append, a drop) wakes every one, slaves'
    first; held, a commit alone stays a commit and an append among them wakes everyone."""
    waiters = EndWaiters(Parking())
    woken: list[str] = []
    waiters.watch("t", 0, lambda: woken.append("consumer"))
    withdraw = waiters.watch("t", 0, lambda: woken.append("withdrawn slave"), on_commit=False)
    waiters.watch("t", 0, lambda: woken.append("slave"), on_commit=False)
    withdraw()
    waiters.notify_committed("t", 0)
    assert woken == ["consumer"]
    waiters.watch("t", 0, lambda: woken.append("consumer"))
    waiters.notify("t", 0)
    assert woken == ["consumer", "slave", "consumer"]

    woken.clear()
    waiters.watch("t", 0, lambda: woken.append("slave"), on_commit=False)
    waiters.watch("t", 1, lambda: woken.append("slave of t-1"), on_commit=False)
    waiters.hold()
    waiters.notify_committed("t", 0)
    waiters.notify_committed("t", 1)
    waiters.notify("t", 1)  # an append to t-1 after its commit: t-1 wakes everyone
    waiters.notify_committed("t", 1)
    waiters.release()
    assert woken == ["slave of t-1"]
    waiters.notify_all()  # the broker stopping: every fetch, whatever it waits for
    assert woken == ["slave of t-1", "slave"]


def test_notifies_while_held_are_delivered_once_each_at_the_outermost_release() -> None:
    """One read of pipelined puts wakes a parked fetch once, with all of them (connection.py)."""
    waiters = EndWaiters(Parking())
    woken: list[str] = []

    def watch_again() -> None:
        woken.append("fetch")
        waiters.watch("t", 0, watch_again)

    waiters.watch("t", 0, watch_again)
    waiters.hold()
    for _ in range(3):
        waiters.notify("t", 0)  # three puts of one read
    waiters.hold()  # nested: another connection answered from inside this read
    waiters.notify("t", 0)
    waiters.release()
    assert woken == [], "delivered only when the outermost hold ends"
    waiters.release()
    assert woken == ["fetch"]
    waiters.notify("t", 0)  # not held: at once
    assert woken == ["fetch", "fetch"]


def test_a_sync_put_is_released_inside_the_slave_report_that_covers_it() -> None:
    """The ack needs no turn of the loop after the slave's fetch reports the put (old: an
    asyncio.Future, whose callbacks and waiting task ran a loop turn later)."""

    async def scenario() -> None:
        ends = {("t", 0): 0}
        positions: dict[tuple[int, str, int], int] = {}

        sync = sync_over(ends, positions)
        await sync.start()
        positions[(1, "t", 0)] = 0
        sync.slave_position(1, "t", 0)
        await asyncio.sleep(0.01)  # the join is published
        assert sync.members == {1}
        ends[("t", 0)] = 100
        wait = sync.wait("t", 0, 100)
        assert wait is not None
        acked: list[str] = []
        wait.add_done_callback(lambda done: acked.append("acked" if done.exception() is None else "failed"))
        positions[(1, "t", 0)] = 60
        sync.slave_position(1, "t", 0)
        assert acked == [], "the slave does not hold the put yet"
        positions[(1, "t", 0)] = 100
        sync.slave_position(1, "t", 0)
        assert acked == ["acked"], "released inside the report, before any loop turn"
        await sync.stop()

    asyncio.run(scenario())
