"""The metaq sink against real brokers (two broker groups) and a real local Spark: exactly once
through XA, read back by read-committed readers (the Spark source, reading the masters)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from metaq.client import Message, MetaClientConfig
from metaq.client.message import Partition
from metaq.client.selector import KeyHashPartitionSelector
from metaq.client.session import AsyncMessageSessionFactory
from metaq.client.xa import Xid
from metaq.tools.launcher import BrokerFactory
from tests.spark.support import committed, produce

pytestmark = pytest.mark.spark
TOPICS = {"keyed": 2, "failed": 2, "stream-in": 1, "stream-out": 2, "plain-a": 1, "plain-b": 1}
SYSTEM = {"unflushThreshold": 0}


@pytest.fixture(scope="module")
def cluster(zk, tmp_path_factory):
    """Two broker groups (0 and 1), each serving every test topic; one per module."""
    root = f"/meta-{uuid.uuid4().hex[:12]}"
    factory = BrokerFactory(tmp_path_factory.mktemp("sink"), zk.connect_string, root)
    try:
        masters = [factory(group, TOPICS, SYSTEM) for group in (0, 1)]
        yield zk.connect_string, root, masters
    finally:
        factory.stop_all()


def _write(df, zk_connect, root, topic, **options):
    writer = df.write.format("metaq").mode("append").option("zkConnect", zk_connect).option("zkRoot", root).option("topic", topic)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def _read(spark, zk_connect, root, topic):
    """(partition, offset, value) of every visible row, read committed from the masters."""
    df = (spark.read.format("metaq").option("zkConnect", zk_connect).option("zkRoot", root).option("topic", topic)
          .option("readFrom", "master").load())
    return sorted((Partition.parse(r.partition), r.offset, bytes(r.data)) for r in df.collect())


def _log_bytes(masters, topic) -> int:
    """Bytes in the topic's logs, visible or not (rolled-back records stay in the log)."""
    return sum(committed(m, topic, n) for m in masters for n in range(TOPICS[topic]))


def _in_doubt(zk_connect, root) -> list[Xid]:
    async def run() -> list[Xid]:
        async with AsyncMessageSessionFactory(MetaClientConfig(zk_connect=zk_connect, zk_root=root)) as factory:
            return [x for group in (0, 1) for x in await factory.create_xa_producer(group).xa_resource().recover()]

    return asyncio.run(run())


def test_batch_write_is_read_back_once_in_key_order(spark, cluster):
    zk_connect, root, masters = cluster
    from pyspark.sql import functions as F

    rows = 3000
    df = (spark.range(rows).withColumn("key", F.concat(F.lit("k"), (F.col("id") % 7).cast("string")))
          .withColumn("value", F.concat_ws(":", "key", F.col("id").cast("string")).cast("binary"))
          .repartition(3, "key").sortWithinPartitions("id"))
    _write(df, zk_connect, root, "keyed", batchBytes="2048")

    seen = _read(spark, zk_connect, root, "keyed")
    values = [v.decode() for _, _, v in seen]
    assert len(values) == rows and len(set(values)) == rows  # each row once
    partitions = sorted(Partition(g, n) for g in (0, 1) for n in range(TOPICS["keyed"]))
    placement = KeyHashPartitionSelector(key=lambda k: k, stable=True, all_partitions=partitions)
    last_id: dict[str, int] = {}
    for partition, _offset, value in seen:  # sorted by (partition, offset): the log order
        key, number = value.decode().split(":")
        assert partition == placement.select("keyed", partitions, key)  # the client's key-hash placement
        assert int(number) > last_id.get(key, -1), f"{key}: {number} after {last_id[key]}"
        last_id[key] = int(number)
    assert {p for p, _, _ in seen} == set(partitions)  # both groups took part: branches on two groups
    assert _in_doubt(zk_connect, root) == []


def test_at_least_once_mode_with_a_topic_column_and_string_values(spark, cluster):
    zk_connect, root, masters = cluster
    from pyspark.sql import functions as F

    df = spark.range(0, 1000, numPartitions=2).select(
        F.when(F.col("id") % 2 == 0, F.lit("plain-a")).otherwise(F.lit("plain-b")).alias("topic"),
        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("value"),  # a string column: sent as UTF-8
        F.lit("attr").alias("attribute"))
    _write(df, zk_connect, root, "plain-a", exactlyOnce="false")
    for topic, parity in (("plain-a", 0), ("plain-b", 1)):
        got = sorted(v.decode() for _, _, v in _read(spark, zk_connect, root, topic))
        assert got == sorted(f"row-{n}" for n in range(parity, 1000, 2))
    assert _in_doubt(zk_connect, root) == []


@pytest.mark.timeout(300)  # reading a partition of only rolled-back records once looped forever in the reader
def test_a_batch_write_failing_halfway_leaves_nothing_visible(spark, cluster):
    zk_connect, root, masters = cluster
    from pyspark.sql import functions as F

    @F.udf("binary")
    def payload(n: int) -> bytes:
        if n == 1900:
            raise ValueError("boom in the last task")
        return f"row-{n}".encode()

    df = spark.range(0, 2000, numPartitions=4).select(payload("id").alias("value"))
    with pytest.raises(Exception, match="boom in the last task"):
        _write(df, zk_connect, root, "failed", batchBytes="512")
    # Rows did reach the brokers (the other tasks prepared theirs, the failing one sent some)...
    assert _log_bytes(masters, "failed") > 0
    # ...and none is visible, nothing stays in doubt.
    assert _read(spark, zk_connect, root, "failed") == []
    assert _in_doubt(zk_connect, root) == []


def _prepared_branch(zk_connect, root, xid: Xid, text: str) -> None:
    """A branch a task of an earlier run left prepared (its driver died before committing it)."""

    async def run() -> None:
        async with AsyncMessageSessionFactory(MetaClientConfig(zk_connect=zk_connect, zk_root=root)) as factory:
            producer = factory.create_xa_producer(0)
            resource = producer.xa_resource()
            await resource.start(xid)
            await producer.send_message(Message("stream-out", text.encode()))
            await resource.end(xid)
            assert await resource.prepare(xid) == resource.XA_OK

    asyncio.run(run())


def test_a_micro_batch_rerun_after_a_driver_crash_is_not_written_twice(spark, cluster, tmp_path):
    zk_connect, root, masters = cluster
    from metaq.spark.sink import STREAM_FORMAT_ID, xid_scope

    produce(masters[0], "stream-in", partitions=1, count=400, size=40, tag="in-")
    checkpoint = tmp_path / "checkpoint"

    def run_once() -> None:
        stream = (spark.readStream.format("metaq").option("zkConnect", zk_connect).option("zkRoot", root)
                  .option("topic", "stream-in").option("readFrom", "master").option("startingOffsets", "earliest").load())
        query = (stream.selectExpr("data AS value", "attribute").writeStream.format("metaq")
                 .option("zkConnect", zk_connect).option("zkRoot", root).option("topic", "stream-out")
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()

    run_once()
    first = _read(spark, zk_connect, root, "stream-out")
    assert len(first) == 400 and len({v for _, _, v in first}) == 400

    # The driver died after the sink committed batch 0 and before Spark's commit log said so:
    # Spark re-runs batch 0 from the same offsets. Its first run had left two branches in
    # doubt: one the sink had decided to commit (it died mid-commit), one it had not.
    batch = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for name in (str(batch), f".{batch}.crc"):  # the entry and its checksum file, as if never written
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    query_id = uuid.UUID(json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"])
    scope = xid_scope(STREAM_FORMAT_ID, query_id, batch)
    decided, undecided = Xid(*scope, b"\0\0\0\x07decided"), Xid(*scope, b"\0\0\0\x08undecided")
    _prepared_branch(zk_connect, root, decided, "decided-but-not-committed")
    _prepared_branch(zk_connect, root, undecided, "never-decided")
    decision = checkpoint / "metaq-sink" / str(batch)
    data = json.loads(decision.read_text())
    data["branches"].append([0, str(decided)])
    decision.write_text(json.dumps(data))
    before = _log_bytes(masters, "stream-out")

    run_once()
    assert _log_bytes(masters, "stream-out") > before  # the re-run did write its rows, in branches...
    again = [v for _, _, v in _read(spark, zk_connect, root, "stream-out")]
    # ...that never show: every input row once, the decided leftover committed, the other rolled back.
    assert sorted(again) == sorted([v for _, _, v in first] + [b"decided-but-not-committed"])
    assert _in_doubt(zk_connect, root) == []
