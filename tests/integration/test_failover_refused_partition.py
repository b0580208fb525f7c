"""A broker rejoining a master that refuses one partition (its segment files were lost, so its
log end went backwards: docs/storage.md, "Lost segment files") follows every other partition,
with real processes.

Before, the rejoining broker's truncation failed on that partition's ``epoch_end`` answer,
failed the whole FOLLOWING entry action, and tried again every 250 ms: it replicated nothing
(a netns chaos campaign run stayed 270 KB behind on every partition until it ended).

Group 0: A (master) and B (``--slave``, slaveId 1), async, topic ``fo`` of 2 partitions.
"""

from __future__ import annotations

from .failover_support import (
    Group,
    async_system,
    bounds,
    make_pair,
    partition_dir,
    put_one,
    wait_follows,
    wait_leads,
)
from .replication_support import stats_lines, wait_caught_up


def _put(broker, partition: int, tag: str, count: int) -> None:
    for i in range(count):
        reply = put_one(broker, f"{tag}-{i:04d}".encode().ljust(40, b"."), partition=partition)
        assert reply.code == 200, reply.header


def test_a_rejoining_slave_follows_every_partition_but_the_one_its_master_refuses(broker_factory, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, async_system(), group, partitions=2)
    for partition in (0, 1):
        _put(a, partition, f"before-{partition}", 10)
    wait_caught_up(a, b, [("fo", 0), ("fo", 1)])
    b_fo0 = bounds(b, "fo", 0)

    # The whole group stops; A's fo-0 loses its segment files; A comes back alone and leads,
    # refusing fo-0 (nothing reuses its offsets).
    b.stop()
    a.stop()
    lost = sorted(partition_dir(a, "fo", 0).glob("*.meta"))
    assert lost
    for segment in lost:
        segment.unlink()
    epoch = group.epoch()
    a.start(wait_zk=False)
    wait_leads(a, group, epoch, timeout=30)
    assert put_one(a, b"refused", partition=0).code == 500

    # B rejoins: fo-0 is held back, fo-1 is truncated and followed.
    b.start(wait_zk=False)
    wait_follows(b, a, group)
    _put(a, 1, "after", 10)
    wait_caught_up(a, b, [("fo", 1)], timeout=30)
    held = [line for line in stats_lines(b) if line.startswith("held back fo-0-0 ")]
    assert len(held) == 1 and "went backwards" in held[0], held
    assert "fo-0 is not followed: the master at" in b.log_text()
    assert bounds(b, "fo", 0) == b_fo0, "nothing cut or fetched on the refused partition"
