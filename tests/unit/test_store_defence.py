"""Bytes lost outside the broker: a log end that went backwards refuses to open, a deleted
segment file refuses appends, and the store's manager refuses that partition alone."""

from __future__ import annotations

import logging
import os

import pytest

from metaq import record
from metaq.config import TopicConfig
from metaq.store.checkpoint import FILE_NAME, read_flushed_end
from metaq.store.log import LogWentBackwards, PartitionLog, SegmentVanished
from metaq.store.manager import MessageStoreManager
from metaq.store.refused import PartitionRefused, RefusedLog
from metaq.store.segment import segment_file_name

REC = record.encode_record(b"x" * 30, msg_id=1)  # 50 bytes: two per 100-byte segment


def written_log(directory, count: int = 5) -> int:
    """A closed log of ``count`` records in 100-byte segments, flushed; returns its end."""
    log = PartitionLog(directory, max_segment_size=100)
    for _ in range(count):
        log.append(REC)
    log.flush()
    log.close()
    return count * len(REC)


def test_close_checkpoints_the_flushed_end(tmp_path):
    end = written_log(tmp_path)
    assert read_flushed_end(tmp_path) == end
    assert PartitionLog(tmp_path, max_segment_size=100).log_end == end


@pytest.mark.parametrize(
    "damage, found",
    [
        ("delete the active segment", 200),
        ("delete every segment", None),
        ("cut the active segment", 210),
    ],
)
def test_a_log_end_that_went_backwards_refuses_to_open(tmp_path, damage, found):
    end = written_log(tmp_path)
    active = tmp_path / segment_file_name(200)
    if damage == "delete the active segment":
        active.unlink()
    elif damage == "delete every segment":
        for path in tmp_path.glob("*.meta"):
            path.unlink()
    else:
        active.write_bytes(active.read_bytes()[:10])
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(LogWentBackwards) as refused:
        PartitionLog(tmp_path, max_segment_size=100)
    message = str(refused.value)
    assert f"offsets up to {end} were flushed" in message
    assert (f"segment files end at offset {found}" if found is not None else "no segment files") in message
    assert FILE_NAME in message and "restore" in message, "the message says what the operator can do"
    assert refused.value.known_end == end
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing on disk is touched"


def test_accepting_the_loss_by_deleting_the_checkpoint_opens_the_log(tmp_path):
    written_log(tmp_path)
    (tmp_path / segment_file_name(200)).unlink()
    (tmp_path / FILE_NAME).unlink()
    log = PartitionLog(tmp_path, max_segment_size=100)
    assert log.log_end == 200 and read_flushed_end(tmp_path) == 200


def test_bytes_past_the_checkpoint_are_a_torn_tail_not_a_refusal(tmp_path):
    end = written_log(tmp_path)
    log = PartitionLog(tmp_path, max_segment_size=100)
    log.append(REC)  # never flushed: the checkpoint stays at ``end``
    log.close()
    active = tmp_path / segment_file_name(200)
    active.write_bytes(active.read_bytes()[: end - 200 + 7])  # a crash tore the unflushed record
    assert PartitionLog(tmp_path, max_segment_size=100).log_end == end


def test_truncation_lowers_the_checkpoint_first(tmp_path):
    written_log(tmp_path)
    log = PartitionLog(tmp_path, max_segment_size=100)
    log.truncate_to(100)
    assert read_flushed_end(tmp_path) == 100
    log.truncate_fully_and_start_at(50)
    assert read_flushed_end(tmp_path) == 50
    log.close()
    assert PartitionLog(tmp_path, max_segment_size=100).log_end == 50


def test_flush_raises_the_checkpoint_at_most_once_an_interval(tmp_path, monkeypatch):
    import metaq.store.log as log_module

    log = PartitionLog(tmp_path, max_segment_size=1000)
    log.append(REC)
    log.flush()
    assert read_flushed_end(tmp_path) == 0, "just written at open: the next write waits"
    monkeypatch.setattr(log_module, "CHECKPOINT_INTERVAL_S", 0)
    log.append(REC)
    log.flush()
    assert read_flushed_end(tmp_path) == 2 * len(REC)


def test_a_deleted_active_segment_refuses_appends_and_takes_the_write_back(tmp_path, caplog):
    log = PartitionLog(tmp_path, max_segment_size=1000)
    log.append(REC)
    active = tmp_path / segment_file_name(0)
    active.unlink()
    with caplog.at_level(logging.ERROR, logger="metaq.store.log"):
        with pytest.raises(SegmentVanished, match=f"{active}.*deleted") as refused:
            log.append(REC)
        assert log.log_end == len(REC), "the refused write does not count"
        with pytest.raises(SegmentVanished):
            log.append(REC)
    assert refused.value.strerror.startswith(f"segment file {active} was deleted")
    (line,) = [r.message for r in caplog.records]  # logged once, with where the bytes still are
    assert "/proc/" in line and "restart" in line


def test_a_deleted_segment_fails_the_flush_and_check_files_notices_an_idle_log(tmp_path):
    log = PartitionLog(tmp_path, max_segment_size=1000)
    log.append(REC)
    (tmp_path / segment_file_name(0)).unlink()
    with pytest.raises(SegmentVanished):
        log.flush()
    assert log.flushed_end == 0, "an fsync of an unlinked inode covers nothing"

    idle = PartitionLog(tmp_path / "idle", max_segment_size=1000)
    idle.append(REC)
    idle.flush()
    (tmp_path / "idle" / segment_file_name(0)).unlink()
    idle.check_files()
    with pytest.raises(SegmentVanished):
        idle.append(REC)


def test_a_roll_away_from_a_deleted_segment_is_refused(tmp_path):
    log = PartitionLog(tmp_path, max_segment_size=50)
    log.append(REC)  # full: the next append rolls
    (tmp_path / segment_file_name(0)).unlink()
    with pytest.raises(SegmentVanished):
        log.append(REC)
    assert [s.start for s in log.segments] == [0]


def test_the_manager_refuses_that_partition_alone(tmp_path, caplog):
    config = {"t": TopicConfig(name="t", data_path=str(tmp_path), num_partitions=2, max_segment_size=100)}
    manager = MessageStoreManager(config, max_message_size=1024)
    for partition in (0, 1):
        target = manager.get_log("t", partition)
        for _ in range(5):
            target.append(REC)
        target.flush()
    manager.close()
    (tmp_path / "t-0" / segment_file_name(200)).unlink()
    for path in (tmp_path / "t-1").glob("*.meta"):
        path.unlink()  # every segment gone: still known from its checkpoint

    restarted = MessageStoreManager(config, max_message_size=1024)
    with caplog.at_level(logging.ERROR, logger="metaq.store.manager"):
        restarted.open_existing()
    refused = restarted.get_log("t", 0)
    assert isinstance(refused, RefusedLog) and isinstance(restarted.get_log("t", 1), RefusedLog)
    assert refused.log_end == 250, "offsets below the end the broker knew stay taken"
    with pytest.raises(PartitionRefused, match="went backwards"):
        refused.append(REC)
    with pytest.raises(PartitionRefused):
        refused.read(0, 10)
    lines = [r.message for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("t-0 is not served: ") and "250" in lines[0]
    assert not list((tmp_path / "t-1").glob("*.meta")), "no new segment over the lost offsets"

    config["t"] = TopicConfig(name="t", data_path=str(tmp_path), num_partitions=3, max_segment_size=100)
    restarted.update_topics(config)
    assert restarted.get_log("t", 2).append(REC) == 0, "the other partitions keep serving"


def test_an_idle_log_whose_directory_did_not_change_is_checked_without_a_stat_per_segment(tmp_path, monkeypatch):
    log = PartitionLog(tmp_path, max_segment_size=len(REC))
    for _ in range(6):
        log.append(REC)  # a segment each
    log.flush()
    assert len(log.segments) >= 6
    os.utime(tmp_path, ns=(1_000_000_000, 1_000_000_000))  # settled: long ago
    fstats = []
    real = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: fstats.append(fd) or real(fd))
    log.check_files()  # every segment once: the mtime is not known yet
    assert len(fstats) == len(log.segments)
    fstats.clear()
    for _ in range(3):
        log.check_files()
    assert fstats == [], "an unchanged directory: no fstat per segment"
    (tmp_path / segment_file_name(log.segments[2].start)).unlink()  # a sealed one, while idle
    log.check_files()
    with pytest.raises(SegmentVanished):
        log.append(REC)
