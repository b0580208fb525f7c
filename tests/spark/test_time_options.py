"""Kafka's time options of the source (docs/spark.md, "Starting at a time") with real PySpark,
ZooKeeper and a master/slave pair: every range is checked against the msg ids' times."""

from __future__ import annotations

import time

import pytest

from metaq.store.msgid import msg_id_timestamp_ms
from tests.spark.support import partition_ends, produce, wait_caught_up

pytestmark = pytest.mark.spark
TOPIC = "timed"
SYSTEM = {"unflushInterval": 100, "maxSegmentSize": 16 * 1024}


def _read(spark, zk, zk_root, stream: bool = False, **options):
    reader = (spark.readStream if stream else spark.read).format("metaq").option("zkConnect", zk.connect_string)
    reader = reader.option("zkRoot", zk_root).option("topic", TOPIC)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _keys(df) -> set[tuple[str, int]]:
    return {(r.partition, r.offset) for r in df.select("partition", "offset").collect()}


@pytest.fixture
def waves(spark, zk, zk_root, broker_factory):
    """Three waves of messages 50 ms apart on both partitions, replicated; their (partition,
    offset) -> time (ms, from the msg id), and the first time of waves 2 and 3."""
    master = broker_factory(0, {TOPIC: 2}, SYSTEM)
    slave = broker_factory(0, {TOPIC: 2}, SYSTEM, slave_props={"slaveId": 0})
    for wave in range(3):
        produced = produce(master, TOPIC, partitions=2, count=400, size=80, batch=50, tag=f"w{wave}-")
        wait_caught_up([master, slave], TOPIC, partition_ends(produced))
        time.sleep(0.05)
    rows = _read(spark, zk, zk_root).select("partition", "offset", "msg_id", "data").collect()
    times = {(r.partition, r.offset): msg_id_timestamp_ms(r.msg_id) for r in rows}
    firsts = [min(times[(r.partition, r.offset)] for r in rows if bytes(r.data).startswith(f"w{w}-".encode())) for w in (1, 2)]
    return times, firsts


def _at_or_after(times, start: int, end: int | None = None) -> set[tuple[str, int]]:
    return {key for key, at in times.items() if at >= start and (end is None or at < end)}


def test_starting_and_ending_timestamps_select_by_message_time(spark, zk, zk_root, waves):
    times, (second, third) = waves
    assert _keys(_read(spark, zk, zk_root, startingTimestamp=str(second))) == _at_or_after(times, second)
    window = _read(spark, zk, zk_root, startingTimestamp=str(second), endingTimestamp=str(third))
    assert _keys(window) == _at_or_after(times, second, third) and window.count() == 400  # one wave
    per_partition = _read(spark, zk, zk_root, startingOffsetsByTimestamp=f'{{"0-0": {second}, "0-1": {third}}}',
                          endingOffsetsByTimestamp=f'{{"0-0": {third}, "0-1": {third + 10**9}}}')
    expected = {k for k in _at_or_after(times, second, third) if k[0] == "0-0"} | {
        k for k in _at_or_after(times, third) if k[0] == "0-1"}
    assert _keys(per_partition) == expected
    # A single time wins over the per-partition JSON, as in Kafka.
    both = _read(spark, zk, zk_root, startingTimestamp=str(third), startingOffsetsByTimestamp='{"0-0": 0, "0-1": 0}')
    assert _keys(both) == _at_or_after(times, third)
    # An end past every message is the latest offset.
    assert _keys(_read(spark, zk, zk_root, endingTimestamp=str(third + 10**9))) == set(times)


def test_a_start_past_every_message_follows_the_strategy(spark, zk, zk_root, waves):
    times, _ = waves
    future = max(times.values()) + 10**9
    with pytest.raises(Exception, match="startingTimestamp: partition 0-0 has no message at or after"):
        _read(spark, zk, zk_root, startingTimestamp=str(future)).collect()
    assert _read(spark, zk, zk_root, startingTimestamp=str(future), startingOffsetsByTimestampStrategy="latest").count() == 0
    with pytest.raises(Exception, match=r"startingOffsetsByTimestamp: no time for partition\(s\) 0-1"):
        _read(spark, zk, zk_root, startingOffsetsByTimestamp='{"0-0": 0}').collect()
    with pytest.raises(Exception, match="startingOffsetsByTimestamp: topic 'timed' has no partition '0-7'"):
        _read(spark, zk, zk_root, startingOffsetsByTimestamp='{"0-0": 0, "0-1": 0, "0-7": 0}').collect()


def test_a_new_stream_starts_at_the_time(spark, zk, zk_root, waves, tmp_path):
    times, (second, _third) = waves
    seen: set[tuple[str, int]] = set()

    def collect(batch_df, _batch_id):
        seen.update(_keys(batch_df))

    query = (_read(spark, zk, zk_root, stream=True, startingTimestamp=str(second)).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    assert seen == _at_or_after(times, second)
