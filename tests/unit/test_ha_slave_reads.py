"""What a slave serves its consumers while it follows no master (metaq/ha/follower.py, ``committed``).

Campaign seed 8106 (sync, two slaves, degrade): the master was killed while slave A held a
COMMIT marker that slave B, also in the sync set, did not; the master had not committed it.
Orphaned, A served its whole log and a reader got the marker; B was elected, wrote the
marker again with another message id at the same offset, and A truncated its copy: a read
that a failover took back, which sync mode never allows. A slave without a master serves
no more than the last committed offset a master told it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from metaq.config import SlaveConfig
from metaq.ha.epochs import EpochCache
from metaq.ha.follower import MasterFollower, ReplicaRun
from metaq.ha.node import HaNode
from metaq.ha.record import RecordTable
from metaq.ha.replica import PartitionReplica
from metaq.ha.role import Role

MARKER_AT, LOG_END = 45827, 45916  # the old master committed up to the marker, not past it


def orphaned_slave() -> tuple[HaNode, MasterFollower, PartitionReplica, SimpleNamespace]:
    """A slave (never a master of the partition's newest epoch) that followed a sync master
    and holds the marker past the committed offset that master last told it."""
    host = SimpleNamespace(config=SimpleNamespace(broker_id=0), security=SimpleNamespace(heartbeat_key=None),
                           registry=SimpleNamespace(slave_id=0), partitions=RecordTable())
    follower = MasterFollower(host, SlaveConfig(slave_id=0, slave_group="g"), None, None,  # type: ignore[arg-type]
                              lambda: 2, None, lambda: None)  # type: ignore[arg-type]
    log = SimpleNamespace(log_end=LOG_END, flushed_end=LOG_END)
    replica = PartitionReplica("chaos", 0, SimpleNamespace(log=log), None, dict, lambda t, p: None, 100)  # type: ignore[arg-type]
    record = host.partitions.replication("chaos", 0)
    record.following = ReplicaRun(follower, replica)  # the slave side of its replication record
    follower.master_mode = "sync"  # the campaign run's: a sync master (async serves what it holds)
    replica.status.master_committed = MARKER_AT
    epochs = EpochCache(Path("/nonexistent"), [(1, 0), (2, 44850)])  # epoch 2 led by another broker
    coordinator = SimpleNamespace(state=Role.FOLLOWING, epochs=SimpleNamespace(serving=2, led=1),
                                  leadership=SimpleNamespace(sync_set=None), followership=SimpleNamespace(follower=follower),
                                  cache=lambda t, p: epochs, master_url="meta://old:1")
    node = HaNode(host, SlaveConfig(slave_id=0, slave_group="g"), in_zookeeper=True)
    node.coordinator = coordinator
    return node, follower, replica, coordinator


def test_an_orphaned_slave_serves_no_more_than_the_master_last_committed() -> None:
    node, follower, replica, coordinator = orphaned_slave()
    follower.master_url = "meta://old:1"
    assert node.committed("chaos", 0, replica.log) == MARKER_AT, "following: what the master committed"

    async def master_gone() -> None:
        await follower.unfollow()
        coordinator.state = Role.ORPHANED

    asyncio.run(master_gone())
    assert follower.master_url is None
    # Before the fix: LOG_END, the marker no other sync-set slave had was readable.
    assert node.committed("chaos", 0, replica.log) == MARKER_AT
    coordinator.state = Role.FOLLOWING  # the next master chosen; not truncated against it yet
    assert node.committed("chaos", 0, replica.log) == MARKER_AT


def test_after_truncating_against_the_new_master_its_committed_offsets_decide() -> None:
    node, follower, replica, coordinator = orphaned_slave()
    asyncio.run(follower.unfollow())
    replica.log.log_end = MARKER_AT  # truncated: the marker moved aside
    assert node.committed("chaos", 0, replica.log) == MARKER_AT
    follower.master_url = "meta://new:1"
    replica.log.log_end = LOG_END  # the new master's own marker, appended
    assert node.committed("chaos", 0, replica.log) == MARKER_AT, "not readable before the new master commits it"
    replica.status.master_committed = LOG_END
    assert node.committed("chaos", 0, replica.log) == LOG_END


def test_a_slave_whose_master_committed_everything_it_holds_serves_all_of_it_without_a_master() -> None:
    node, follower, replica, coordinator = orphaned_slave()
    replica.status.master_committed = LOG_END
    asyncio.run(follower.unfollow())
    coordinator.state = Role.ORPHANED
    assert node.committed("chaos", 0, replica.log) == LOG_END, "every acked message stays readable on a masterless slave"


def test_a_deposed_master_serves_what_its_slaves_fetched_in_its_term_not_an_older_masters_bound() -> None:
    """A broker that followed a master once (its replica's committed offset is that master's,
    from before its own term), then led the partition's newest epoch and was deposed: its own
    record of the term (what a slave fetched) decides, not the stale committed offset. Before,
    the smaller of the two hid the term's fetched writes (tests/integration/
    test_failover_deposed_reads.py: ``shared`` not served)."""
    node, follower, replica, coordinator = orphaned_slave()
    asyncio.run(follower.unfollow())
    coordinator.state = Role.ORPHANED
    term_start, fetched = 44850, LOG_END - 89
    replica.status.master_committed = 1000  # told by the master it followed before its term
    coordinator.epochs.led = 2  # epoch 2, the partition's newest, was this broker's term
    record = node.host.partitions.replication("chaos", 0)
    record.shared = (2, fetched)  # a slave fetched up to here in that term
    node.host.partitions.batch_boundary = lambda t, p, offset, committed: offset
    assert node.committed("chaos", 0, replica.log) == fetched
    record.shared = None  # no slave reported in the term: only what it held when the term began
    assert node.committed("chaos", 0, replica.log) == term_start


def test_an_orphaned_slave_of_an_async_master_serves_what_it_holds() -> None:
    """Async mode: the master acks what no slave holds and the next master may lack any tail
    (guarantees A1, A3): a masterless slave keeps serving its whole log, as the docs say."""
    node, follower, replica, coordinator = orphaned_slave()
    follower.master_mode = "async"
    asyncio.run(follower.unfollow())
    coordinator.state = Role.ORPHANED
    assert node.committed("chaos", 0, replica.log) == LOG_END
