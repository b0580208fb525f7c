"""Async master/slave pairs with real ZooKeeper and real broker processes.

Each test proves one promise of docs/replication.md, checked with
the verify tool (metaq/tools/verify.py): the slave's log is a byte-identical prefix
of the master's, after catching up from empty, after kill -9 of the slave in the
middle of a produce stream, and after kill -9 of the master.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import msgpack

from metaq.cli.cluster import collect
from metaq.ha.follower import LINGER_S
from metaq.protocol import commands as c
from tests.integration.replication_support import (
    NO_FAILOVER,
    BackgroundProducer,
    assert_identical,
    blocking_puts,
    bounds,
    put,
    replica_rows,
    request,
    run,
    sleep,
    stat,
    stats_lines,
    wait_caught_up,
    wait_for,
)

TOPICS = {"orders": 2}
PARTS = [("orders", 0), ("orders", 1)]
NONZERO_START = 123_456


def test_slave_catches_up_from_empty_identical(broker_factory, zk):
    master = broker_factory(0, TOPICS, system=NO_FAILOVER, start=False)
    # The master's partition 1 log starts at a non-zero offset (as after retention
    # deleted old segments): an empty slave must start its copy at the same offset.
    part1 = master.dir / "data" / "orders-1"
    part1.mkdir(parents=True)
    (part1 / f"{NONZERO_START:020d}.meta").write_bytes(b"")
    master.start()
    put(master, "orders", 0, 1500)
    offsets = put(master, "orders", 1, 1000)
    assert offsets[0] == NONZERO_START

    slave = broker_factory(0, TOPICS, system=NO_FAILOVER, slave_props={"slaveId": 0})
    wait_caught_up(master, slave, PARTS)
    assert bounds(slave, "orders", 1)[0] == NONZERO_START == bounds(master, "orders", 1)[0]
    report = assert_identical(master)
    assert {(ch.topic, ch.partition) for ch in report.checks} == set(PARTS)
    assert all(ch.compared_bytes > 100_000 for ch in report.checks)

    # The CLI agrees (exit 0) and names both partitions.
    cli = subprocess.run(
        [sys.executable, "-m", "metaq", "verify", "--zk", zk.connect_string, "--zk-root", master.zk_root, "--broker-id", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "orders-0-0: OK" in cli.stdout and "orders-0-1: OK" in cli.stdout

    # The slave refuses writes, naming its master.
    refused = request(slave, {"op": "put", "topic": "orders", "partition": 0}, b"")
    assert refused.code == c.FORBIDDEN and master.url in refused.message

    # Lag figures: the slave's own rows and the master's per-slave rows, heartbeats flowing.
    rows = replica_rows(slave)
    assert rows[("orders", 0)]["state"] == "following"
    assert rows[("orders", 1)]["lag_bytes"] == "0" and rows[("orders", 1)]["lag_ms"] == "0"
    wait_for(lambda: stat(slave, "master_heartbeat_age_ms") not in (None, "-"), 10, "a heartbeat answer")
    assert float(stat(slave, "master_heartbeat_age_ms")) < 2000
    master_rows = [line for line in stats_lines(master) if line.startswith("slave0 orders-0-")]
    assert len(master_rows) == 2 and all("lag_bytes=0 lag_messages=0" in line for line in master_rows)
    assert all("heartbeat_age_ms=-1" not in line for line in master_rows)

    # `metaq cluster` data: one group, master and slave0, the slave with zero lag.
    members = run(collect(zk.connect_string, master.zk_root))
    assert [(m.role, m.state) for m in members] == [("master", "up"), ("slave0", "up")]
    assert members[1].lag_bytes == 0 and members[1].heartbeat_age_ms is not None

    # Malformed heartbeats are counted and ignored; the master keeps serving.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for junk in (b"\xc1garbage", msgpack.packb([1, 2]), msgpack.packb({"kind": "hb", "role": "slave", "broker_id": "x"}),
                     msgpack.packb({"kind": "hb", "role": "slave", "broker_id": 0, "slave_id": 5, "epoch": 0,
                                    "sent_at": 1.0, "log_ends": {"no-slash": 5}})):
            udp.sendto(junk, master.address)
    wait_for(lambda: int(stat(master, "heartbeats_bad") or 0) >= 4, 5, "the bad heartbeats to be counted")
    assert master.alive
    put(master, "orders", 0, 10)
    wait_caught_up(master, slave, PARTS)


def test_async_slave_gathers_a_stream_of_small_puts_into_few_fetches_and_catches_up(broker_factory):
    """docs/replication.md: after a small reply an async slave waits LINGER_S before its next
    fetch, so a stream of blocking one-message puts reaches it in few replies (without the
    wait: a fetch for almost every put, each a request and a reply the master handles between
    puts), and it still holds every put shortly after the last one."""
    master = broker_factory(0, {"orders": 1}, system=NO_FAILOVER)
    slave = broker_factory(0, {"orders": 1}, system=NO_FAILOVER, slave_props={"slaveId": 0})
    put(master, "orders", 0, 10)
    wait_caught_up(master, slave, [("orders", 0)])

    fetched_before = int(stat(master, "replica_get_requests"))
    started = time.perf_counter()
    seconds = blocking_puts(master, "orders", 0, 400)
    wait_caught_up(master, slave, [("orders", 0)])
    elapsed = time.perf_counter() - started
    fetches = int(stat(master, "replica_get_requests")) - fetched_before
    # Each reply with data is followed by LINGER_S of waiting, whatever the machine's speed.
    assert fetches <= elapsed / LINGER_S + 2, (
        f"{fetches} replica fetches with data for 400 puts in {elapsed:.2f}s (puts took {sum(seconds):.2f}s):"
        f" more than one per {LINGER_S * 1000:.0f} ms")
    assert fetches >= 1
    assert int(stat(slave, "replication_lingers")) >= 1  # the waits themselves, counted
    assert_identical(master)


def test_slave_kill9_during_produce_resumes_from_own_log_end(broker_factory):
    master = broker_factory(0, TOPICS, system=NO_FAILOVER)
    slave = broker_factory(0, TOPICS, system=NO_FAILOVER, slave_props={"slaveId": 0})
    with BackgroundProducer(master, "orders", 2) as producer:
        wait_for(lambda: producer.acked >= 2000, 20, "a first part of the stream")
        wait_for(lambda: bounds(slave, "orders", 0)[1] > 0, 10, "the slave to copy something")
        slave.kill()
        copied_before = sum(p.stat().st_size for p in (slave.dir / "data").rglob("*.meta"))
        sleep(1.0)
        slave.start()
        wait_for(lambda: producer.acked >= 6000, 30, "more of the stream")
    assert producer.acked >= 6000
    wait_caught_up(master, slave, PARTS)
    assert_identical(master)
    # It resumed from its own log end: after the restart it appended only what it lacked.
    appended = sum(int(row["appended_messages"]) for row in replica_rows(slave).values())
    total_bytes = sum(bounds(master, t, p)[1] for t, p in PARTS)
    assert copied_before > 0
    record = 20 + 100
    assert appended * record <= total_bytes - copied_before + record * 40, (  # a torn tail at most re-fetched
        f"slave re-appended {appended * record} bytes of {total_bytes}, though it had {copied_before} on disk"
    )


def test_master_kill9_restart_slave_resumes(broker_factory):
    master = broker_factory(0, TOPICS, system=NO_FAILOVER)
    slave = broker_factory(0, TOPICS, system=NO_FAILOVER, slave_props={"slaveId": 0})
    with BackgroundProducer(master, "orders", 2) as producer:
        wait_for(lambda: producer.acked >= 2000, 20, "a first part of the stream")
        master.kill()
    acked_before = producer.acked
    master.start()
    put(master, "orders", 0, 500)
    put(master, "orders", 1, 500)
    wait_caught_up(master, slave, PARTS)
    assert_identical(master)
    messages = sum(int(row["appended_messages"]) for row in replica_rows(slave).values())
    assert messages >= acked_before + 1000
    assert all(row["state"] == "following" for row in replica_rows(slave).values())
