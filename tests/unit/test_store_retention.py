"""deletePolicy parsing; delete and archive of closed segments through the retention pass
the broker runs (``MessageStoreManager.run_retention``)."""

from __future__ import annotations

import asyncio
import os
import zipfile
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from metaq import record
from metaq.config import TopicConfig
from metaq.store.log import PartitionLog
from metaq.store.manager import MessageStoreManager
from metaq.store.retention import DeletePolicy, parse_delete_policy
from metaq.store.segment import segment_file_name

REC = record.encode_record(b"x" * 30, msg_id=1)  # 50 bytes: two per 100-byte segment


@pytest.mark.parametrize(
    "text, expected",
    [
        ("delete,168", ("delete", 168 * 3600, False)),
        ("delete,30s", ("delete", 30, False)),
        ("delete, 5m", ("delete", 300, False)),
        ("archive,2h,true", ("archive", 7200, True)),
        ("archive,1,false", ("archive", 3600, False)),
    ],
)
def test_parse_delete_policy(text, expected):
    assert parse_delete_policy(text) == DeletePolicy(*expected)


@pytest.mark.parametrize("text", ["", "delete", "delete,x", "drop,5", "delete,5d", "delete,5,true"])
def test_parse_delete_policy_rejects(text):
    with pytest.raises(ValueError, match="deletePolicy"):
        parse_delete_policy(text)


TOPIC = "orders"


def manager_for(tmp_path, policy: str) -> MessageStoreManager:
    config = TopicConfig(name=TOPIC, data_path=str(tmp_path), num_partitions=1, max_segment_size=100,
                         delete_policy=policy)
    return MessageStoreManager({TOPIC: config}, max_message_size=1024, retention_grace_s=0)


def aged_log(manager: MessageStoreManager, count: int = 7) -> PartitionLog:
    """A log with closed segments at 0, 100, 200 and the active one, all mtimes old."""
    log = manager.get_log(TOPIC, 0)
    for _ in range(count):
        log.append(REC)
    for segment in log.segments:
        os.utime(segment.path, (1_000, 1_000))
    return log


NOW = 1_000 + 3 * 3600  # three hours after the segments were written


def run_retention(manager: MessageStoreManager, now: float) -> list[Path]:
    """One pass, as the broker's deleteWhen schedule runs it."""
    return asyncio.run(manager.run_retention(TOPIC, now=datetime.fromtimestamp(now)))


def with_policy(manager: MessageStoreManager, policy: str) -> MessageStoreManager:
    manager.update_topics({TOPIC: replace(manager.topic_config(TOPIC), delete_policy=policy)})
    return manager


def test_delete_policy_removes_only_closed_segments_older_than_the_limit(tmp_path):
    manager = manager_for(tmp_path, "delete,4h")
    log = aged_log(manager)
    assert run_retention(manager, NOW) == []  # not old enough
    os.utime(log.segments[2].path, (NOW, NOW))  # a recent closed segment stops the sweep
    removed = run_retention(with_policy(manager, "delete,2h"), NOW)
    assert removed == [tmp_path / f"{TOPIC}-0" / segment_file_name(s) for s in (0, 100)]
    assert not any(path.exists() for path in removed)
    assert [s.start for s in log.segments] == [200, 300]
    assert run_retention(with_policy(manager, "delete,1s"), NOW + 10) == [log.directory / segment_file_name(200)]
    assert [s.start for s in log.segments] == [300]  # the active segment is never touched
    assert log.read(300, 100) == REC


def test_archive_renames_to_arc(tmp_path):
    manager = manager_for(tmp_path, "archive,2h")
    log = aged_log(manager)
    archived = run_retention(manager, NOW)
    assert [p.name for p in archived] == [f"{i:020d}.arc" for i in (0, 100, 200)]
    assert all(p.read_bytes() == REC * 2 for p in archived)
    assert log.min_offset == 300
    manager.close()
    assert PartitionLog(log.directory, max_segment_size=100).min_offset == 300  # .arc files are not segments


def test_archive_zips_when_asked(tmp_path):
    manager = manager_for(tmp_path, "archive,2h,true")
    log = aged_log(manager, count=3)
    (archived,) = run_retention(manager, NOW)
    assert archived.name == f"{0:020d}.zip"
    assert archived.stat().st_mode & 0o777 == 0o600  # the messages stay the broker's own
    assert not (log.directory / segment_file_name(0)).exists()
    with zipfile.ZipFile(archived) as archive:
        assert archive.read(segment_file_name(0)) == REC * 2


def test_every_topics_schedule_runs_from_one_task_and_topics_due_together_share_one_pass(tmp_path, monkeypatch):
    """deleteWhen of many topics: one task for the broker, and the topics due at the same
    second are one walk over the logs (a task each walked every log once per topic)."""
    names = [f"t{n}" for n in range(40)]
    configs = {name: TopicConfig(name=name, data_path=str(tmp_path), num_partitions=2, max_segment_size=100,
                                 delete_policy="delete,1h", delete_when="* * * * * ?") for name in names}
    manager = MessageStoreManager(configs, max_message_size=1024, retention_grace_s=0)
    for name in names:
        for partition in range(2):
            log = manager.get_log(name, partition)
            for _ in range(5):
                log.append(REC)
            for segment in log.segments:
                os.utime(segment.path, (1_000, 1_000))
    passes: list[list[str]] = []
    real = manager.run_retention_of

    async def recording(topics, now=None):
        passes.append(sorted(topics))
        return await real(topics, now)

    monkeypatch.setattr(manager, "run_retention_of", recording)

    async def scenario() -> None:
        manager.start()
        try:
            assert [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("retention")] == ["retention"]
            while not passes:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.1)
        finally:
            await manager.stop()

    asyncio.run(scenario())
    assert passes[0] == sorted(names), "every topic due that second in one pass"
    for name in names:
        for partition in range(2):
            assert [s.start for s in manager.open_log(name, partition).segments] == [200], "closed aged segments removed"
    manager.close()
