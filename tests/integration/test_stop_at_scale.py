"""A SIGTERM'd broker of a sync pair with thousands of partitions exits within the stop bound
(docs/operations.md, "Stopping"), whatever its replication is doing at the time.

A slave that starts following walks every partition with two round trips to its master
(truncation against the master's log, then a copy of its epoch history): at 10,000
partitions that walk took 18 s on a loaded machine, and the stop waited for it. Here the
slave is SIGTERMed in that walk while its master is paused (SIGSTOP), so the request in
flight is never answered: before, the stop waited out the request's timeout and the
coordinator's own 10 s wait; now the walk ends at once. Then the master is SIGTERMed while
the restarted slave replicates and a producer writes to every partition, and the slave as
it takes over from it. Last, a broker whose ZooKeeper is frozen: each ZooKeeper step of the
stop waits 3 s, not zk.zkConnectionTimeoutMs.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time

from metaq.client.connection import BrokerConnection
from metaq.record import encode_batch
from metaq.tools.launcher import BrokerFactory, BrokerProcess, wait_until
from metaq.zk.embedded import EmbeddedZooKeeper

from .replication_support import replica_rows
from .test_sync_replication import wait_sync_set

PARTITIONS = 2000
TOPICS = {"wide": PARTITIONS}
PAIR = {"replicationMode": "sync", "onSyncSlaveLoss": "degrade", "syncSlaveTimeoutMs": 3000, "unflushThreshold": 0}
#: Long enough that the paused master keeps its lock while the slave stops (no takeover).
ZOOKEEPER = {"zk.zkSessionTimeoutMs": 15000}
#: docs/operations.md, "Stopping": a SIGTERM'd broker exits within this (zk.zkSyncTimeMs is 0 here).
STOP_BOUND_S = 10.0


async def _put_everywhere(address: tuple[str, int], tag: str, stop: threading.Event | None = None) -> int:
    """A put to every partition, 200 in flight; with ``stop``, round after round until it is
    set (a broker going away ends it). How many were acked."""
    acked = 0
    try:
        conn = await BrokerConnection.open(*address)
    except ConnectionError:
        return 0
    try:
        while True:
            for first in range(0, PARTITIONS, 200):
                futures = [conn.send({"op": "put", "topic": "wide", "partition": p},
                                     encode_batch([(f"{tag}-{p}".encode(), None)]))
                           for p in range(first, min(first + 200, PARTITIONS))]
                acked += sum(1 for reply in await asyncio.gather(*futures) if reply.ok)
            if stop is None or stop.is_set():
                return acked
    except ConnectionError:
        return acked
    finally:
        conn.close()


def all_following(slave: BrokerProcess) -> bool:
    rows = replica_rows(slave)
    return len(rows) == PARTITIONS and all(row["state"] == "following" for row in rows.values())


def assert_stops_within_bound(broker: BrokerProcess) -> None:
    """SIGTERM ``broker``: it exits 0 within the bound with its stop line (killed past it)."""
    process = broker._process
    assert process is not None
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        broker.kill()
        raise AssertionError(f"{broker.name} still running {STOP_BOUND_S} s after SIGTERM; log:\n"
                             f"{broker.log_text(last_lines=20)}") from None
    assert code == 0, broker.log_text(last_lines=20)
    assert f"broker {broker.broker_id} stopped" in broker.log_text(last_lines=5)
    broker.stop()  # reaps it and closes its log file


def test_sigterm_stops_a_slave_mid_truncation_and_a_master_mid_replication_within_the_bound(
        broker_factory, zk_client, zk_root) -> None:  # noqa: ANN001
    master = broker_factory(0, TOPICS, PAIR, zookeeper=ZOOKEEPER)
    slave = broker_factory(0, TOPICS, PAIR, {"slaveId": 0}, zookeeper=ZOOKEEPER)
    wait_until(lambda: all_following(slave), 120, interval=0.5, message="every partition to replicate")
    assert asyncio.run(_put_everywhere(master.address, "first")) == PARTITIONS

    # The slave starts again and walks its 2,000 partitions against the master, which is
    # paused in the middle: the stop must not wait for an answer that never comes.
    slave.stop()
    log_start = len(slave.log_text())
    slave.start(wait=False)
    wait_until(lambda: "--master_changed--> following" in slave.log_text()[log_start:], 60, interval=0.02,
               message="the slave to start following")
    master.pause()
    try:
        assert "follows the master" not in slave.log_text()[log_start:], "the walk ended before the pause"
        assert_stops_within_bound(slave)
        assert "stopped truncating against the master" in slave.log_text()[log_start:]
    finally:
        master.resume()

    # The master, while the slave replicates and a producer writes to every partition.
    slave.start()
    wait_sync_set(zk_client, zk_root, [0], timeout=120)  # so that it may take over below
    stop = threading.Event()
    producer = threading.Thread(target=lambda: asyncio.run(_put_everywhere(master.address, "second", stop)))
    producer.start()
    log_start = len(slave.log_text())
    try:
        time.sleep(2)
        assert_stops_within_bound(master)
    finally:
        stop.set()
        producer.join(30)

    # The slave takes over from the stopped master: SIGTERMed as it starts to lead (the
    # epoch's start goes into every partition's history, a walk over all 2,000).
    wait_until(lambda: "--won--> leading" in slave.log_text()[log_start:], 60, interval=0.02,
               message="the slave to take over")
    assert_stops_within_bound(slave)


def test_sigterm_with_zookeeper_not_answering_waits_at_most_3_s_per_zookeeper_step(tmp_path) -> None:  # noqa: ANN001
    """ZooKeeper frozen (SIGSTOP) under a registered broker: deleting its nodes and closing its
    session wait 3 s each, not zk.zkConnectionTimeoutMs (30 s here, the default)."""
    zk = EmbeddedZooKeeper(data_dir=tmp_path / "zookeeper", tick_ms=200)
    zk.start()
    factory = BrokerFactory(tmp_path, zk.connect_string, "/meta")
    try:
        broker = factory(0, {"few": 4}, zookeeper={"zk.zkSessionTimeoutMs": 30000, "zk.zkConnectionTimeoutMs": 30000})
        zk.pause()
        process = broker._process
        assert process is not None
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        # Two ZooKeeper steps of 3 s, the callbacks' 3 s and the worker threads' 3 s at most.
        assert time.monotonic() - started < 13, broker.log_text(last_lines=10)
        text = broker.log_text()
        assert "deregistering broker 0 failed" in text and "broker 0 stopped" in text
    finally:
        zk.resume()
        factory.stop_all()
        zk.stop()

