"""Deleting and re-creating a topic on a running pair (real ZooKeeper and broker processes),
and docs/operations.md's procedure "Deleting and re-creating a topic".

Group 0: A (master) and B (``--slave``, slaveId 1), ZK session 1500 ms.
"""

from __future__ import annotations

import asyncio
import time

from metaq.client.message import Partition
from metaq.client.offsets import LocalOffsetStore, Position
from metaq.client.offsets_sql import SqlOffsetStore
from metaq.protocol import commands as c
from metaq.protocol.messages import InitProducerRequest
from metaq.zk.paths import ZkPaths, format_offset
from metaq.zk.topic_config import read_group_topics

from .failover_support import SESSION_MS, Group, async_system, make_pair, sync_system, wait_follows, wait_leads
from .replication_support import bounds, put, replica_rows, request, stat, wait_caught_up, wait_for
from .test_topics_cli import idempotent_put, metaq, serves

#: Log lines of an error loop on the master (heartbeat handling raising on a dropped topic)
#: or of a slave giving up a partition; none may appear.
ERROR_LINES = ("heartbeat handling failed", "Traceback", "replication of", "was never awaited", "transaction timer")


def errors_in(*brokers) -> list[str]:
    return [line for b in brokers for line in b.log_text().splitlines() if any(e in line for e in ERROR_LINES)]


def partition_dirs(broker, topic: str) -> list[str]:
    return sorted(p.name for p in (broker.dir / "data").glob(f"{topic}-*"))


def test_delete_and_recreate_with_fewer_partitions_on_a_sync_pair(broker_factory, zk, zk_root, zk_client, capsys, tmp_path):
    """Items 1-3 in sync mode with onSyncSlaveLoss=reject (every put needs the slave), then a kill -9."""
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(onSyncSlaveLoss="reject", minSyncSlaves=1), group)

    # The procedure, step 0: a topic with data on both members.
    code, out = metaq(capsys, zk, zk_root, "topics", "create", "--broker-id", "0", "--topic", "x", "--partitions", "5")
    assert code == 0, out
    for partition in range(5):
        put(a, "x", partition, 20)
    wait_caught_up(a, b, [("x", p) for p in range(5)])
    producer_id = int(request(a, InitProducerRequest().to_header())["producer_id"])
    plain_end = bounds(a, "x", 0)[1]
    first = idempotent_put(a, "x", producer_id, 0)
    assert first.code == c.OK and not first.get("duplicate"), first.header
    wait_caught_up(a, b, [("x", 0)])
    old_end = bounds(a, "x", 0)[1]
    assert old_end > 0
    # A consumer group's stored offsets of the old incarnation; "1-0" is another broker group's.
    paths = ZkPaths(zk_root)
    for name in ("0-0", "0-1", "1-0"):
        zk_client.create(paths.offset("g", "x", name), format_offset(-1, old_end).encode(), makepath=True)

    # The old incarnation's id and its record size on partition 1 (20 equal messages).
    old_incarnation = read_group_topics(zk_client, paths, 0).incarnations["x"]
    record_size = bounds(a, "x", 1)[1] // 20

    # Step 1: delete. Both stop serving it, drop every record of it and delete its files.
    code, out = metaq(capsys, zk, zk_root, "topics", "delete", "--broker-id", "0", "--topic", "x")
    assert code == 0, out
    assert serves(a, "x") is None and serves(b, "x") is None
    assert not [key for key in replica_rows(b) if key[0] == "x"], "the slave still lists replicas of a deleted topic"
    wait_for(lambda: not partition_dirs(a, "x") and not partition_dirs(b, "x"), 10, "x's files deleted on both")
    # Kafka's rule: the deleted topic's stored offsets go with it (each group's master deletes its own).
    wait_for(lambda: zk_client.get_children(paths.offsets("g", "x")) == ["1-0"], 10, "group g's offsets of x deleted")
    # Other topics keep replicating (reject mode: an ack needs the slave in the sync set).
    put(a, "fo", 0, 10)
    wait_caught_up(a, b, [("fo", 0)])

    # A consumer that ran on commits its old position again: the re-create deletes it too.
    zk_client.create(paths.offset("g", "x", "0-1"), format_offset(-1, old_end).encode())

    # Step 2: re-create with fewer partitions: a new incarnation, empty on every member.
    code, out = metaq(capsys, zk, zk_root, "topics", "create", "--broker-id", "0", "--topic", "x", "--partitions", "2")
    assert code == 0, out
    assert serves(a, "x") == 2 and serves(b, "x") == 2
    for broker in (a, b):
        assert bounds(broker, "x", 0) == (0, 0), f"{broker.name}: the re-created topic brought old messages back"
    put(a, "x", 1, 10)  # acked: the slave stays in the sync set
    put(a, "fo", 0, 10)
    wait_caught_up(a, b, [("x", 0), ("x", 1), ("fo", 0)])
    assert 1 in group.sync_set()
    assert partition_dirs(a, "x") == partition_dirs(b, "x") == ["x-0", "x-1"]
    assert errors_in(a, b) == []
    assert stat(a, "sync_state") == "ok"
    # Group g has no stored offset for the new incarnation: it reads it from its oldest message.
    code, out = metaq(capsys, zk, zk_root, "consume", "--max=10", "--topic", "x", "--group", "g", "--idle-timeout", "15")
    assert code == 0, out
    new_messages = [f"x-1-{n:08d}".ljust(100, ".") for n in range(10)]
    assert [line for line in out.splitlines() if line.startswith("x-")] == new_messages
    # Offsets in a file or a SQL database (no broker can delete them), committed in the old
    # incarnation after its third message: an offset that starts a message of the new one too,
    # where resuming would silently skip three. They are not applied: from the oldest message.
    offset_file, offset_url = tmp_path / "offsets.json", f"sqlite:///{tmp_path / 'offsets.db'}"
    stale = {Partition(0, 1): Position(-1, 3 * record_size)}
    for store in (LocalOffsetStore(offset_file), SqlOffsetStore(offset_url)):
        asyncio.run(store.commit("f", "x", stale, incarnations={Partition(0, 1): old_incarnation}))
    for option in (["--offset-file", str(offset_file)], ["--offset-url", offset_url]):
        code, out = metaq(capsys, zk, zk_root, "consume", "--max=10", "--topic", "x", "--group", "f", *option, "--idle-timeout", "15")
        assert code == 0, out
        assert [line for line in out.splitlines() if line.startswith("x-")] == new_messages, option
    # The producer's sequence numbers of the old incarnation do not apply: the same batch is new here.
    again = idempotent_put(a, "x", producer_id, 0)
    assert again.code == c.OK and not again.get("duplicate"), again.header
    assert again["end_offset"] == first["end_offset"] - plain_end, "appended at the start of the new log"

    # A later failover works: the slave takes over and serves the new incarnation.
    x1_end = bounds(a, "x", 1)[1]
    epoch = group.epoch()
    a.kill()
    wait_leads(b, group, epoch)
    assert serves(b, "x") == 2 and bounds(b, "x", 1) == (0, x1_end)
    assert errors_in(b) == []


def test_async_slave_takes_over_after_a_topic_was_deleted(broker_factory, zk, zk_root, zk_client, capsys):
    """Item 1 in async mode: no stopped replica of the deleted topic keeps the slave from taking
    over, and the master's promotion after a ZooKeeper session loss logs no traceback."""
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, async_system(), group)
    code, out = metaq(capsys, zk, zk_root, "topics", "create", "--broker-id", "0", "--topic", "gone", "--partitions", "2")
    assert code == 0, out
    put(a, "gone", 0, 10)
    put(a, "fo", 0, 10)
    wait_caught_up(a, b, [("gone", 0), ("fo", 0)])
    code, out = metaq(capsys, zk, zk_root, "topics", "delete", "--broker-id", "0", "--topic", "gone")
    assert code == 0, out
    put(a, "fo", 0, 10)
    wait_caught_up(a, b, [("fo", 0)])
    assert set(replica_rows(b)) == {("fo", 0)}

    # A member down while a topic is deleted and created again still has the old files: it
    # drops them when it starts (they carry the old incarnation) and copies the new log; the
    # files of a topic deleted for good meanwhile go when it starts too.
    # "gone" has 2 partitions when B stops and 1 when it starts: its second partition's files
    # belong to no partition served, and go too.
    for action, topic, *more in (("create", "gone", "--partitions", "2"), ("create", "left"), ("delete", "gone"),
                                 ("create", "gone"), ("delete", "left")):
        if action == "delete" and b.alive:
            put(a, "gone", 0, 10)
            put(a, "left", 0, 10)
            wait_caught_up(a, b, [("gone", 0), ("left", 0)])
            old_end = bounds(b, "gone", 0)[1]
            b.stop()
        code, out = metaq(capsys, zk, zk_root, "topics", action, "--broker-id", "0", "--topic", topic, *more)
        assert code == 0, out
    assert partition_dirs(b, "left") == ["left-0"] and partition_dirs(b, "gone") == ["gone-0", "gone-1"]
    b.start()
    wait_follows(b, a, group)
    wait_for(lambda: not partition_dirs(b, "left"), 10, "the deleted topic's files gone on the restarted slave")
    wait_for(lambda: partition_dirs(b, "gone") == ["gone-0"], 10, "the dropped partition's files gone on the restarted slave")
    put(a, "gone", 0, 3)
    wait_caught_up(a, b, [("gone", 0)])
    assert bounds(b, "gone", 0) == bounds(a, "gone", 0) == (0, bounds(a, "gone", 0)[1])
    assert bounds(b, "gone", 0)[1] < old_end, "the restarted slave served the old incarnation's messages"

    # Both lose their ZooKeeper sessions (paused past the timeout; B first, so A leads again):
    # A's promotion flushes and reconciles transactions over its partitions, none of them gone.
    epoch = group.epoch()
    b.pause()
    a.pause()
    time.sleep(SESSION_MS / 1000 * 2)
    a.resume()
    wait_leads(a, group, epoch)
    b.resume()
    wait_follows(b, a, group)
    put(a, "fo", 0, 5)
    wait_caught_up(a, b, [("fo", 0)])

    epoch = group.epoch()
    a.kill()
    wait_leads(b, group, epoch)
    put(b, "fo", 0, 5)
    assert errors_in(a, b) == []



def test_a_topic_deleted_while_its_master_is_paused_loses_its_stored_offsets(broker_factory, zk, zk_root, zk_client, capsys):
    """Found by the chaos run's topic operations (seed 44): the group's master deletes a deleted
    topic's stored consumer offsets when it applies the delete, but only while it leads. A
    master paused past its session applies it as a deposed one, the slave applied it as a
    slave and then took over: nobody deleted them. ``metaq topics delete`` deletes them too."""
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, async_system(), group)
    paths = ZkPaths(zk_root)
    code, out = metaq(capsys, zk, zk_root, "topics", "create", "--broker-id", "0", "--topic", "y", "--partitions", "2")
    assert code == 0, out
    for name in ("0-0", "0-1"):
        zk_client.create(paths.offset("g", "y", name), format_offset(-1, 100).encode(), makepath=True)

    epoch = group.epoch()
    a.pause()
    code, out = metaq(capsys, zk, zk_root, "topics", "delete", "--broker-id", "0", "--topic", "y", "--wait", "0")
    assert code == 0, out
    wait_leads(b, group, epoch)  # B applied the delete as a slave, then took over
    try:
        assert zk_client.get_children(paths.offsets("g", "y")) == [], "the deleted topic's stored offsets outlived it"
    finally:
        a.resume()


def test_a_topic_node_another_session_holds_does_not_stop_topic_changes(broker_factory, zk, zk_root, zk_client, capsys):
    """Campaign seed 3048: the master's topic node held by another live session (there a
    deposed master's) ended the master's step applying a topic change with a traceback
    nobody read, and the master never registered the node once it was free. The change is
    served, later changes apply, the slave copies the partitions added, and the node is the
    master's as soon as the other session lets it go."""
    from kazoo.client import KazooClient

    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, async_system(), group)
    pub_node = ZkPaths(zk_root).topic_pub_node("held", 0)
    other = KazooClient(hosts=zk.connect_string, timeout=4)
    other.start(timeout=10)
    try:
        other.create(pub_node, b'{"numParts":1,"broker":"0-m"}', ephemeral=True, makepath=True)
        code, out = metaq(capsys, zk, zk_root, "topics", "create", "--broker-id", "0", "--topic", "held")
        assert code == 0, out
        wait_for(lambda: "now serving held" in a.log_text(), 15, "the master applying the topic's creation")
        code, out = metaq(capsys, zk, zk_root, "topics", "alter", "--broker-id", "0", "--topic", "held", "--partitions", "3")
        assert code == 0, out
        wait_for(lambda: "changed held (numPartitions 1 -> 3)" in a.log_text(), 15, "the master applying the added partitions")
        for partition in range(3):
            put(a, "held", partition, 5)
        wait_caught_up(a, b, [("held", p) for p in range(3)])
        assert zk_client.get(pub_node)[1].ephemeralOwner == other.client_id[0]
    finally:
        other.stop()
        other.close()
    wait_for(lambda: (stat := zk_client.exists(pub_node)) is not None and zk_client.get(pub_node)[0] == b'{"numParts":3,"broker":"0-m"}',
             15, "the freed topic node registered by the master")
    assert "never retrieved" not in a.log_text()
    assert errors_in(a, b) == []
