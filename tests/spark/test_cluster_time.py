"""The source started at a time (``startingTimestamp``) with executors in their own JVMs.

Spark's ``local-cluster[2,1,1024]`` master: two executor JVMs launched as their own processes,
each with its own Python workers, as on a real cluster. The driver plans the read (one
``offset_for_time`` per partition, asked of the slave) and the executors' tasks read the
ranges from the slave, so the plan (options, the per-partition start offsets the lookup
found) must travel to them pickled. ``readFrom=slave``: every lookup and every fetch is the
slave's (a slave registers its partitions only while it follows a master, so the master stays up).

The expected rows come from the producer's side, not from Spark: two waves of messages with
a pause between them, the start time taken in the pause. A message's time is its msg id's
timestamp, the master's append time, never earlier than the true time and caught up with it
within the pause; so the rows at or after the start are exactly the second wave's.

The job runs in a child interpreter (a SparkSession's master is fixed once the session
exists, and the ``spark`` fixture's is ``local[2]``). Marked ``spark_cluster`` (deselected by
default: starting the executor JVMs takes one to several minutes on a busy 2-core machine):
``python -m pytest -m spark_cluster tests/spark/test_cluster_time.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.spark.conftest import REPO
from tests.spark.support import digest, partition_ends, produce, wait_caught_up

pytestmark = [pytest.mark.spark, pytest.mark.spark_cluster]
TOPIC = "timed"
PARTITIONS = 3
SYSTEM = {"unflushInterval": 100, "maxSegmentSize": 16 * 1024}  # several segments, so several index files


def read_at(zk_connect: str, zk_root: str, starting_ms: int) -> None:
    """The child's job: read ``TOPIC`` from the slave from ``starting_ms`` on two executor JVMs;
    prints one JSON line: the executors' count and every row as [partition, offset, sha256 of data]."""
    from metaq.spark.session import local_session

    spark = local_session("metaq-cluster-time", master="local-cluster[2,1,1024]")
    try:
        rows = (spark.read.format("metaq").option("zkConnect", zk_connect).option("zkRoot", zk_root)
                .option("topic", TOPIC).option("readFrom", "slave").option("startingTimestamp", str(starting_ms))
                .load().select("partition", "offset", "data").collect())
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
        print(json.dumps({"executors": executors, "rows": [[r.partition, r.offset, digest(r.data)] for r in rows]}))
    finally:
        spark.stop()


@pytest.mark.timeout(600)
def test_a_read_from_a_time_on_two_executor_jvms_gets_exactly_the_later_rows_from_the_slave(broker_factory, zk, zk_root) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("pyspark")
    master = broker_factory(0, {TOPIC: PARTITIONS}, SYSTEM)
    slave = broker_factory(0, {TOPIC: PARTITIONS}, SYSTEM, slave_props={"slaveId": 0})
    before = produce(master, TOPIC, partitions=PARTITIONS, count=900, size=120, batch=50, tag="before-")
    time.sleep(0.5)
    starting_ms = int(time.time() * 1000)
    time.sleep(0.5)
    after = produce(master, TOPIC, partitions=PARTITIONS, count=900, size=120, batch=50, tag="after-")
    wait_caught_up([master, slave], TOPIC, partition_ends(before + after))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    job = f"from tests.spark.test_cluster_time import read_at; read_at({zk.connect_string!r}, {zk_root!r}, {starting_ms})"
    result = subprocess.run([sys.executable, "-c", job], cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["executors"] == 2
    rows = [tuple(row) for row in answer["rows"]]
    assert len(rows) == len(set(rows)), "a row read twice"
    assert set(rows) == {(m.partition, m.offset, m.digest) for m in after}
