"""Batch reads with real PySpark against real ZooKeeper and broker processes."""

from __future__ import annotations

import threading
import time

import pytest

from tests.spark.support import (
    digest,
    get_counters,
    partition_ends,
    produce,
    wait_caught_up,
)

pytestmark = pytest.mark.spark
TOPIC = "events"
#: Async mode commits what is flushed: flush often so that tests need not wait 10 s.
SYSTEM = {"unflushInterval": 100}


def _rows(df):
    return [(r.partition, r.offset, r.attribute, digest(r.data), r.broker) for r in df.collect()]


def _expected(produced):
    return sorted((m.partition, m.offset, m.attribute, m.digest) for m in produced)


def _reader(spark, zk, zk_root, **options):
    reader = spark.read.format("metaq").option("zkConnect", zk.connect_string).option("zkRoot", zk_root).option("topic", TOPIC)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_from_slave_is_exact_and_spares_the_master(spark, zk, zk_root, broker_factory):
    master = broker_factory(0, {TOPIC: 2}, SYSTEM)
    slave = broker_factory(0, {TOPIC: 2}, SYSTEM, slave_props={"slaveId": 0})
    produced = produce(master, TOPIC, partitions=2, count=3000, size=120)
    wait_caught_up([master, slave], TOPIC, partition_ends(produced))
    master_before = get_counters(master)
    slave_before = get_counters(slave)

    df = _reader(spark, zk, zk_root)
    assert [f.name for f in df.schema.fields] == ["topic", "partition", "offset", "msg_id", "attribute", "data", "broker"]
    rows = _rows(df)

    assert len(rows) == len(produced) == 3000
    assert sorted(r[:4] for r in rows) == _expected(produced)
    assert {r[4] for r in rows} == {slave.url}
    # Every row read from the slave: the master served no consumer fetch at all.
    assert get_counters(master) == master_before
    slave_requests, slave_bytes = get_counters(slave)
    assert slave_requests > slave_before[0] and slave_bytes - slave_before[1] >= sum(m.end - m.offset for m in produced)
    # msg ids are what the master stamped: unique and increasing within a partition.
    ids = df.select("partition", "offset", "msg_id").collect()
    by_partition: dict[str, list] = {}
    for r in sorted(ids, key=lambda r: (r.partition, r.offset)):
        by_partition.setdefault(r.partition, []).append(r.msg_id)
    for values in by_partition.values():
        assert values == sorted(values) and len(set(values)) == len(values)


def test_split_ranges_and_explicit_offsets(spark, zk, zk_root, broker_factory):
    # Small segments, so split points use segment starts and header walks both.
    master = broker_factory(0, {TOPIC: {"numPartitions": 2, "maxSegmentSize": 64 * 1024}}, SYSTEM)
    slave = broker_factory(0, {TOPIC: {"numPartitions": 2, "maxSegmentSize": 64 * 1024}}, SYSTEM, slave_props={"slaveId": 0})
    produced = produce(master, TOPIC, partitions=2, count=4000, size=150, batch=100)
    wait_caught_up([master, slave], TOPIC, partition_ends(produced))

    df = _reader(spark, zk, zk_root, maxBytesPerPartition=50_000)
    assert df.rdd.getNumPartitions() >= 2 * (partition_ends(produced)[0] // 50_000)
    rows = _rows(df)
    assert len(rows) == len(produced)
    assert sorted(r[:4] for r in rows) == _expected(produced)

    # An explicit window: partition 0-0 from its 100th message up to its 1000th, 0-1 all but nothing.
    p0 = sorted((m for m in produced if m.partition == "0-0"), key=lambda m: m.offset)
    p1_end = partition_ends(produced)[1]
    start, end = p0[100].offset, p0[1000].offset
    df = _reader(
        spark, zk, zk_root,
        startingOffsets=f'{{"0-0": {start}, "0-1": "latest"}}',
        endingOffsets=f'{{"0-0": {end}, "0-1": {p1_end}}}',
        maxBytesPerPartition=20_000,
    )
    rows = _rows(df)
    assert sorted(r[:4] for r in rows) == _expected(p0[100:1000])


def test_batch_survives_the_slave_dying_mid_read(spark, zk, zk_root, broker_factory):
    master = broker_factory(0, {TOPIC: 2}, SYSTEM)
    slaves = [broker_factory(0, {TOPIC: 2}, SYSTEM, slave_props={"slaveId": k}) for k in (0, 1)]
    produced = produce(master, TOPIC, partitions=2, count=24_000, size=1000, batch=100)
    wait_caught_up([master, *slaves], TOPIC, partition_ends(produced), timeout=60)
    before = {s.name: get_counters(s)[0] for s in slaves}
    master_before = get_counters(master)

    # Small fetches make the read take a few seconds, so that the kill lands inside it.
    df = _reader(spark, zk, zk_root, fetchBytes=8192)
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["rows"] = _rows(df)
        except BaseException as exc:  # noqa: BLE001
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline and thread.is_alive():
        for s in slaves:
            if get_counters(s)[0] - before[s.name] >= 20:  # it is serving the read now
                victim = s
                break
        time.sleep(0.02)
    assert victim is not None, "the read never reached a slave"
    victim.kill()
    thread.join(120)
    assert not thread.is_alive()
    assert "error" not in result, result.get("error")
    rows = result["rows"]
    survivor = next(s for s in slaves if s is not victim)

    assert len(rows) == len(produced)
    assert sorted(r[:4] for r in rows) == _expected(produced)
    brokers = {r[4] for r in rows}
    assert victim.url in brokers and survivor.url in brokers  # part before, part after the kill
    assert get_counters(master) == master_before  # readFrom=slave never falls back to the master
