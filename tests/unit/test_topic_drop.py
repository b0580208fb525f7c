"""What each owner of per-partition state forgets when a partition stops being served
(a topic deleted or re-created; the processes are in tests/integration/test_topic_lifecycle.py)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from metaq.ha.heartbeat import HeartbeatResponder, decode, encode
from metaq.ha.progress import ReplicationProgress
from metaq.ha.sync_set import SyncReplication, SyncWaitFailed
from tests.unit.sync_set_support import _publish_nowhere, sync_over
from metaq.server.stats import BrokerStats
from metaq.config import TopicConfig
from metaq.server.partitions import Partitions
from metaq.store.manager import MessageStoreManager, UnknownTopic


class FakeLog:
    def __init__(self, end: int) -> None:
        self.log_end = self.flushed_end = end


def test_heartbeat_answer_leaves_out_a_partition_dropped_meanwhile():
    logs = {("kept", 0): FakeLog(50), ("gone", 0): FakeLog(70)}

    def committed(topic: str, partition: int, log: FakeLog) -> int:
        if topic == "gone":
            raise UnknownTopic(topic, ["kept"])
        return log.log_end

    ha = SimpleNamespace(epoch=1, acting_master=True, committed=committed, slave_heartbeat=lambda *args: None)
    responder = HeartbeatResponder(3, ha, lambda: logs, "127.0.0.1", 0)
    message = {"kind": "hb", "role": "slave", "broker_id": 3, "slave_id": 1, "epoch": 1,
               "log_ends": {"gone/0": 70, "kept/0": 50, **{f"unknown/{n}": 1 for n in range(8)}}, "sent_at": time.time()}
    answer = decode(responder.handle(encode(message), ("127.0.0.1", 1)), "master")
    assert answer["_committed"] == {("kept", 0): 50} and responder.bad == 0


def test_a_dropped_partition_takes_its_replication_record_with_it(tmp_path):
    """Slaves' positions and the append history live in the partition's record: one ``drop``
    of its owner forgets them, and a partition of the same name served again starts empty."""
    config = {name: TopicConfig(name=name, data_path=str(tmp_path), num_partitions=1) for name in ("gone", "kept")}
    store = MessageStoreManager(config, max_message_size=1024)
    partitions = Partitions(store)
    progress = ReplicationProgress(partitions)
    for key in (("gone", 0), ("kept", 0)):
        store.get_log(*key)
        progress.appended(*key, 100, 1)
        progress.fetched(1, *key, 100, 1)
    assert set(progress.positions) == {(1, "gone", 0), (1, "kept", 0)}
    store.update_topics({"kept": config["kept"]})
    partitions.drop([("gone", 0)])
    assert progress.position(1, "gone", 0) is None and partitions.replication("gone", 0) is None
    assert set(progress.positions) == {(1, "kept", 0)}, "a report for a partition not served opens nothing"
    progress.fetched(1, "gone", 0, 50, 1)
    assert set(progress.positions) == {(1, "kept", 0)}
    assert progress.position(1, "kept", 0) == 100 and 1 in progress.slaves
    assert partitions.replication("kept", 0).history.total_messages == 1
    partitions.close()
    store.close()


def test_sync_set_ends_waiting_puts_of_a_dropped_partition_and_restarts_its_offsets():
    async def scenario() -> None:
        ends = {("gone", 0): 100, ("kept", 0): 100}
        positions = {(1, "gone", 0): 100, (1, "kept", 0): 100}

        sync = sync_over(ends, positions)
        await sync.start()
        sync.slave_position(1, "gone", 0)
        await asyncio.sleep(0.01)
        assert sync.members == {1} and sync.committed("gone", 0) == 100
        ends[("gone", 0)] = 150
        waiting = sync.wait("gone", 0, 150)
        assert waiting is not None
        del ends[("gone", 0)], positions[(1, "gone", 0)]
        sync.forget_partitions([("gone", 0)])
        with pytest.raises(SyncWaitFailed) as failed:
            await waiting
        assert failed.value.code == 404
        ends[("gone", 0)] = 0  # re-created: an empty log of the new incarnation
        assert sync.committed("gone", 0) == 0, "the old incarnation's committed offset does not carry over"
        await sync.stop()

    asyncio.run(scenario())


def test_the_sync_state_of_a_partition_lives_in_its_record_and_goes_with_one_drop(tmp_path):
    """With the broker's partitions as its records, the sync set keeps each partition's offsets
    and waiting puts in the partition's record: ``Partitions.drop`` alone ends a waiting put
    (404), and the next term's sync set starts every partition afresh."""
    config = {name: TopicConfig(name=name, data_path=str(tmp_path), num_partitions=1) for name in ("gone", "kept")}
    store = MessageStoreManager(config, max_message_size=1024)
    partitions = Partitions(store)
    for key in config:
        store.get_log(key, 0)
    ends = {("gone", 0): 100, ("kept", 0): 100}
    positions = {(1, "gone", 0): 100, (1, "kept", 0): 100}

    def term() -> SyncReplication:
        return SyncReplication(
            1, 60_000, "reject", _publish_nowhere,
            log_end=lambda t, p: ends[(t, p)], flushed_end=lambda t, p: ends[(t, p)],
            partitions=lambda: list(ends), position=lambda s, t, p: positions.get((s, t, p)),
            records=partitions,
        )

    async def scenario() -> None:
        sync = term()
        await sync.start()
        sync.slave_position(1, "gone", 0)
        await asyncio.sleep(0.01)
        assert sync.members == {1} and sync.committed("kept", 0) == 100
        record = partitions.replication("kept", 0)
        assert record.sync.term is sync and record.sync.committed == 100
        ends[("gone", 0)] = 150
        waiting = sync.wait("gone", 0, 150)
        assert waiting is not None and partitions.replication("gone", 0).sync.waiters
        store.update_topics({"kept": config["kept"]})
        partitions.drop([("gone", 0)])  # no call into the sync set
        with pytest.raises(SyncWaitFailed) as failed:
            await waiting
        assert failed.value.code == 404
        assert sync.status_pairs()[4] == ("sync_waiting_puts", 0)
        assert ("gone", 0) not in sync._waiting, "the index of waiting partitions is left by the record's close"
        await sync.stop()

        ends[("kept", 0)] = 40  # the next term: a log truncated below the old committed offset
        positions.clear()
        del ends[("gone", 0)]
        following = term()
        await following.start()
        assert record.sync.term is following and record.sync.term_start == 40
        assert following.committed("kept", 0) == 40, "the previous term's committed offset does not carry over"
        await following.stop()

    asyncio.run(scenario())
    partitions.close()
    store.close()


def test_stats_rows_of_dropped_partitions_go_with_their_owner_and_totals_keep_them(tmp_path):
    config = {name: TopicConfig(name=name, data_path=str(tmp_path), num_partitions=2) for name in ("gone", "kept")}
    store = MessageStoreManager(config, max_message_size=1024)
    partitions = Partitions(store)
    stats = BrokerStats(partitions)
    stats.partition("gone", 0).put_messages = 5
    stats.partition("kept", 0).put_messages = 2
    partitions.get("kept", 1)  # open, never counted: no row
    assert set(stats.topic_totals()) == {"gone", "kept"} and [key for key, _ in partitions.counted()] == [("gone", 0), ("kept", 0)]
    store.update_topics({"kept": config["kept"]})
    partitions.drop([("gone", 0), ("gone", 1)])  # the counters go with the owner: no call into the stats
    assert set(stats.topic_totals()) == {"kept"} and stats.totals().put_messages == 7
    stats.reset()
    assert stats.totals().put_messages == 0 and not list(partitions.counted())
    partitions.close()
    store.close()


def test_one_drop_wakes_the_partitions_parked_fetches_and_leaves_no_row_behind(tmp_path):
    """A partition's parked fetches and counters are held by its owner: ``Partitions.drop`` wakes
    the fetches (they find the log gone) and takes both along; the topic re-created starts empty."""
    from metaq.server.waiters import EndWaiters

    config = {name: TopicConfig(name=name, data_path=str(tmp_path), num_partitions=1) for name in ("gone", "kept")}
    store = MessageStoreManager(config, max_message_size=1024)
    partitions = Partitions(store)
    waiters = EndWaiters(partitions)
    stats = BrokerStats(partitions)
    woken: list[str] = []
    for name in config:
        waiters.watch(name, 0, lambda name=name: woken.append(f"consumer of {name}"))
        waiters.watch(name, 0, lambda name=name: woken.append(f"slave of {name}"), on_commit=False)
        stats.partition(name, 0).get_requests += 1
    store.update_topics({"kept": config["kept"]})
    partitions.drop([("gone", 0)])  # no call into the waiters nor the stats
    assert woken == ["slave of gone", "consumer of gone"]
    assert partitions.parked("gone", 0) is None and [key for key, _ in partitions.counted()] == [("kept", 0)]
    assert stats.totals().get_requests == 2
    waiters.notify("gone", 0)  # a late notify of the dropped partition finds nothing
    assert len(woken) == 2
    store.update_topics(config)  # re-created: a new owner, nothing carried over
    assert partitions.parking("gone", 0) is not None and not partitions.parked("gone", 0).watchers
    assert stats.partition("gone", 0).get_requests == 0
    waiters.notify_all()
    assert woken[2:] == ["slave of kept", "consumer of kept"]
    partitions.close()
    store.close()


def test_a_fetch_woken_by_a_replaced_log_parks_again_on_the_new_owner(tmp_path):
    """A log replaced under the registry (a new incarnation's, opened before any drop reached
    ``Partitions``): the old owner's fetches wake, and one that parks again parks on the new one."""
    from metaq.server.waiters import EndWaiters

    config = {"t": TopicConfig(name="t", data_path=str(tmp_path), num_partitions=1)}
    store = MessageStoreManager(config, max_message_size=1024)
    partitions = Partitions(store)
    waiters = EndWaiters(partitions)
    woken: list[str] = []

    def again() -> None:
        woken.append("woken")
        waiters.watch("t", 0, again)

    waiters.watch("t", 0, again)
    old = partitions.get("t", 0)
    closed: list[str] = []
    old.replication.following = SimpleNamespace(dropped=lambda: closed.append("fetch task cancelled"))
    store.update_topics({})
    store.update_topics(config)  # the store opens a new log for t-0; Partitions has not dropped the old
    new = partitions.get("t", 0)
    assert new is not old and old.dropped and woken == ["woken"]
    assert closed == ["fetch task cancelled"], "the old owner's replication record is closed as by a drop"
    assert partitions.parked("t", 0) is new.parked and len(new.parked.watchers) == 1
    waiters.notify("t", 0)
    assert woken == ["woken", "woken"]
    partitions.close()
    store.close()
