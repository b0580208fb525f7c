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


def test_scrub_finds_a_sealed_segment_cut_outside_the_broker_but_not_one_the_log_cut_itself(tmp_path: Path) -> None:
    log_ = _log(tmp_path / "t-0", 25)
    os.truncate(log_.segments[0].path, 450)  # a disk losing the file's tail, mid-record
    scrubber = Scrubber(lambda: {("t", 0): log_}, interval_ms=1000, bytes_per_second=0)
    asyncio.run(scrubber.scrub_pass())
    assert log_.corrupt_ranges == [(400, 1000)] and scrubber.stats.corrupt_ranges == 1
    with pytest.raises(CorruptRange):
        log_.read(400, 100)
    log_.close()

    # The log's own truncation while the scrub reads (a replica cutting a diverged tail): the
    # segment it read is no longer a sealed one of that length, so nothing is judged.
    log_ = _log(tmp_path / "u-0", 25)
    scrubber = Scrubber(lambda: {("u", 0): log_}, interval_ms=1000, bytes_per_second=0)
    check = scrubber._check_segment

    def truncated_meanwhile(path: Path, start: int, size: int) -> int | None:
        log_.truncate_to(500)
        return check(path, start, size)

    scrubber._check_segment = truncated_meanwhile  # type: ignore[method-assign]
    asyncio.run(scrubber.scrub_pass())
    assert log_.corrupt_ranges == [] and log_.log_end == 500
    log_.close()


def test_a_sealed_segment_cut_while_the_broker_was_down_opens_with_its_missing_bytes_unserved(tmp_path: Path) -> None:
    """Offsets keep their meaning (the segment still ends where the next starts), the missing
    bytes from the last whole record on are a corrupt range: never served, a master puts them
    back from a replica (through the restarts too), a slave cuts there and fetches again."""
    log_ = _log(tmp_path / "t-0", 25)
    good = log_.read(1000, 1000)
    log_.close()
    os.truncate(tmp_path / "t-0" / "00000000000000001000.meta", 450)  # mid-record: 4 whole records left
    for _ in range(2):  # not repaired: the same range after another restart (the gap is on disk)
        log_ = PartitionLog(tmp_path / "t-0", max_segment_size=1000)
        assert log_.corrupt_ranges == [(1400, 2000)] and (log_.min_offset, log_.log_end) == (0, 2500)
        assert log_.read(1000, 10_000) == good[:400]
        with pytest.raises(CorruptRange, match=r"offset 1450 is in a corrupt byte range \[1400, 2000\)"):
            log_.read(1450, 100)
        assert log_.read(2000, 500) == RECORD * 5
        log_.close()
    [report] = check_data_dir(tmp_path)
    assert [(b.start, b.end, b.kind) for b in report.bad] == [(1400, 2000, "missing")] and not report.ok

    log_ = PartitionLog(tmp_path / "t-0", max_segment_size=1000)
    assert not log_.repair_corrupt(1400, good[400:900])  # only the whole range
    assert log_.repair_corrupt(1400, good[400:])  # a master's repair: written past the file's end
    assert log_.corrupt_ranges == [] and log_.read(1000, 1000) == good
    log_.close()
    assert check_partition_dir(tmp_path / "t-0").ok
    log_ = PartitionLog(tmp_path / "t-0", max_segment_size=1000)
    assert log_.corrupt_ranges == [] and log_.read(1000, 1000) == good  # the file is whole again
    log_.close()

    os.truncate(tmp_path / "t-0" / "00000000000000000000.meta", 0)  # a whole segment's bytes
    log_ = PartitionLog(tmp_path / "t-0", max_segment_size=1000)
    assert log_.corrupt_ranges == [(0, 1000)]
    # A slave's repair (Partition.truncate_corrupt): cut at the first corrupt range, fetch from 0 again.
    aside = log_.truncate_to(log_.first_corrupt_offset())
    assert (log_.log_end, log_.corrupt_ranges) == (0, [])
    assert aside is not None and aside.stat().st_size == 1500  # what was there is kept aside
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


def test_a_transaction_state_walk_passes_a_missing_range_also_from_inside_it(tmp_path: Path) -> None:
    """At start the state may resume from a snapshot taken before the segment was cut short,
    standing inside the missing range: it goes on after the range instead of stopping there
    (before: the broker took the stop for a torn batch, cut the log mid-record and crashed:
    a chaos campaign run, seed 2040, ``offset 311673 is not the start of a record``)."""
    from metaq.txn.rebuild import PartitionTxnState

    log_ = _log(tmp_path / "t-0", 25)
    log_.close()
    os.truncate(tmp_path / "t-0" / "00000000000000001000.meta", 450)
    log_ = PartitionLog(tmp_path / "t-0", max_segment_size=1000)
    assert [log_.corrupt_end_at(o) for o in (1300, 1400, 1450, 1999, 2000)] == [None, 2000, 2000, 2000, None]
    for position in (0, 1400, 1450):
        state = PartitionTxnState(position=position)
        assert state.catch_up(log_.read_as_stored, log_.log_end, log_.corrupt_end_at) == log_.log_end
        assert state.incomplete_tail(log_.log_end) is None
    log_.close()


def test_a_walk_stopped_by_a_flipped_record_in_a_sealed_segment_marks_it_instead_of_cutting(tmp_path: Path) -> None:
    """At start the transaction state's walk may stop at a record whose flip the scrub has not
    found yet; that is corruption, not a torn batch (before: the broker cut its log there, the
    cut failed its record-boundary check and the broker crashed at every start: a campaign
    run, seed 2040, ``offset 1868 is not the start of a record``)."""
    log_ = _log(tmp_path / "t-0", 25)
    _flip(tmp_path / "t-0" / "00000000000000001000.meta", 3 * 100 + 50)  # record at 1300
    assert not log_.mark_if_corrupt_record(1200)  # a good record
    assert not log_.mark_if_corrupt_record(2100)  # the active segment is recovery's
    assert log_.mark_if_corrupt_record(1300)
    assert log_.corrupt_ranges == [(1300, 2000)] and log_.corrupt_end_at(1300) == 2000
    log_.close()
