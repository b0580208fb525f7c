"""Structured Streaming from a slave: offsets in the checkpoint, no loss, no duplicates."""

from __future__ import annotations

import json

import threading
import time

import pytest

from tests.spark.support import digest, partition_ends, produce, wait_caught_up

pytestmark = pytest.mark.spark
TOPIC = "stream"
SYSTEM = {"unflushInterval": 100}


def _stream(spark, zk, zk_root, **options):
    reader = (
        spark.readStream.format("metaq")
        .option("zkConnect", zk.connect_string)
        .option("zkRoot", zk_root)
        .option("topic", TOPIC)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_available_now_twice_no_loss_no_duplicates(spark, zk, zk_root, broker_factory, tmp_path):
    master = broker_factory(0, {TOPIC: 2}, SYSTEM)
    slave = broker_factory(0, {TOPIC: 2}, SYSTEM, slave_props={"slaveId": 0})
    first = produce(master, TOPIC, partitions=2, count=1500, tag="first-")
    wait_caught_up([master, slave], TOPIC, partition_ends(first))

    checkpoint, out = str(tmp_path / "checkpoint"), str(tmp_path / "out")
    seen: dict[tuple[str, int], str] = {}  # the idempotent sink: keyed by (partition, offset)
    batches: list[int] = []

    def upsert(batch_df, batch_id):
        rows = batch_df.select("partition", "offset", "data", "broker").collect()
        batches.append(len(rows))
        for r in rows:
            assert r.broker == slave.url
            seen[(r.partition, r.offset)] = digest(r.data)

    def run_once() -> None:
        df = _stream(spark, zk, zk_root, startingOffsets="earliest")
        parquet = (
            df.writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        dedupe = (
            df.writeStream.foreachBatch(upsert)
            .option("checkpointLocation", checkpoint + "-fb")
            .trigger(availableNow=True)
            .start()
        )
        parquet.awaitTermination(120)
        dedupe.awaitTermination(120)
        assert parquet.exception() is None and dedupe.exception() is None

    run_once()
    assert seen == {(m.partition, m.offset): m.digest for m in first}
    assert sum(batches) == len(first)  # no row delivered twice

    second = produce(master, TOPIC, partitions=2, count=1200, tag="second-")
    wait_caught_up([master, slave], TOPIC, partition_ends(second))
    run_once()  # resumes from the checkpoint: only the new messages
    everything = first + second
    assert seen == {(m.partition, m.offset): m.digest for m in everything}
    assert sum(batches) == len(everything)

    stored = spark.read.parquet(out).select("partition", "offset", "data").collect()
    assert len(stored) == len(everything)  # the file sink got each message exactly once
    assert {(r.partition, r.offset): digest(r.data) for r in stored} == {(m.partition, m.offset): m.digest for m in everything}


def test_processing_time_trigger_follows_new_messages(spark, zk, zk_root, broker_factory, tmp_path):
    master = broker_factory(0, {TOPIC: 2}, SYSTEM)
    slave = broker_factory(0, {TOPIC: 2}, SYSTEM, slave_props={"slaveId": 0})
    old = produce(master, TOPIC, partitions=2, count=300, tag="old-")
    wait_caught_up([master, slave], TOPIC, partition_ends(old))

    got: list[tuple[str, int]] = []
    lock = threading.Lock()

    def collect(batch_df, batch_id):
        rows = batch_df.select("partition", "offset").collect()
        with lock:
            got.extend((r.partition, r.offset) for r in rows)

    # Default startingOffsets for a stream is "latest": the old messages are not read.
    query = (
        _stream(spark, zk, zk_root)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        # Produce only after the first micro-batch pinned the initial offsets ("latest"): a
        # query slow to start (a loaded machine) would otherwise count the new messages as old.
        started = time.monotonic()
        while query.lastProgress is None:
            assert query.exception() is None and time.monotonic() - started < 60, "the query made no first batch"
            time.sleep(0.2)
        new = produce(master, TOPIC, partitions=2, count=800, tag="new-")
        expected = {(m.partition, m.offset) for m in new}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if len(got) >= len(expected):
                    break
            assert query.exception() is None
            time.sleep(0.2)
    finally:
        query.stop()
    assert sorted(got) == sorted(expected)


def test_rate_limits_cut_available_now_into_steps(spark, zk, zk_root, broker_factory, tmp_path):
    master = broker_factory(0, {TOPIC: 2}, SYSTEM)
    produced = produce(master, TOPIC, partitions=2, count=600, size=100, batch=100)  # 300 per partition, 120 B records
    wait_caught_up([master], TOPIC, partition_ends(produced))

    def run(name: str, **limit: str) -> list[list[tuple[str, int]]]:
        batches: list[list[tuple[str, int]]] = []

        def collect(batch_df, batch_id):
            batches.append([(r.partition, r.offset) for r in batch_df.select("partition", "offset").collect()])

        query = (_stream(spark, zk, zk_root, startingOffsets="earliest", readFrom="master", **limit)
                 .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / name))
                 .trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
        progress.extend(p for p in query.recentProgress if p["numInputRows"])
        everything = sorted(row for batch in batches for row in batch)
        assert everything == sorted((m.partition, m.offset) for m in produced)  # all of it, once
        return [batch for batch in batches if batch]

    progress: list[dict] = []
    # Both partitions are equally behind: each gets half of the limit per batch.
    assert [len(b) for b in run("messages", maxMessagesPerTrigger="200")] == [200, 200, 200]
    # Each progress shows the lag per partition: what was readable (latestOffset) past what the
    # batch read up to (endOffset), 200 and then 100 records behind, none after the last batch.
    lags = []
    for p in progress:
        source = p["sources"][0]
        latest, end = json.loads(source["latestOffset"]), json.loads(source["endOffset"])
        lags.append(sorted(latest[name] - end[name] for name in end))
    by_partition = [sorted((m.offset, m.end) for m in produced if m.partition == p) for p in {m.partition for m in produced}]
    behind = [sorted(records[-1][1] - records[read][0] for records in by_partition) for read in (100, 200)]
    assert lags == [*behind, [0, 0]], lags
    # Bytes: each partition's share (9000 B) ends at the first message boundary at or past it.
    size = {(m.partition, m.offset): m.end - m.offset for m in produced}
    by_bytes = run("bytes", maxBytesPerTrigger="18000")
    assert len(by_bytes) >= 4
    for i, batch in enumerate(by_bytes):
        for partition in {p for p, _ in batch}:
            share = sum(size[row] for row in batch if row[0] == partition)
            assert share < 9000 + max(size.values()), (i, partition, share)
            assert share >= 9000 or i >= len(by_bytes) - 2, (i, partition, share)  # only the tail is short


def test_fail_on_data_loss_when_retention_deleted_what_the_checkpoint_points_at(spark, zk, zk_root, broker_factory, tmp_path):
    from metaq.spark.fetch import ReplicaSession
    from tests.spark.support import replica

    aged = {"numPartitions": 1, "maxSegmentSize": 4096, "deletePolicy": "delete,1s", "deleteWhen": "* * * * * ?"}
    master = broker_factory(0, {TOPIC: aged}, SYSTEM)
    first = produce(master, TOPIC, partitions=1, count=20, size=100, tag="first-")  # 2.4 KB: the active segment only
    wait_caught_up([master], TOPIC, partition_ends(first))
    checkpoint = str(tmp_path / "ck")

    def run(**options: str) -> tuple[list[int], Exception | None]:
        rows: list[int] = []
        query = (_stream(spark, zk, zk_root, startingOffsets="earliest", readFrom="master", **options)
                 .writeStream.foreachBatch(lambda df, _id: rows.extend(r.offset for r in df.select("offset").collect()))
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        try:
            query.awaitTermination(120)
        except Exception:
            pass  # the query's own exception, below
        return rows, query.exception()

    rows, error = run()
    assert error is None and sorted(rows) == [m.offset for m in first]
    # More data rolls segments; retention deletes every closed one, the checkpoint's position too.
    later = produce(master, TOPIC, partitions=1, count=300, size=100, tag="later-")
    end = later[-1].end
    with ReplicaSession(replica(master)) as session:
        deadline = time.monotonic() + 60
        while (oldest := session.offsets(TOPIC, 0).min_offset) != session.segment_start(TOPIC, 0, end - 1):
            assert time.monotonic() < deadline, f"retention left the log starting at {oldest}"
            time.sleep(0.3)
    assert oldest > first[-1].end

    rows, error = run()
    assert rows == [] and error is not None
    assert f"partition 0-0 of topic {TOPIC}: offsets [{first[-1].end}, {oldest}) were deleted by retention" in str(error)
    assert "set option failOnDataLoss=false to skip to" in str(error)

    rows, error = run(failOnDataLoss="false")
    assert error is None and sorted(rows) == [m.offset for m in later if m.offset >= oldest]
