"""Async-mode failover with real processes: bounded loss, divergent tail moved aside, and
``autoFailover=false`` keeping a slave from taking over.

Group 0: A (master) and B (``--slave``, slaveId 1), ``replicationMode=async``, ZK session 1500 ms.
"""

from __future__ import annotations

import time

from metaq.record import iter_records

from .failover_support import (
    SESSION_MS,
    Group,
    assert_identical,
    async_system,
    bounds,
    disk_log,
    fetch_all,
    first_ack_after,
    make_pair,
    missing_acks,
    put_one,
    request,
    stat,
    topics_reply,
    truncated_cut,
    truncated_files,
    wait_follows,
    wait_leads,
)
from .replication_support import wait_caught_up

PARTS = [("fo", 0)]


def _put_many(broker, tag: str, count: int):
    from .failover_support import Ack

    acks = []
    for i in range(count):
        payload = f"{tag}-{i:06d}".encode().ljust(48, b".")
        reply = put_one(broker, payload)
        assert reply.code == 200, reply.header
        acks.append(Ack(int(reply["partition"]), int(reply["offset"]), payload))
    return acks


def test_async_failover_loses_only_the_lag_and_truncates_it(broker_factory, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, async_system(), group)
    epoch_before = group.epoch()

    replicated = _put_many(a, "rep", 30)
    wait_caught_up(a, b, PARTS)
    b_end = bounds(b, "fo", 0)[1]

    # B stops; A acks more that B never gets.
    b.pause()
    try:
        extra = _put_many(a, "extra", 25)
        a_end = bounds(a, "fo", 0)[1]
        a.kill()
    finally:
        b.resume()
    assert a_end > b_end

    epoch = wait_leads(b, group, epoch_before, timeout=25)
    assert topics_reply(b)["role"] == "master"
    # The drill's count of possibly lost messages: A's acked messages past B's log end
    # when B took over (the new epoch starts there).
    epochs = request(b, {"op": "epochs", "topic": "fo", "partition": 0})["entries"]
    assert epochs[-1][0] == epoch
    takeover_end = epochs[-1][1]
    # A long-poll fetch B had outstanding may have been answered into its socket buffer
    # while it was stopped, so B can hold the first of the extra messages.
    assert b_end <= takeover_end < a_end
    possibly_lost = [x for x in replicated + extra if x.offset >= takeover_end]
    kept = [x for x in extra if x.offset < takeover_end]
    assert possibly_lost == extra[len(kept) :] and len(possibly_lost) >= len(extra) - 5
    print(f"\nasync failover: {len(extra)} acked on A after B stopped, {len(kept)} reached B, "
          f"{len(possibly_lost)} possibly lost ({a_end - takeover_end} bytes)")
    on_b = fetch_all(b)
    assert not missing_acks(replicated + kept, on_b)
    # B writes over the range where A's extra messages were.
    probe, _ = first_ack_after(b, b"b-first")
    assert probe["offset"] == takeover_end
    b_acks = _put_many(b, "b", 10)

    # A comes back, follows B, and moves exactly the bytes B lacks aside.
    _start, a_bytes = disk_log(a)
    assert _start + len(a_bytes) == a_end
    a.start(wait_zk=False)
    wait_follows(a, b, group)
    wait_caught_up(b, a, PARTS)
    files = truncated_files(a)
    assert len(files) == 1, files
    aside = files[0].read_bytes()
    assert truncated_cut(files[0]) == takeover_end
    assert len(aside) == a_end - takeover_end
    assert aside == a_bytes[takeover_end - _start :]
    assert [bytes(r.data) for r in iter_records(aside, takeover_end)] == [x.payload for x in possibly_lost]
    assert stat(a, "ha_truncations") == "1"
    assert_identical(b, slaves=1)
    on_b = fetch_all(b)
    assert not missing_acks(replicated + kept + b_acks, on_b)
    assert on_b[probe["offset"]] == b"b-first"


def test_no_auto_failover_keeps_the_slave_a_slave(broker_factory, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, async_system(autoFailover=False), group)
    epoch_before = group.epoch()
    acks = _put_many(a, "m", 10)
    wait_caught_up(a, b, PARTS)

    a.kill()
    # Well past the session timeout: A's master node is gone, and nobody took it.
    deadline = time.monotonic() + SESSION_MS / 1000 + 3
    while time.monotonic() < deadline:
        master = group.master()  # read once: A's node may expire between two reads
        assert master is None or master == a.url, master
        time.sleep(0.1)
    assert group.master() is None
    assert group.epoch() == epoch_before
    assert topics_reply(b)["role"] == "slave1"
    assert stat(b, "ha_state") == "orphaned"
    reply = put_one(b, b"refused")
    assert reply.code == 403, reply.header
    # The slave still serves what it has.
    assert not missing_acks(acks, fetch_all(b))

    # The old master comes back and leads again (it led the last epoch); B follows it.
    a.start(wait_zk=False)
    wait_leads(a, group, epoch_before)
    wait_follows(b, a, group)
    first_ack_after(a, b"again", timeout=1 + SESSION_MS / 1000)
