"""Sync-mode failover with real processes: kill -9 of the master mid-stream, and back again.

Group 0: A (started as master) and B (``--slave``, slaveId 1), ``replicationMode=sync``,
``onSyncSlaveLoss=degrade``, group commit (``unflushThreshold=0``), ZK session 1500 ms.

* ``test_kill_master_mid_stream``: every acked put survives on B at its acked offset,
  B leads under a new epoch and takes writes; A comes back as B's slave, moves its
  unacked tail (if any) aside into ``truncated-*`` and ends byte-identical to B.
* ``test_second_failover_back_to_original``: the same, then B is killed and A, caught
  up and in the sync set, leads again in a higher epoch; B rejoins as slave.
"""

from __future__ import annotations

import time

from metaq.tools.launcher import wait_until

from .failover_support import (
    Group,
    PutStream,
    assert_identical,
    disk_log,
    disk_records,
    fetch_all,
    first_ack_after,
    make_pair,
    missing_acks,
    put_one,
    stat,
    sync_system,
    topics_reply,
    truncated_cut,
    truncated_files,
    wait_follows,
    wait_in_sync_set,
    wait_leads,
)
from .replication_support import wait_caught_up

PARTS = [("fo", 0)]


def _check_truncation(old_master_bytes: tuple[int, bytes], rejoined, acked_payloads: set[bytes]) -> int:
    """If the rejoined broker cut its log, the truncated file holds exactly its old bytes
    past the cut, and none of them was acked. Returns the number of bytes moved aside."""
    start, before = old_master_bytes
    files = truncated_files(rejoined)
    assert len(files) <= 1, files
    if not files:
        assert stat(rejoined, "ha_truncations") == "0"
        return 0
    cut = truncated_cut(files[0])
    aside = files[0].read_bytes()
    assert aside == before[cut - start :], "the truncated file is not the old master's tail past the cut"
    from metaq.record import iter_records

    for record in iter_records(aside, cut):
        assert bytes(record.data) not in acked_payloads, f"an acked message at {record.offset} was truncated"
    assert stat(rejoined, "ha_truncations") == "1"
    return len(aside)


def test_kill_master_mid_stream(broker_factory, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)
    epoch_before = group.epoch()
    assert group.master() == a.url and epoch_before >= 1

    stream = PutStream(a.address, tag="a").start()
    stream.wait_acked(300)
    killed_at = time.monotonic()
    a.kill()
    stream.stop()
    assert stream.acked, "nothing was acked before the kill"
    assert not stream.refused, stream.refused[:3]

    # B takes over under a new epoch and says so.
    probe, acked_at = first_ack_after(b, b"first-on-B")
    epoch = wait_leads(b, group, epoch_before)
    print(f"\nsync failover: kill -9 -> first acked write on B: {acked_at - killed_at:.3f}s "
          f"(zk session {1500} ms; {len(stream.acked)} acked before the kill, {len(stream.unknown)} in flight)")
    assert epoch > epoch_before
    reply = topics_reply(b)
    assert reply["role"] == "master" and reply["epoch"] == epoch

    # Every acked message is on B at its acked offset, readable with an ordinary get.
    on_b = fetch_all(b)
    assert not missing_acks(stream.acked, on_b)
    assert on_b[probe["offset"]] == b"first-on-B"
    # The probe went right after everything A had acked.
    assert probe["offset"] >= max(x.offset for x in stream.acked)
    # More puts on B succeed.
    for i in range(10):
        assert put_one(b, f"b-{i}".encode()).code == 200

    # A comes back: it follows B, cuts its unacked tail (if any) and ends identical to B.
    a_disk = disk_log(a)
    a_end_before = a_disk[0] + len(a_disk[1])
    a.start(wait_zk=False)
    slave_id = wait_follows(a, b, group)
    assert group.slaves()[slave_id] == a.url
    assert group.master() == b.url and group.epoch() == epoch
    # B was started with --slave; it leads now, so it answers heartbeats as the master
    # (the HA issue, finding 2: it answered "slave" and A counted every answer as bad).
    wait_until(lambda: stat(a, "master_heartbeat_age_ms") not in (None, "-"), 10, interval=0.1,
               message="A to hear heartbeat answers from B")
    assert stat(a, "master_heartbeats_bad") == "0"
    wait_caught_up(b, a, PARTS)
    moved = _check_truncation(a_disk, a, {x.payload for x in stream.acked})
    print(f"A rejoined as slave{slave_id}; {moved} unacked bytes moved aside (A's log ended at {a_end_before})")
    assert_identical(b, slaves=1)
    assert not missing_acks(stream.acked, disk_records(a))


def test_second_failover_back_to_original(broker_factory, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)
    epoch1 = group.epoch()

    first = PutStream(a.address, tag="one").start()
    first.wait_acked(100)
    a.kill()
    first.stop()
    epoch2 = wait_leads(b, group, epoch1)

    a.start(wait_zk=False)
    a_slave_id = wait_follows(a, b, group)
    wait_in_sync_set(group, a_slave_id)
    wait_caught_up(b, a, PARTS)

    second = PutStream(b.address, tag="two").start()
    second.wait_acked(100)
    b.kill()
    second.stop()
    assert not first.refused and not second.refused, (first.refused[:3], second.refused[:3])

    epoch3 = wait_leads(a, group, epoch2)
    assert epoch3 > epoch2 > epoch1
    probe, _ = first_ack_after(a, b"back-on-A")
    on_a = fetch_all(a)
    assert not missing_acks(first.acked + second.acked, on_a)
    assert on_a[probe["offset"]] == b"back-on-A"

    # B restarts with its --slave config and follows A.
    b_disk = disk_log(b)
    b.start()
    wait_follows(b, a, group)
    wait_caught_up(a, b, PARTS)
    _check_truncation(b_disk, b, {x.payload for x in first.acked + second.acked})
    assert_identical(a, slaves=1)
    assert not missing_acks(first.acked + second.acked, disk_records(b))
