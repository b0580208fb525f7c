"""Corrupt bytes in a partition log: the offline check, the scrub, recovery of a bit flip in
the middle of the active segment, and reads that never return corrupt bytes."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from metaq import record
from metaq.store.log import CorruptRange, PartitionLog
from metaq.store.scrub import Scrubber, check_data_dir, check_partition_dir

RECORD = record.encode_record(b"x" * 80)  # 100 bytes


def _log(directory: Path, records: int, segment_size: int = 1000) -> PartitionLog:
    log_ = PartitionLog(directory, max_segment_size=segment_size)
    for _ in range(records):
        log_.append(RECORD)
    log_.flush()
    return log_


def _flip(path: Path, position: int) -> None:
    """Flip one bit of the byte at ``position`` of a file (inside a record's payload)."""
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0x10]))


def test_offline_check_names_the_bad_range_and_tells_a_torn_tail_apart(tmp_path: Path) -> None:
    log_ = _log(tmp_path / "t-0", 25)  # segments of 10 records: [0,1000) [1000,2000) [2000,2500)
    log_.close()
    assert check_partition_dir(tmp_path / "t-0").ok
    _flip(tmp_path / "t-0" / "00000000000000001000.meta", 3 * 100 + 50)  # record at 1300
    with open(tmp_path / "t-0" / "00000000000000002000.meta", "ab") as f:
        f.write(RECORD[:30])  # a write cut off by a crash
    [report] = check_data_dir(tmp_path)
    assert report.partition == "t-0" and report.segments == 3 and report.bytes_checked == 2530
    assert [(b.start, b.end, b.kind) for b in report.bad] == [(1300, 2000, "corrupt"), (2500, 2530, "torn")]
    assert not report.ok
    assert report.to_json()["bad"][0]["segment"] == "00000000000000001000.meta"


def test_reads_stop_before_a_corrupt_range_and_fail_inside_it(tmp_path: Path) -> None:
    log_ = _log(tmp_path / "t-0", 25)
    assert log_.mark_corrupt(1300, 2000) and not log_.mark_corrupt(1400, 1500)
    assert log_.read(1000, 10_000) == RECORD * 3  # the good records before it, then nothing more
    with pytest.raises(CorruptRange, match=r"t-0: offset 1500 is in a corrupt byte range \[1300, 2000\)"):
        log_.read(1500, 100)
    with pytest.raises(CorruptRange):
        log_.crc32(0, 2500)
    assert log_.read(2000, 500) == RECORD * 5
    # A slave's repair: cut at the range's start (the end of the last good record), fetch again.
    log_.truncate_to(1300)
    assert log_.corrupt_ranges == [] and log_.log_end == 1300
    log_.close()


def test_recovery_marks_a_flip_below_the_flushed_end_instead_of_cutting_good_records(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log_ = _log(directory, 8)  # one active segment, 800 bytes, all flushed
    log_.close()
    _flip(directory / "00000000000000000000.meta", 250)  # record at 200
    with open(directory / "00000000000000000000.meta", "ab") as f:
        f.write(RECORD[:30])  # and a torn tail after the flushed end
    reopened = PartitionLog(directory, max_segment_size=1000)
    # Before, recovery cut everything from 200 on (6 acked, fsynced records) as a "torn tail".
    assert reopened.log_end == 800
    assert reopened.corrupt_ranges == [(200, 800)]
    assert reopened.read(0, 1000) == RECORD * 2
    reopened.close()


def test_scrub_pass_finds_a_flip_in_a_sealed_segment_at_a_bounded_rate(tmp_path: Path) -> None:
    log_ = _log(tmp_path / "t-0", 25)
    _flip(tmp_path / "t-0" / "00000000000000000000.meta", 7 * 100 + 20)
    found: list[tuple[str, int, int, int]] = []
    scrubber = Scrubber(lambda: {("t", 0): log_}, interval_ms=1000, bytes_per_second=4000)
    scrubber.on_corrupt = lambda *args: found.append(args)
    loop = asyncio.new_event_loop()
    try:
        started = loop.time()
        loop.run_until_complete(scrubber.scrub_pass())
        took = loop.time() - started
        loop.run_until_complete(scrubber.scrub_pass())  # found again: counted once, offered again
    finally:
        loop.close()
    assert found == [("t", 0, 700, 1000)] * 2  # each pass offers it for repair
    assert log_.corrupt_ranges == [(700, 1000)]
    # Only the two sealed segments are read (the active one is recovery's), at 4000 B/s: 1700
    # bytes (700 valid + 1000) take at least 0.4 s.
    assert scrubber.stats.segments_checked == 4 and took >= 0.4
    assert scrubber.stats.corrupt_ranges == 1
    log_.close()


def test_scrub_ignores_a_segment_that_left_the_log(tmp_path: Path) -> None:
    log_ = _log(tmp_path / "t-0", 25)
    first = log_.segments[0]
    os.truncate(first.path, 500)  # as if truncation or retention got to it first
    scrubber = Scrubber(lambda: {("t", 0): log_}, interval_ms=1000, bytes_per_second=0)
    asyncio.run(scrubber.scrub_pass())
    assert log_.corrupt_ranges == []
    log_.close()


def test_verify_data_dir_reports_per_partition_and_exits_1_on_corruption(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from metaq.cli import main

    for partition in (0, 1):
        _log(tmp_path / f"t-{partition}", 25).close()
    assert main(["verify", "--data-dir", str(tmp_path)]) == 0
    assert "2/2 partitions whole" in capsys.readouterr().out
    _flip(tmp_path / "t-1" / "00000000000000000000.meta", 450)
    assert main(["verify", "--data-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "t-0: 3 segments, 2500 bytes checked: OK" in out
    assert "t-1: 3 segments, 2500 bytes checked: CORRUPT [400, 1000) in 00000000000000000000.meta" in out
    assert main(["verify", "--data-dir", str(tmp_path), "--topic", "t", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and [p["ok"] for p in report["partitions"]] == [True, False]
    assert report["partitions"][1]["bad"] == [{"start": 400, "end": 1000, "segment": "00000000000000000000.meta", "kind": "corrupt"}]
    assert main(["verify", "--data-dir", str(tmp_path / "none")]) == 1
    assert "--data-dir" in capsys.readouterr().err


def test_a_master_puts_back_only_exactly_the_corrupt_range_as_whole_valid_records(tmp_path: Path) -> None:
    log_ = _log(tmp_path / "t-0", 25)
    good = log_.read(1000, 1000)
    _flip(tmp_path / "t-0" / "00000000000000001000.meta", 3 * 100 + 50)
    assert log_.mark_corrupt(1300, 2000)
    assert not log_.repair_corrupt(1200, good[200:])  # not the marked range
    assert not log_.repair_corrupt(1300, good[300:] + b"x")  # longer than it
    bad = bytearray(good[300:])
    bad[60] ^= 1
    assert not log_.repair_corrupt(1300, bytes(bad))  # fails its own CRC check
    assert log_.corrupt_ranges == [(1300, 2000)]
    assert log_.repair_corrupt(1300, good[300:])
    assert log_.corrupt_ranges == [] and log_.read(1000, 1000) == good
    log_.close()
    assert check_partition_dir(tmp_path / "t-0").ok  # on disk too


def test_a_corrupt_range_leaves_with_its_segment_when_retention_removes_it(tmp_path: Path) -> None:
    log_ = _log(tmp_path / "t-0", 25)
    log_.mark_corrupt(300, 1000)
    log_.mark_corrupt(1300, 2000)
    assert [s.start for s in log_.detach_segments_older_than(float("inf"))] == [0, 1000]
    assert log_.corrupt_ranges == [] and log_.first_corrupt_offset() is None
    log_.close()
