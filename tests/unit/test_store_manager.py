"""MessageStoreManager: lookups, on-demand logs, open_existing, reload, retention, stop."""

from __future__ import annotations

import asyncio
import os
from datetime import datetime

import pytest

from metaq import record
from metaq.config import TopicConfig
from metaq.store.manager import MessageStoreManager, UnknownPartition, UnknownTopic


def topics(tmp_path, **overrides) -> dict[str, TopicConfig]:
    base = dict(data_path=str(tmp_path), num_partitions=2, max_segment_size=100, unflush_threshold=0)
    base.update(overrides)
    return {"orders": TopicConfig(name="orders", **base), "logs": TopicConfig(name="logs", **base)}


def test_unknown_topic_and_partition_errors_are_clear(tmp_path):
    manager = MessageStoreManager(topics(tmp_path), max_message_size=1024)
    with pytest.raises(UnknownTopic, match="unknown topic 'nope'.*logs, orders"):
        manager.get_log("nope", 0)
    with pytest.raises(UnknownPartition, match="no partition 2: numPartitions is 2"):
        manager.get_log("orders", 2)
    with pytest.raises(UnknownPartition):
        manager.flusher("orders", -1)
    assert manager.logs() == {}


def test_logs_are_created_on_demand_in_topic_dirs(tmp_path):
    manager = MessageStoreManager(topics(tmp_path), max_message_size=1024)
    log = manager.get_log("orders", 1)
    assert log.directory == tmp_path / "orders-1"
    assert manager.get_log("orders", 1) is log
    assert manager.flusher("orders", 1).log is log
    assert manager.flusher("orders", 1).group_commit
    slave_log = manager.get_or_create_log("logs", 0, start_offset=5000)
    assert slave_log.min_offset == slave_log.log_end == 5000
    manager.close()


def test_open_existing_returns_the_largest_msg_id(tmp_path):
    manager = MessageStoreManager(topics(tmp_path), max_message_size=1024)
    manager.get_log("orders", 0).append(record.encode_record(b"a", msg_id=41))
    manager.get_log("logs", 1).append(record.encode_record(b"b", msg_id=99) + record.encode_record(b"c", msg_id=100))
    manager.close()
    restarted = MessageStoreManager(topics(tmp_path), max_message_size=1024)
    assert restarted.open_existing() == 100
    assert set(restarted.logs()) == {("orders", 0), ("logs", 1)}
    assert MessageStoreManager(topics(tmp_path / "empty"), max_message_size=1024).open_existing() == 0


def test_update_topics_adds_topics_and_partitions(tmp_path):
    manager = MessageStoreManager(topics(tmp_path), max_message_size=1024)
    log = manager.get_log("orders", 0)
    new = topics(tmp_path, num_partitions=4, max_segment_size=500)
    new["fresh"] = TopicConfig(name="fresh", data_path=str(tmp_path))
    manager.update_topics(new)
    assert manager.get_log("orders", 3).directory.name == "orders-3"
    assert manager.get_log("fresh", 0).log_end == 0
    assert log.max_segment_size == 500
    manager.update_topics({"fresh": new["fresh"]})
    with pytest.raises(UnknownTopic):
        manager.get_log("orders", 0)


def test_start_stop_flushes_and_retention_pass(tmp_path):
    async def scenario():
        config = topics(tmp_path, unflush_threshold=1000, unflush_interval_ms=60_000, delete_policy="delete,1h")
        manager = MessageStoreManager(config, max_message_size=1024, retention_grace_s=0)
        manager.start()
        log = manager.get_log("orders", 0)
        for i in range(5):
            log.append(record.encode_record(b"x" * 30, msg_id=i + 1))  # 50 bytes: rolls every 2
        assert log.flushed_end < log.log_end
        for segment in log.segments:
            os.utime(segment.path, (1_000, 1_000))
        removed = await manager.run_retention("orders", now=datetime.fromtimestamp(1_000 + 7200))
        assert [p.name for p in removed] == [f"{0:020d}.meta", f"{100:020d}.meta"]
        assert log.min_offset == 200
        await manager.stop()
        assert log.flushed_end == log.log_end
        manager.close()

    asyncio.run(scenario())


def test_start_rejects_a_bad_delete_when(tmp_path):
    async def scenario():
        manager = MessageStoreManager(topics(tmp_path, delete_when="0 0 6 L * ?"), max_message_size=1024)
        with pytest.raises(ValueError, match="cron"):
            manager.start()

    asyncio.run(scenario())


def test_retention_cancelled_during_grace_still_disposes_detached_segments(tmp_path):
    async def scenario():
        manager = MessageStoreManager(topics(tmp_path, delete_policy="delete,1s"), max_message_size=1024)
        log = manager.get_log("orders", 0)
        for i in range(3):
            log.append(record.encode_record(b"x" * 30, msg_id=i + 1))
        old_segment = log.segments[0]
        os.utime(old_segment.path, (1_000, 1_000))
        task = asyncio.create_task(manager.run_retention("orders"))  # default 10 s grace
        await asyncio.sleep(0.05)
        assert log.min_offset == 100 and old_segment.path.exists()  # detached, file kept for now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not old_segment.path.exists() and old_segment.closed
        manager.close()

    asyncio.run(scenario())


def test_each_log_carries_its_flusher_and_a_dropped_log_takes_it_along(tmp_path):
    """The store's one map by partition is its logs: each log's flusher is on the log, the stop
    path flushes every open log through it, and a dropped partition's flusher leaves with its log."""
    async def scenario():
        manager = MessageStoreManager(topics(tmp_path, unflush_threshold=1000, unflush_interval_ms=60_000),
                                      max_message_size=1024)
        manager.start()
        kept, dropped = manager.get_log("orders", 0), manager.get_log("logs", 1)
        assert manager.flusher("orders", 0) is kept.flusher and kept.flusher.log is kept
        for log in (kept, dropped):
            log.append(record.encode_record(b"x", msg_id=1))
            log.flusher.note_appended(1)
        gone = manager.update_topics({"orders": topics(tmp_path)["orders"]})
        assert [(item.topic, item.partition, item.flusher) for item in gone] == [
            ("logs", 0, None), ("logs", 1, dropped.flusher)]
        manager.dispose(gone)
        await manager.stop()
        assert kept.flushed_end == kept.log_end, "the stop path flushed the open log"
        manager.close()

    asyncio.run(scenario())
