"""A kill -9 failover of a sync pair of 120 partitions: the new master's epoch reaches every
partition's history, durably, before it acks (the histories are written as one batch made
durable by one syncfs per file system, ha/epochs.py ``write_all``); then every partition takes
a put on it; the old master, restarted, follows and holds the same history as the new one for
every partition, with byte-identical logs. No timing is asserted (the machine is shared).
"""

from __future__ import annotations

from metaq.ha.epochs import EpochCache
from metaq.tools.launcher import wait_until

from .failover_support import Group, partition_dir, sync_system, wait_follows, wait_in_sync_set, wait_leads
from .replication_support import assert_identical, replica_rows
from .test_replication_scale import put_everywhere

TOPICS = {"wideA": 60, "wideB": 60}
PARTITIONS = sum(TOPICS.values())
KEYS = [(topic, p) for topic, count in TOPICS.items() for p in range(count)]
# A longer session than failover_support's: 120 partitions on a loaded machine must not lapse
# it by themselves (the kill -9 is detected by the death watch, not by the session's expiry).
ZK = {"zk.zkSessionTimeoutMs": 4000}
SYSTEM = sync_system(syncSlaveTimeoutMs=5000, maxRequestsInFlight=200)


def all_following(slave) -> bool:  # noqa: ANN001
    rows = replica_rows(slave)
    return len(rows) == PARTITIONS and all(row["state"] == "following" for row in rows.values())


def history(broker, topic: str, partition: int) -> list[tuple[int, int]]:  # noqa: ANN001
    return EpochCache.load(partition_dir(broker, topic, partition)).entries


def test_kill_9_of_a_120_partition_master_names_the_new_epoch_everywhere_before_acking(
        broker_factory, zk_client, zk_root) -> None:  # noqa: ANN001
    group = Group(zk_client, zk_root)
    a = broker_factory(0, TOPICS, SYSTEM, name="A", zookeeper=ZK)
    b = broker_factory(0, TOPICS, SYSTEM, {"slaveId": 1}, name="B", zookeeper=ZK)
    wait_until(lambda: all_following(b), 120, interval=0.5, message="every partition to replicate")
    wait_in_sync_set(group, 1, timeout=120)
    assert put_everywhere(a, "before", TOPICS) == PARTITIONS
    epoch_before = group.epoch()

    a.kill()
    epoch = wait_leads(b, group, epoch_before, timeout=90)
    # Leading (lease confirmed) and nothing put yet: every history starts the new epoch at its
    # log end, on disk.
    for topic, p in KEYS:
        start, data = b.disk_log(topic, p)
        assert history(b, topic, p)[-1] == (epoch, start + len(data)), (topic, p, history(b, topic, p))
    assert put_everywhere(b, "after", TOPICS) == PARTITIONS  # every partition served on the new master

    # The old master comes back as a slave of the new one: it copies B's histories.
    a.start(wait=False)
    wait_follows(a, b, group, timeout=120)
    wait_until(lambda: all_following(a), 120, interval=0.5, message="every partition of A to replicate")
    assert {key: history(a, *key) for key in KEYS} == {key: history(b, *key) for key in KEYS}
    assert_identical(b)
