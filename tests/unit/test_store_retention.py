"""deletePolicy parsing, Quartz cron schedules, delete and archive of closed segments."""

from __future__ import annotations

import os
import zipfile
from datetime import datetime

import pytest

from metaq import record
from metaq.store.log import PartitionLog
from metaq.store.retention import DeletePolicy, QuartzCron, apply_policy, parse_delete_policy
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


@pytest.mark.parametrize(
    "expr, after, expected",
    [
        ("0 0 6,18 * * ?", "2024-03-10 05:59:59", "2024-03-10 06:00:00"),
        ("0 0 6,18 * * ?", "2024-03-10 06:00:00", "2024-03-10 18:00:00"),
        ("0 0 6,18 * * ?", "2024-12-31 18:00:00", "2025-01-01 06:00:00"),
        ("*/15 * * * * ?", "2024-03-10 10:00:14", "2024-03-10 10:00:15"),
        ("0 30 2 ? * MON-FRI", "2024-03-08 03:00:00", "2024-03-11 02:30:00"),  # Fri -> Mon
        ("0 0 12 ? * 1", "2024-03-10 12:00:00", "2024-03-17 12:00:00"),  # 1 = Sunday
        ("0 0 0 29 2 ?", "2024-03-01 00:00:00", "2028-02-29 00:00:00"),
        ("0 0/20 8-9 * * ?", "2024-03-10 09:40:00", "2024-03-11 08:00:00"),
        ("0 0 0 1 JAN ? 2030", "2024-01-01 00:00:00", "2030-01-01 00:00:00"),
        ("5,10 59 23 31 12 ?", "2024-12-31 23:59:05", "2024-12-31 23:59:10"),
    ],
)
def test_quartz_next_fire(expr, after, expected):
    parse = datetime.fromisoformat
    assert QuartzCron(expr).next_fire_after(parse(after)) == parse(expected)


@pytest.mark.parametrize("expr", ["0 0 6 * *", "0 0 25 * * ?", "0 0 6 L * ?", "0 0 6 * * 2#1", "a b c d e f"])
def test_quartz_rejects(expr):
    with pytest.raises(ValueError, match="cron"):
        QuartzCron(expr)


def test_quartz_that_never_fires_again():
    with pytest.raises(ValueError, match="never fires"):
        QuartzCron("0 0 0 1 1 ? 2020").next_fire_after(datetime(2024, 1, 1))


def aged_log(tmp_path, count: int = 7) -> PartitionLog:
    """A log with closed segments at 0, 100, 200 and the active one, all mtimes old."""
    log = PartitionLog(tmp_path, max_segment_size=100)
    for _ in range(count):
        log.append(REC)
    for segment in log.segments:
        os.utime(segment.path, (1_000, 1_000))
    return log


NOW = 1_000 + 3 * 3600  # three hours after the segments were written


def test_delete_policy_removes_only_closed_segments_older_than_the_limit(tmp_path):
    log = aged_log(tmp_path)
    assert apply_policy(log, "delete,4h", NOW) == []  # not old enough
    os.utime(log.segments[2].path, (NOW, NOW))  # a recent closed segment stops the sweep
    removed = apply_policy(log, "delete,2h", NOW)
    assert [p.name for p in removed] == [segment_file_name(0), segment_file_name(100)]
    assert [s.start for s in log.segments] == [200, 300]
    assert apply_policy(log, "delete,1s", NOW + 10) == [tmp_path / segment_file_name(200)]
    assert [s.start for s in log.segments] == [300]  # the active segment is never touched
    assert log.read(300, 100) == REC


def test_archive_renames_to_arc(tmp_path):
    log = aged_log(tmp_path)
    archived = apply_policy(log, "archive,2h", datetime.fromtimestamp(NOW))
    assert [p.name for p in archived] == [f"{i:020d}.arc" for i in (0, 100, 200)]
    assert all(p.read_bytes() == REC * 2 for p in archived)
    assert log.min_offset == 300
    log.close()
    assert PartitionLog(tmp_path, max_segment_size=100).min_offset == 300  # .arc files are not segments


def test_archive_zips_when_asked(tmp_path):
    log = aged_log(tmp_path, count=3)
    (archived,) = apply_policy(log, "archive,2h,true", NOW)
    assert archived.name == f"{0:020d}.zip"
    assert not (tmp_path / segment_file_name(0)).exists()
    with zipfile.ZipFile(archived) as archive:
        assert archive.read(segment_file_name(0)) == REC * 2
