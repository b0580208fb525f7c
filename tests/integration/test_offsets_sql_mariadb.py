"""Consumer offsets in a real MariaDB: a consumer process and the master are killed -9, and
the consumer's successor resumes from the offsets in MariaDB on the new master."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from metaq.client import Message, MessageSessionFactory, MetaClientConfig
from metaq.client.message import Partition
from metaq.client.offsets import Position
from metaq.client.offsets_sql import DEFAULT_TABLE_NAME, SqlOffsetStore
from tests.harness import REPO_ROOT, wait_until
from tests.integration.failover_support import TOPIC, Group, make_pair, sync_system, wait_leads
from tests.integration.mariadb_support import MariaDB

GROUP = "billing"


@pytest.fixture
def mariadb(tmp_path):
    server = MariaDB(tmp_path / "mariadb").start()
    try:
        yield server
    finally:
        server.stop()


class ConsumerProcess:
    def __init__(self, tmp: Path, name: str, zk: str, zk_root: str, url: str) -> None:
        self.out = tmp / f"{name}.out"
        self.err = tmp / f"{name}.err"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.sql_consumer_main", zk, zk_root, TOPIC, GROUP, url],
            stdout=open(self.out, "wb"), stderr=open(self.err, "wb"), cwd=REPO_ROOT,
            env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        )

    def consumed(self) -> list[tuple[str, int, str]]:
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        return [(p, int(o), d) for p, o, d in (line.split("\t") for line in lines if line.count("\t") == 2)]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


def stored_offsets(mariadb: MariaDB) -> dict[str, int]:
    if not mariadb.query(f"SHOW TABLES LIKE '{DEFAULT_TABLE_NAME}'"):
        return {}  # the first consumer creates it
    rows = mariadb.query(f"SELECT `partition`, `offset` FROM {DEFAULT_TABLE_NAME} WHERE group_id = '{GROUP}' AND topic = '{TOPIC}'")
    return {partition: int(offset) for partition, offset in rows}


def test_store_round_trip_on_mariadb(mariadb) -> None:
    store = SqlOffsetStore(mariadb.url)
    store.commit_now("g", "t", {Partition(0, 0): Position(2**40, 3 * 2**31), Partition(0, 1): Position(-1, 0)})
    store.commit_now("g", "t", {Partition(0, 0): Position(2**41, 3 * 2**31 + 20)})
    assert store.load_now("g", "t", Partition(0, 0)) == Position(2**41, 3 * 2**31 + 20)
    assert store.load_now("g", "t", Partition(1, 0)) is None
    assert sorted(mariadb.query(f"SELECT `partition`, `offset`, msg_id FROM {DEFAULT_TABLE_NAME}")) == [
        ("0-0", 3 * 2**31 + 20, 2**41), ("0-1", 0, -1)]
    # A second store (another consumer) finds the existing table and the rows.
    assert SqlOffsetStore(mariadb.url).load_now("g", "t", Partition(0, 1)) == Position(-1, 0)
    store.close()


def test_consumer_killed_9_resumes_from_offsets_in_mariadb_after_failover(broker_factory, zk, zk_root, zk_client, mariadb, tmp_path) -> None:
    group = Group(zk_client, zk_root)
    # Sync replication: every acked message is on the slave, so the failover loses none.
    master, slave = make_pair(broker_factory, sync_system(), group, partitions=2)
    sent = [f"m{i:05d}" for i in range(600)]
    with MessageSessionFactory(MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root)) as factory:
        producer = factory.create_producer()
        # Batches of 50: the round robin picks one partition per batch, so both get messages.
        results = [r for i in range(0, len(sent), 50) for r in producer.send_batch([Message(TOPIC, d.encode()) for d in sent[i:i + 50]])]
    assert all(r.success for r in results) and {str(r.partition) for r in results} == {"0-0", "0-1"}

    first = ConsumerProcess(tmp_path, "first", zk.connect_string, zk_root, mariadb.url)
    second = None
    try:
        # Kill it mid-stream, once it has committed some progress on both partitions.
        wait_until(lambda: len(stored_offsets(mariadb)) == 2 and all(stored_offsets(mariadb).values())
                   and len(first.consumed()) >= 150, 60, interval=0.05, message="first consumer committed progress")
        first.process.kill()
        first.process.wait()
        by_first = first.consumed()
        committed = stored_offsets(mariadb)
        assert len(by_first) < len(sent), "killed before the end: the test must cover a resume"
        # The master dies too: the successor reads from the promoted slave, at the same offsets.
        epoch = group.epoch()
        master.kill()
        wait_leads(slave, group, epoch)

        second = ConsumerProcess(tmp_path, "second", zk.connect_string, zk_root, mariadb.url)
        wait_until(lambda: {d for _, _, d in by_first + second.consumed()} >= set(sent), 60,
                   message="every message consumed by one of the two")
        by_second = second.consumed()
    finally:
        first.stop()
        if second is not None:
            second.stop()

    # The successor starts each partition exactly at the offset stored in MariaDB:
    # not at the start (nothing before it again), not later (nothing skipped).
    starts: dict[str, int] = {}
    for partition, offset, _ in by_second:
        starts.setdefault(partition, offset)
    for partition, offset in committed.items():
        if partition in starts:
            assert starts[partition] == offset, (partition, starts, committed)
    assert all(offset >= committed[p] for p, offset, _ in by_second)
    # At least once: redelivered only what the first consumed after its last commit.
    again = defaultdict(int)
    for partition, offset, data in by_first:
        if offset >= committed[partition]:
            again[data] += 1
    assert {d for _, _, d in by_second} & {d for _, _, d in by_first} <= set(again)
    assert len(by_second) == len(sent) - sum(1 for p, o, _ in by_first if o < committed[p])
    assert stored_offsets(mariadb) != committed, "the successor committed its own progress"
    assert "Traceback" not in second.err.read_text()
