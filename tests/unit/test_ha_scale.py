"""What replication costs the master per slave report and per idle partition, counted
(metaq/ha/sync_set.py ``_consider_joining``, metaq/ha/news.py): no walk over every partition
per report, no request per idle partition. Counts, not times: they hold on any machine."""

from __future__ import annotations

import asyncio

from metaq.ha.news import NewsSession
from metaq.ha.sync_set import SyncReplication

from .sync_set_support import sync_over

PARTITIONS = 4_000


def test_a_slave_joining_a_sync_set_of_thousands_of_partitions_costs_a_bounded_walk_per_report() -> None:
    """Before: every report of a slave not yet counted walked all partitions (quadratic: at
    2,000 partitions the master's loop stayed busy until its lease lapsed)."""
    ends = {("t", p): 100 for p in range(PARTITIONS)}
    positions: dict[tuple[int, str, int], int] = {}
    sync = sync_over(ends, positions)
    looked = 0
    position = sync._position

    def counting(slave: int, topic: str, partition: int) -> int | None:
        nonlocal looked
        looked += 1
        return position(slave, topic, partition)

    sync._position = counting

    async def scenario() -> None:
        await sync.start()
        try:
            for p in range(PARTITIONS):
                assert 0 not in sync.joining, f"joined before reporting partition {p}"
                positions[(0, "t", p)] = 100
                sync.slave_position(0, "t", p)
            assert sync.joining == {0}, "a slave holding every partition joins at its last report"
        finally:
            await sync.stop()

    asyncio.run(scenario())
    # A full walk per report would be PARTITIONS**2 / 2 = 8,000,000 lookups.
    assert looked < 20 * PARTITIONS, looked


def test_a_slave_behind_on_some_partitions_is_waited_for_until_it_reports_them() -> None:
    ends = {("t", p): 100 for p in range(300)}
    positions = {(0, "t", p): 100 for p in range(300)}
    positions[(0, "t", 7)] = 50
    sync: SyncReplication = sync_over(ends, positions)

    async def scenario() -> None:
        await sync.start()
        try:
            sync.slave_position(0, "t", 0)  # the first report looks at every partition
            assert not sync.joining and sync._slaves[0].behind == {("t", 7)}
            sync.slave_position(0, "t", 1)  # not behind there: nothing changes
            assert not sync.joining
            positions[(0, "t", 7)] = 100
            sync.slave_position(0, "t", 7)  # its last lagging partition: out of ``behind``...
            assert sync._slaves[0].behind == set()
            # ...and the next full look (three reports do not pay for one over 300 partitions:
            # the periodic one, every 100 ms) lets it join.
            await asyncio.sleep(0.3)
            assert sync.counted == {0}
        finally:
            await sync.stop()

    asyncio.run(scenario())


def test_a_deleted_partition_no_longer_holds_a_slave_out() -> None:
    ends = {("t", 0): 100, ("gone", 0): 100}
    positions = {(0, "t", 0): 100}
    sync = sync_over(ends, positions)

    async def scenario() -> None:
        await sync.start()
        try:
            sync.slave_position(0, "t", 0)
            assert sync._slaves[0].behind == {("gone", 0)}
            del ends[("gone", 0)]
            sync.forget_partitions([("gone", 0)])
            sync.slave_position(0, "t", 0)
            assert sync.joining == {0} or sync.members == {0}
        finally:
            await sync.stop()

    asyncio.run(scenario())


class Watches:
    """EndWaiters' one-shot watches, by hand."""

    def __init__(self) -> None:
        self.watching: dict[tuple[str, int], object] = {}

    def watch(self, topic: str, partition: int, woken: object):  # noqa: ANN201
        self.watching[(topic, partition)] = woken
        return lambda: self.watching.pop((topic, partition), None)

    def notify(self, topic: str, partition: int) -> None:
        woken = self.watching.pop((topic, partition), None)
        if woken is not None:
            woken()  # type: ignore[operator]


def answer(opaque: int, keys: list[tuple[str, int]]) -> tuple[int, list[tuple[str, int]]]:
    return opaque, keys


def test_news_answers_a_parked_poll_with_the_quiet_partitions_that_moved() -> None:
    watches = Watches()

    async def scenario() -> None:
        session = NewsSession(0, watches.watch, answer)
        for p in range(PARTITIONS):
            session.register(("t", p), has_news=False)
        assert len(watches.watching) == PARTITIONS  # one watch each, no request each
        parked = session.poll(1, 5.0)
        assert not parked.done()
        watches.notify("t", 17)  # an append: answered inside the notify
        assert parked.done() and parked.result() == (1, [("t", 17)])
        assert ("t", 17) not in session.quiet
        # Already news at registration (the slave is behind): answered at once.
        session.register(("t", 17), has_news=True)
        assert session.poll(2, 5.0) == (2, [("t", 17)])
        # A newer poll answers the parked one first (the slave had more to register).
        older = session.poll(3, 5.0)
        newer = session.poll(4, 5.0)
        assert older.done() and older.result() == (3, []) and not newer.done()
        session.close()
        assert not watches.watching and newer.cancelled() is False

    asyncio.run(scenario())


def test_a_parked_news_poll_ends_empty_after_its_wait() -> None:
    watches = Watches()

    async def scenario() -> None:
        session = NewsSession(0, watches.watch, answer)
        session.register(("t", 0), has_news=False)
        parked = session.poll(1, 0.05)
        result = await parked
        assert result == (1, [])
        assert ("t", 0) in session.quiet  # still watched: news for it comes with the next poll
        session.close()

    asyncio.run(scenario())


def quiet_follower():  # noqa: ANN201
    from types import SimpleNamespace

    from metaq.config import SlaveConfig
    from metaq.ha.follower import MasterFollower

    from metaq.ha.record import RecordTable

    host = SimpleNamespace(config=SimpleNamespace(broker_id=0), security=SimpleNamespace(heartbeat_key=None),
                           partitions=RecordTable())
    return MasterFollower(host, SlaveConfig(slave_id=0, slave_group="g"), None, None,  # type: ignore[arg-type]
                          lambda: 1, None, lambda: None)  # type: ignore[arg-type]


def quiet_runs(follower, keys):  # noqa: ANN001, ANN201
    """Each partition of ``keys`` quiet on ``follower``: its run in its record, waiting for news."""
    from types import SimpleNamespace

    from metaq.ha.follower import ReplicaRun

    loop = asyncio.get_running_loop()
    runs = {}
    for key in keys:
        run = follower.host.partitions.replication(*key).following = ReplicaRun(follower, SimpleNamespace())
        run.woken = loop.create_future()
        runs[key] = run
    return runs


def answered(code: int, message: str = "", body: bytes = b""):  # noqa: ANN201
    from types import SimpleNamespace

    future = asyncio.get_running_loop().create_future()
    future.set_result(SimpleNamespace(ok=code == 200, code=code, message=message, body=body))
    return future


def test_a_master_without_news_leaves_every_partition_fetching_as_before() -> None:
    """An older master answers ``news`` 400 unknown command: the slave stops asking, and its
    quiet partitions look again (each then keeps a fetch parked, as before news)."""
    import msgpack

    async def scenario() -> None:
        follower = quiet_follower()
        runs = quiet_runs(follower, [("t", p) for p in range(3)])
        quiet = {key: run.woken for key, run in runs.items()}
        follower._news_answered(None, answered(200, body=msgpack.packb([["t", 1]])))  # type: ignore[arg-type]
        assert quiet[("t", 1)].result() is True and not quiet[("t", 0)].done()  # news: that one fetches
        follower._news_answered(None, answered(400, "unknown command 'news'"))  # type: ignore[arg-type]
        assert not follower.news_supported
        assert all(future.done() and future.result() is False for key, future in quiet.items() if key != ("t", 1))
        assert all(run.woken is None for run in runs.values())

    asyncio.run(scenario())


def test_a_refused_news_wakes_every_quiet_partition_to_hear_why_from_its_fetch() -> None:
    async def scenario() -> None:
        follower = quiet_follower()
        woken = quiet_runs(follower, [("t", 0)])[("t", 0)].woken
        follower._news_answered(None, answered(403, "stale epoch 1: the master is in epoch 2; re-sync"))  # type: ignore[arg-type]
        assert follower.news_supported and woken.result() is False

    asyncio.run(scenario())


def test_corrupt_bytes_found_on_a_quiet_partition_wake_its_replica() -> None:
    """The replica cuts and fetches corrupt bytes again only in a fetch: a quiet partition
    must not keep them until its next put (metaq/server/broker.py ``_repair_corrupt``)."""
    async def scenario() -> None:
        follower = quiet_follower()
        woken = quiet_runs(follower, [("t", 0)])[("t", 0)].woken
        follower.corruption_found("t", 0)
        assert woken.result() is True

    asyncio.run(scenario())
