"""The follower's stop must end its tasks even when a cancellation is lost.

In Python 3.11 ``asyncio.wait_for`` can swallow a cancel that races its result; a replica
task that then went on fetching kept ``_stop_following`` (and the HA coordinator's event
worker awaiting it) waiting for good: a slave stayed orphaned after a failover (chaos
campaign seed 2028). Every task's loop also ends once its follow generation is gone.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from metaq.config import SlaveConfig
from metaq.ha.follower import MasterFollower, ReplicaRun
from metaq.ha.record import RecordTable


class StubbornReplica:
    """A replica whose fetch swallows the first cancellation, as a lost one looks."""

    def __init__(self) -> None:
        self.topic, self.partition = "t", 0
        self.log = SimpleNamespace(log_end=0)
        self.fetches = 0
        self.swallowed = False

    async def fetch_once(self, conn: object, wait: bool = True) -> None:
        self.fetches += 1
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if self.swallowed:
                raise
            self.swallowed = True  # lost: the task runs on as if nothing happened


def test_a_replica_task_whose_cancel_is_lost_still_ends_when_following_stops() -> None:
    host = SimpleNamespace(config=SimpleNamespace(broker_id=0), security=SimpleNamespace(heartbeat_key=None),
                           partitions=RecordTable())
    follower = MasterFollower(host, SlaveConfig(slave_id=0, slave_group="g"), None, None,  # type: ignore[arg-type]
                              lambda: 1, None, lambda: None)  # type: ignore[arg-type]
    replica = StubbornReplica()

    async def connection() -> object:
        return object()

    follower._connection = connection  # type: ignore[method-assign]
    follower.news_supported = False  # a fetch after each fetch (no quiet wait for news)

    async def scenario() -> None:
        record = host.partitions.replication("t", 0)
        run = record.following = ReplicaRun(follower, replica)  # type: ignore[arg-type]
        assert follower.replicas == {("t", 0): replica}
        run.task = asyncio.ensure_future(follower._replicate(run, follower._generation))
        while replica.fetches < 3:
            await asyncio.sleep(0.005)
        await asyncio.wait_for(follower._stop_following(), 2)  # hung for good before the fix
        fetches = replica.fetches
        await asyncio.sleep(0.05)
        assert replica.swallowed and replica.fetches == fetches, "the task fetched on after following stopped"

    asyncio.run(scenario())


def follower_of(topics: dict[str, object], listed: dict[str, int]) -> tuple[MasterFollower, list[tuple[str, int]]]:
    """A follower serving ``topics`` whose master lists ``listed`` (topic -> partitions; the
    dict is read at each ask), and the partitions it started replicating."""
    plain = next(iter(topics.values()))
    config = SimpleNamespace(broker_id=0, topics=topics, topic_defaults=plain)
    started: list[tuple[str, int]] = []

    async def update_topics(topics: object) -> None:
        return None

    host = SimpleNamespace(config=config, security=SimpleNamespace(heartbeat_key=None), update_topics=update_topics,
                           partitions=RecordTable(), store=SimpleNamespace(has_log=lambda topic, partition: True))  # logs laid out already
    follower = MasterFollower(host, SlaveConfig(slave_id=0, slave_group="g", auto_sync_master_config=False),  # type: ignore[arg-type]
                              None, None, lambda: 1, None, lambda: None)  # type: ignore[arg-type]

    class Connection:
        async def request(self, header: object, timeout: float) -> object:
            return SimpleNamespace(ok=True, get=lambda key, default=None: {
                "topics": dict(listed), "replication_mode": "async", "incarnations": {}}.get(key, default))

    async def connection() -> object:
        return Connection()

    async def start_partition(conn: object, topic: str, partition: int) -> None:
        started.append((topic, partition))
        run = host.partitions.replication(topic, partition).following = ReplicaRun(follower, None)  # type: ignore[arg-type]
        run.task = asyncio.ensure_future(asyncio.sleep(0))  # type: ignore[assignment]

    follower._connection = connection  # type: ignore[method-assign]
    follower._start_partition = start_partition  # type: ignore[method-assign]
    return follower, started


def test_a_topic_created_at_run_time_that_the_master_does_not_list_yet_is_asked_for_again() -> None:
    """Campaign seed 3042: the slave applied a re-create first and read the master's topics
    while the master served none of that topic; nothing asked again (the master's config
    checksum ended where it began), so the re-created partition was never replicated."""
    from metaq.config import TopicConfig
    from metaq.ha.replica import MasterLacksPartition

    listed: dict[str, int] = {"plain": 1}
    follower, started = follower_of({"plain": TopicConfig("plain", num_partitions=1),  # from a file: no incarnation
                                     "side": TopicConfig("side", num_partitions=1, incarnation="life-2")}, listed)

    async def scenario() -> None:
        with pytest.raises(MasterLacksPartition, match="the master does not serve side yet"):
            await follower._sync_topics()
        assert started == [("plain", 0)]  # the others replicate meanwhile
        listed["side"] = 1
        await follower._sync_topics()
        assert started == [("plain", 0), ("side", 0)]

    asyncio.run(scenario())


def test_partitions_added_at_run_time_that_the_master_does_not_list_yet_are_asked_for_again() -> None:
    """Campaign seed 3048: a slave (re)started after partitions were added read the master's
    topics before the master applied the change, copied the old partitions only, and
    nothing asked again: the added partition stayed empty on the slave for good."""
    from metaq.config import TopicConfig
    from metaq.ha.replica import MasterLacksPartition

    listed: dict[str, int] = {"plain": 1, "side": 1}
    follower, started = follower_of({"plain": TopicConfig("plain", num_partitions=2),  # from a file: the master's layout rules
                                     "side": TopicConfig("side", num_partitions=3, incarnation="life-1")}, listed)

    async def scenario() -> None:
        for _ask in range(3):  # a master that never applies it: asked again each time, nothing else changes
            with pytest.raises(MasterLacksPartition, match=r"partitions side-1\.\.2 yet"):
                await follower._sync_topics()
            assert started == [("plain", 0), ("side", 0)]
        listed["side"] = 3
        await follower._sync_topics()
        assert started == [("plain", 0), ("side", 0), ("side", 1), ("side", 2)]

    asyncio.run(scenario())


def test_a_followers_replicas_live_in_their_partitions_records_and_go_with_a_drop() -> None:
    """The slave side's replica of a partition is in the partition's replication record: a
    follower of a later master does not see an earlier follower's, and dropping the partition
    (its topic deleted) takes the replica along, so its fetch loop ends."""
    host = SimpleNamespace(config=SimpleNamespace(broker_id=0), security=SimpleNamespace(heartbeat_key=None),
                           partitions=RecordTable())

    def follower() -> MasterFollower:
        return MasterFollower(host, SlaveConfig(slave_id=0, slave_group="g"), None, None,  # type: ignore[arg-type]
                              lambda: 1, None, lambda: None)  # type: ignore[arg-type]

    earlier, later = follower(), follower()
    replica = SimpleNamespace(status=SimpleNamespace(master_committed=70))
    record = host.partitions.replication("t", 0)
    record.following = ReplicaRun(earlier, replica)  # type: ignore[arg-type]
    assert earlier.replicas == {("t", 0): replica} and earlier.committed_seen("t", 0) == 70
    assert later.replicas == {} and later.committed_seen("t", 0) == 0
    host.partitions.drop([("t", 0)])
    assert earlier.replicas == {} and earlier._replica(("t", 0)) is None
    kept = host.partitions.replication("t", 1)
    kept.following = ReplicaRun(later, replica)  # type: ignore[arg-type]
    asyncio.run(later.stop())  # stopped for good: its runs leave the records
    assert kept.following is None and later.replicas == {}


def test_a_partition_dropped_on_a_slave_takes_its_whole_slave_side_along() -> None:
    """The follower keeps no map by partition: a quiet partition's fetch task, its future and
    its registration for the next ``news`` are on its run, in its record; dropping the
    partition cancels the task, and the next news names only partitions still quiet."""
    host = SimpleNamespace(config=SimpleNamespace(broker_id=0), security=SimpleNamespace(heartbeat_key=None),
                           partitions=RecordTable())
    follower = MasterFollower(host, SlaveConfig(slave_id=0, slave_group="g"), None, None,  # type: ignore[arg-type]
                              lambda: 1, None, lambda: None)  # type: ignore[arg-type]

    def replica(partition: int) -> SimpleNamespace:
        return SimpleNamespace(topic="t", partition=partition, log=SimpleNamespace(log_end=10 * partition),
                               status=SimpleNamespace(master_committed=partition), incarnation="")

    async def scenario() -> None:
        runs = {}
        for partition in range(3):
            run = runs[partition] = host.partitions.replication("t", partition).following = ReplicaRun(
                follower, replica(partition))  # type: ignore[arg-type]
            run.task = asyncio.ensure_future(follower._quiet_until_news(run, None))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert follower._on_news == 3 and all(run.woken is not None for run in runs.values())
        host.partitions.drop([("t", 1)])
        assert runs[1].task is None and ("t", 1) not in follower.replicas
        follower._wake(("t", 2), news=True)  # news for it: it fetches, nothing to register
        await asyncio.sleep(0)
        assert follower._news_outbox.drain() == [["t", 0, 0, 0, ""]]
        assert follower._news_outbox.drain() == [], "each registration is sent once"
        assert follower._on_news == 1 and runs[1].woken is None and runs[1].registration is None
        await follower._stop_following()
        assert follower._on_news == 0 and all(run.task is None and run.woken is None for run in runs.values())

    asyncio.run(scenario())


def test_the_news_outbox_holds_each_run_once_and_names_only_those_still_quiet() -> None:
    from metaq.ha.follower import NewsOutbox

    outbox = NewsOutbox()
    quiet, woken = ReplicaRun(None, None), ReplicaRun(None, None)  # type: ignore[arg-type]
    quiet.woken = woken.woken = object()  # type: ignore[assignment]
    for end in range(1000):  # quiet again and again before a poll: still one entry, the newest
        outbox.add(quiet, ["t", 0, end, 0, ""])
    outbox.add(woken, ["t", 1, 0, 0, ""])
    woken.woken = None  # news woke it before the poll: it fetches, nothing to register
    assert len(outbox._runs) == 2
    assert outbox.drain() == [["t", 0, 999, 0, ""]] and quiet.registration is woken.registration is None
    outbox.add(quiet, ["t", 0, 5, 0, ""])
    outbox.clear()
    assert outbox.drain() == [] and quiet.registration is None
