"""The metaq sink against real brokers (two broker groups) and a real local Spark: exactly once
through XA, read back by read-committed readers (the Spark source, reading the masters)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from chaos.transactions import read_committed
from metaq.client import Message, MetaClientConfig
from metaq.client.message import Partition
from metaq.client.selector import KeyHashPartitionSelector
from metaq.client.session import AsyncMessageSessionFactory
from metaq.client.connection import BrokerConnection
from metaq.client.xa import Xid
from metaq.record import encode_record
from metaq.tools.launcher import BrokerFactory
from tests.spark.conftest import REPO
from tests.spark.support import committed, produce

pytestmark = pytest.mark.spark
TOPICS = {"keyed": 2, "failed": 2, "stream-in": 1, "stream-out": 2, "plain-a": 1, "plain-b": 1,
          "late-abort": 1, "late-commit": 1, "late-stream": 1, "late-killed": 1, "driver-in": 1, "driver-out": 2,
          "placed-a": 2, "placed-b": 1, "too-big": 1}
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


@pytest.mark.parametrize("encoder", ["compiled", "python"])
def test_rows_go_where_their_partition_name_or_topic_says_each_partition_in_row_order(spark, cluster, monkeypatch, encoder):
    """A task's Arrow batches (write_task, as Spark hands them): a topic column with null and empty
    topics (the option's), a partition column with null names (spread a put at a time); the
    compiled encoder and the pure-Python one (no compiler) write the same rows to the same places."""
    import pyarrow as pa

    from metaq.client import codec
    from metaq.spark.sink import write_task
    from metaq.spark.sink_options import SinkOptions

    if encoder == "python":
        monkeypatch.setattr(codec, "compiled_encode_columns", None)
        monkeypatch.setattr(codec, "compiled_key_crc32", None)
    zk_connect, root, masters = cluster
    tag = encoder[0]
    topics = [None, "placed-b", "", "placed-a"]
    names = ["1-1", None, "0-0", "1-0", None]
    rows = [(topics[n % 4], None if topics[n % 4] == "placed-b" else names[n % 5], f"{tag}{n}".encode()) for n in range(3000)]
    batches = [pa.record_batch({"topic": pa.array([t for t, _, _ in rows[s:s + 700]], pa.string()),
                                "partition": pa.array([p for _, p, _ in rows[s:s + 700]], pa.string()),
                                "value": pa.array([v for _, _, v in rows[s:s + 700]], pa.binary()),
                                "attribute": pa.array([None if n % 3 else "a" for n in range(s, min(s + 700, 3000))], pa.string())})
               for s in range(0, 3000, 700)]
    options = SinkOptions(zk_connect=zk_connect, zk_root=root, topic="placed-a", exactly_once=False, batch_bytes=1000)
    _, count = asyncio.run(write_task(options, batches, None, 0))
    assert count == 3000

    seen = {topic: [(p, v.decode()) for p, _, v in _read(spark, zk_connect, root, topic) if v.startswith(tag.encode())]
            for topic in ("placed-a", "placed-b")}
    want = {topic: [(n, name) for n, (t, name, _) in enumerate(rows) if (t or "placed-a") == topic] for topic in seen}
    for topic in seen:
        assert sorted(int(v[1:]) for _, v in seen[topic]) == [n for n, _ in want[topic]]  # each row once
        for partition, value in seen[topic]:
            name = rows[int(value[1:])][1]
            assert name is None or partition == Partition.parse(name)
        # Rows of a partition in row order (the read is sorted by partition, then log order).
        for partition in {p for p, _ in seen[topic]}:
            numbers = [int(v[1:]) for p, v in seen[topic] if p == partition]
            assert numbers == sorted(numbers)
    spread = {p for p, v in seen["placed-a"] if rows[int(v[1:])][1] is None}
    assert len(spread) > 1  # rows without a name are spread over the partitions, a put at a time
    assert {p for p, _ in seen["placed-b"]} == {Partition(0, 0), Partition(1, 0)}


def test_a_row_over_max_message_size_fails_the_write_naming_it_and_nothing_shows(spark, cluster):
    zk_connect, root, masters = cluster
    from pyspark.sql import functions as F

    # Two tasks of 1000 rows; the second task's row 500 (id 1500) is 600 bytes.
    df = spark.range(0, 2000, numPartitions=2).select(
        F.when(F.col("id") == 1500, F.repeat(F.lit("x"), 600)).otherwise(F.col("id").cast("string")).cast("binary").alias("value"))
    with pytest.raises(Exception, match=r"metaq sink: row 500: its record's payload is 600 bytes, more than maxMessageSize \(500\)"):
        _write(df, zk_connect, root, "too-big", maxMessageSize="500", batchBytes="256")
    nulls = spark.range(0, 10, numPartitions=1).select(F.when(F.col("id") != 7, F.lit(b"v")).alias("value"))
    with pytest.raises(Exception, match=r"metaq sink: row 7: the value is null \(column value is required\)"):
        _write(nulls, zk_connect, root, "too-big")
    assert _read(spark, zk_connect, root, "too-big") == []
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


def _prepared_branch(zk_connect, root, xid: Xid, text: str, topic: str = "stream-out", timeout_s: int = 0) -> None:
    """A branch a task of an earlier run left prepared (its driver died before committing it)."""

    async def run() -> None:
        async with AsyncMessageSessionFactory(MetaClientConfig(zk_connect=zk_connect, zk_root=root)) as factory:
            producer = factory.create_xa_producer(0)
            resource = producer.xa_resource()
            resource.set_transaction_timeout(timeout_s)
            await resource.start(xid)
            await producer.send_message(Message(topic, text.encode()))
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


# --- attempts that outlive the driver's decision -------------------------------------------------
# Spark calls the driver's commit or abort without waiting for the attempts it is still killing
# (the failed job's other tasks, a speculative loser): they can prepare after the driver's
# recover sweep. These tests drive the sink's halves directly, as Spark calls them, so that the
# late prepare deterministically comes after the driver's decision.


def _visible(masters, topic) -> list[bytes]:
    """What a read-committed consumer gets from the topic now, every partition of both groups."""

    async def run() -> list[bytes]:
        return [m for master in masters for n in range(TOPICS[topic]) for m in await read_committed(master.address, topic, n)]

    return sorted(asyncio.run(run()))


class _LateAttempt:
    """A task attempt that has sent its rows and reaches its prepare only when released."""

    def __init__(self, options, xid: Xid, partition_id: int, rows: list[bytes]) -> None:
        import pyarrow as pa
        from metaq.spark.sink import write_task

        self.sent, self.release = threading.Event(), threading.Event()
        self.branches: tuple | None = None

        def batches():
            yield pa.record_batch({"value": rows})
            self.sent.set()  # the writer asks for more: the rows of full chunks went out
            assert self.release.wait(60)

        def run() -> None:
            self.branches, _ = asyncio.run(write_task(options, batches(), xid, partition_id))

        self.thread = threading.Thread(target=run)
        self.thread.start()
        assert self.sent.wait(60)

    def finish(self) -> tuple:
        self.release.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.branches


@pytest.mark.parametrize("decision", ["batch-abort", "batch-commit", "stream-commit"])
def test_an_attempt_that_prepares_after_the_driver_decided_rolls_itself_back(cluster, tmp_path, decision):
    zk_connect, root, masters = cluster
    from metaq.spark.sink import STREAM_FORMAT_ID, MetaQBatchWriter, MetaQStreamWriter, SinkCommit, task_xid, write_task, xid_scope
    from metaq.spark.sink_options import SinkOptions
    import pyarrow as pa

    topic = {"batch-abort": "late-abort", "batch-commit": "late-commit", "stream-commit": "late-stream"}[decision]
    options = SinkOptions.parse({"zkConnect": zk_connect, "zkRoot": root, "topic": topic, "batchBytes": "64",
                                 "checkpointLocation": str(tmp_path)})
    query = uuid.uuid4()
    if decision == "stream-commit":
        writer = MetaQStreamWriter(options)
        scope = xid_scope(STREAM_FORMAT_ID, query, 0)
    else:
        writer = MetaQBatchWriter(options)
        scope = writer.scope
    won = [f"won-{n}".encode() for n in range(40)]
    lost = [f"lost-{n}".encode() for n in range(40)]
    # Partition 0's winning attempt, reported; its twin (a speculative loser, or with abort a task
    # Spark is still killing) has sent its rows and prepares only after the driver's decision.
    late = _LateAttempt(options, task_xid(scope, 0), 0, lost)
    if decision == "batch-abort":
        writer.abort([None])
    else:
        branches, rows = asyncio.run(write_task(options, [pa.record_batch({"value": won})], task_xid(scope, 0), 0))
        assert branches  # prepared on the groups it wrote to
        if decision == "stream-commit":
            writer.commit([SinkCommit(branches, rows, str(query))], 0)
        else:
            writer.commit([SinkCommit(branches, rows)])
    assert late.finish() == ()  # it found its write decided and reported nothing

    assert _visible(masters, topic) == ([] if decision == "batch-abort" else sorted(won))
    assert _log_bytes(masters, topic) > 0  # the late attempt's rows did reach the logs...
    assert _in_doubt(zk_connect, root) == []  # ...and it left nothing in doubt


def test_a_branch_left_in_a_closed_write_is_rolled_back_by_the_next_sink_decision(cluster):
    """An attempt killed between its prepare and its check leaves its branch prepared in a
    closed write: the next decision of any sink write against the cluster rolls it back."""
    zk_connect, root, masters = cluster
    from metaq.spark.sink import MetaQBatchWriter, task_xid
    from metaq.spark.sink_options import SinkOptions

    options = SinkOptions.parse({"zkConnect": zk_connect, "zkRoot": root, "topic": "late-killed"})
    aborted = MetaQBatchWriter(options)
    aborted.abort([None])
    killed = task_xid(aborted.scope, 3)
    _prepared_branch(zk_connect, root, killed, "killed-after-prepare", topic="late-killed")
    assert _in_doubt(zk_connect, root) == [killed]

    MetaQBatchWriter(options).abort([None])  # another write's decision sweeps closed writes too
    assert _in_doubt(zk_connect, root) == []
    assert _visible(masters, "late-killed") == []


def test_a_branch_the_broker_rolled_back_on_its_timeout_is_forgotten_by_the_sweep(cluster):
    """recover lists a heuristically rolled-back branch until its transaction manager forgets it."""
    zk_connect, root, _ = cluster
    from metaq.spark.sink import MetaQBatchWriter, task_xid
    from metaq.spark.sink_options import SinkOptions

    writer = MetaQBatchWriter(SinkOptions.parse({"zkConnect": zk_connect, "zkRoot": root, "topic": "late-killed"}))
    expired = task_xid(writer.scope, 0)
    _prepared_branch(zk_connect, root, expired, "timed-out", topic="late-killed", timeout_s=1)
    time.sleep(1.5)  # past the branch's deadline (1 s after its prepare): it binds from then on
    assert _in_doubt(zk_connect, root) == [expired]  # heuristically rolled back, still listed
    writer.abort([None])
    assert _in_doubt(zk_connect, root) == []


# --- kill -9 of the driver --------------------------------------------------------------------


def _produce_keyed(master, topic: str, count: int, keys: int) -> None:
    """Payloads ``k{n % keys}:{n}``, n = 0..count-1, in that order into partition 0 of ``master``."""

    async def run() -> None:
        conn = await BrokerConnection.open(master.host, master.port)
        try:
            for first in range(0, count, 100):
                records = [encode_record(f"k{n % keys}:{n}".encode()) for n in range(first, min(first + 100, count))]
                reply = await conn.request({"op": "put", "topic": topic, "partition": 0, "count": len(records)}, b"".join(records))
                assert reply.ok, reply.header
        finally:
            conn.close()

    asyncio.run(run())


def _entries(directory: Path) -> set[int]:
    """Batch ids with an entry in a checkpoint directory (``commits``, ``metaq-sink``)."""
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()} if directory.is_dir() else set()


def _stream_job(zk_connect: str, root: str, checkpoint: Path, log: Path, *flags: str) -> subprocess.Popen:
    """The driver (tests/spark/stream_job.py) in its own OS process and session: its JVM is its child."""
    command = [sys.executable, "-m", "tests.spark.stream_job", "--zk", zk_connect, "--zk-root", root,
               "--source", "driver-in", "--sink", "driver-out", "--checkpoint", str(checkpoint), "--max-messages", "100",
               *flags]
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.timeout(300)
def test_kill_9_of_the_driver_during_a_commit_and_a_restart_write_each_row_once(cluster, tmp_path):
    zk_connect, root, masters = cluster
    rows, keys = 300, 7  # three micro-batches of 100: one before the kill, one killed in its commit, one after
    _produce_keyed(masters[0], "driver-in", rows, keys)
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
    decisions, commits = checkpoint / "metaq-sink", checkpoint / "commits"

    driver = _stream_job(zk_connect, root, checkpoint, log)
    try:
        # Kill the whole driver (Python and its JVM: one process group) inside a micro-batch's
        # commit: the sink has written its decision for batch N, Spark's commit log has no N yet.
        deadline = time.monotonic() + 180
        while not (in_commit := {n for n in _entries(decisions) - _entries(commits) if n >= 1}):
            assert driver.poll() is None, f"the driver ended before it could be killed: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no commit of a batch after the first seen within 180 s"
            time.sleep(0.002)
        os.killpg(driver.pid, signal.SIGKILL)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
    killed_in = min(in_commit)
    visible_at_kill = len(_visible(masters, "driver-out"))
    assert 0 < visible_at_kill < rows  # mid-stream: some batches through, not all

    # The restarted driver also meets task failures: the first attempt of each task holding a
    # record numbered n % 100 == 50 fails mid-write, and Spark retries it.
    restarted = _stream_job(zk_connect, root, checkpoint, log, "--fail-first-attempts")
    try:
        assert restarted.wait(180) == 0, log.read_text()[-3000:]
        assert "injected task failure" in log.read_text()  # the retried attempts were there
    finally:
        if restarted.poll() is None:
            os.killpg(restarted.pid, signal.SIGKILL)
            restarted.wait(30)
    assert killed_in in _entries(commits)  # Spark re-ran the batch it was committing, and committed it

    # Every input row exactly once; a key's rows all in one partition, in input order.
    seen: dict[int, int] = {}
    partition_of: dict[str, tuple[int, int]] = {}
    last: dict[str, int] = {}
    for group, master in enumerate(masters):
        for n in range(TOPICS["driver-out"]):
            for value in asyncio.run(read_committed(master.address, "driver-out", n)):
                key, number = value.decode().split(":")
                seen[int(number)] = seen.get(int(number), 0) + 1
                assert partition_of.setdefault(key, (group, n)) == (group, n), f"{key} in two partitions"
                assert int(number) > last.get(key, -1), f"{key}: {number} after {last[key]} in partition {group}-{n}"
                last[key] = int(number)
    duplicates = sorted(n for n, times in seen.items() if times > 1)
    lost = sorted(set(range(rows)) - set(seen))
    assert (duplicates, lost) == ([], [])
    assert _in_doubt(zk_connect, root) == []
