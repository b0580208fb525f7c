"""docs/operations.md's procedures, run as written.

The rolling restart: slaves first, one at a time, each back in the sync set before the
next; then a switchover by stopping the master (SIGTERM); the old master comes back as a
slave. Group 0 in sync mode with ``onSyncSlaveLoss=reject`` and two
slaves, so writes never stop for lack of a sync slave; no acked put is lost.
"""

from __future__ import annotations

import shutil

from metaq.tools.launcher import wait_until

from .failover_support import (
    GROUP,
    ZK_SETTINGS,
    Group,
    PutStream,
    disk_records,
    missing_acks,
    sync_system,
    wait_follows,
    wait_in_sync_set,
    wait_leads,
)
from .replication_support import assert_identical, wait_caught_up


def test_rolling_restart_slaves_first_then_a_switchover(broker_factory, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    system = sync_system(onSyncSlaveLoss="reject")
    a = broker_factory(GROUP, {"fo": 1}, system, name="A", zookeeper=ZK_SETTINGS)
    slaves = [broker_factory(GROUP, {"fo": 1}, system, {"slaveId": k}, name=f"S{k}", zookeeper=ZK_SETTINGS) for k in (1, 2)]
    for k, slave in zip((1, 2), slaves):
        wait_follows(slave, a, group)
        wait_in_sync_set(group, k)

    # 1. The slaves, one at a time; writes go on meanwhile (the other slave is in the sync set).
    stream = PutStream(a.address, tag="roll").start()
    for k, slave in zip((1, 2), slaves):
        stream.wait_acked(len(stream.acked) + 50)
        slave.restart()
        wait_follows(slave, a, group)
        wait_in_sync_set(group, k)
    stream.wait_acked(len(stream.acked) + 50)
    stream.stop()
    assert not stream.refused, stream.refused[:3]

    # 2. The switchover: SIGTERM the master; a sync-set slave takes over.
    epoch = group.epoch()
    a.stop()
    leader = wait_until(lambda: next((s for s in slaves if group.master() == s.url), None), 20, message="a slave to lead")
    wait_leads(leader, group, epoch)

    # 3. The old master comes back as a slave of the new one and catches up.
    rejoin(a, leader, group, stream, slaves=2)


def rejoin(old, leader, group: Group, stream: PutStream, slaves: int) -> None:
    """Start the old master; it follows ``leader``, copies its log and holds every acked put."""
    old.start(wait_zk=False)
    wait_follows(old, leader, group)
    wait_caught_up(leader, old, [("fo", 0)])
    assert not missing_acks(stream.acked, disk_records(old))
    assert_identical(leader, slaves=slaves)


def test_replacing_a_dead_masters_disk(broker_factory, zk_client, zk_root):
    """docs/operations.md, "Replacing a dead disk" on the master: the slave takes over, the
    old master starts on an empty data dir, comes back as a slave and copies the whole log."""
    group = Group(zk_client, zk_root)
    system = sync_system()
    a = broker_factory(GROUP, {"fo": 1}, system, name="A", zookeeper=ZK_SETTINGS)
    b = broker_factory(GROUP, {"fo": 1}, system, {"slaveId": 1}, name="B", zookeeper=ZK_SETTINGS)
    wait_follows(b, a, group)
    wait_in_sync_set(group, 1)
    stream = PutStream(a.address, tag="disk").start()
    stream.wait_acked(200)
    stream.stop()

    epoch = group.epoch()
    a.kill()  # the disk died under it
    shutil.rmtree(a.dir / "data")
    wait_leads(b, group, epoch)
    rejoin(a, b, group, stream, slaves=1)
