"""PartitionLog and LogSegment: offsets, rolls, reads, recovery, truncation."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq import record
from metaq.store.log import LogCorruptError, OffsetOutOfRange, PartitionLog
from metaq.store.segment import LogSegment, segment_file_name


def rec(i: int, size: int = 30, attribute: str | None = None) -> bytes:
    return record.encode_record(f"message-{i}".encode().ljust(size, b"."), attribute, msg_id=1000 + i)


def open_log(directory: Path, max_segment_size: int = 200, **kwargs) -> PartitionLog:
    return PartitionLog(directory, max_segment_size=max_segment_size, **kwargs)


def records_in(log: PartitionLog) -> list[record.Record]:
    """Every record of the log, read back segment by segment through the public read()."""
    out, offset = [], log.min_offset
    while offset < log.log_end:
        chunk = log.read(offset, 1 << 20)
        out.extend(record.iter_records(chunk, offset))
        offset += len(chunk)
    return out


def segment_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.meta") if not p.name.startswith("truncated"))


# --- segment -------------------------------------------------------------------------


def test_segment_append_read_and_short_writes(tmp_path, monkeypatch):
    segment = LogSegment.create(tmp_path, 500)
    assert segment.path.name == "00000000000000000500.meta"
    real_pwrite = os.pwrite
    # Force short writes: the segment must keep writing until the whole buffer is out.
    monkeypatch.setattr(os, "pwrite", lambda fd, buf, pos: real_pwrite(fd, bytes(buf[:3]), pos))
    assert segment.append(b"hello world") == 500
    monkeypatch.undo()
    assert segment.append(b"!") == 511
    assert (segment.size, segment.end) == (12, 512)
    assert segment.read(506, 100) == b"world!"
    segment.close()
    reopened = LogSegment.open(tmp_path / segment_file_name(500), read_only=True)
    assert (reopened.start, reopened.size) == (500, 12)
    with pytest.raises(PermissionError):
        reopened.append(b"x")
    reopened.close()


def test_segment_failed_write_leaves_no_partial_bytes(tmp_path, monkeypatch):
    segment = LogSegment.create(tmp_path, 0)
    segment.append(b"abc")
    real_pwrite = os.pwrite
    calls = []

    def fail_second_call(fd, buf, pos):
        calls.append(pos)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, bytes(buf[:2]), pos)

    monkeypatch.setattr(os, "pwrite", fail_second_call)
    with pytest.raises(OSError):
        segment.append(b"defgh")
    assert segment.size == 3
    assert os.path.getsize(segment.path) == 3


# --- append, read, roll --------------------------------------------------------------


def test_append_read_round_trip_across_rolls(tmp_path):
    log = open_log(tmp_path, max_segment_size=200)
    offsets = [log.append(rec(i)) for i in range(20)]
    assert offsets[0] == 0
    assert all(b - a == len(rec(0)) for a, b in zip(offsets, offsets[1:]))
    assert len(log.segments) > 3
    # Segment files are named by their absolute start offset and are contiguous.
    for prev, nxt in zip(log.segments, log.segments[1:]):
        assert prev.end == nxt.start and prev.read_only
        assert nxt.path.name == segment_file_name(nxt.start)
    assert not log.segments[-1].read_only
    for i, offset in enumerate(offsets):
        (got,) = record.iter_records(log.read(offset, len(rec(i))), offset)
        assert (got.offset, got.msg_id) == (offset, 1000 + i)
    assert [r.msg_id for r in records_in(log)] == [1000 + i for i in range(20)]


def test_roll_happens_before_the_write_and_never_splits_a_batch(tmp_path):
    log = open_log(tmp_path, max_segment_size=100)
    batch = b"".join(rec(i) for i in range(5))  # 250 bytes, more than a segment
    assert log.append(batch) == 0
    assert len(log.segments) == 1 and log.segments[0].size == len(batch)
    assert log.append(rec(5)) == len(batch)
    assert [s.start for s in log.segments] == [0, len(batch)]


def test_read_stays_in_one_segment_and_respects_upto(tmp_path):
    log = open_log(tmp_path, max_segment_size=100)
    for i in range(6):
        log.append(rec(i))  # 50 bytes each: two records per segment
    assert [s.start for s in log.segments] == [0, 100, 200]
    assert log.read(0, 1000) == rec(0) + rec(1)  # stops at the segment end
    assert log.read(50, 1000) == rec(1)
    assert log.read(100, 70) == (rec(2) + rec(3))[:70]  # max_bytes, mid-record allowed
    assert log.read(100, 1000, upto=150) == rec(2)
    assert log.read(100, 1000, upto=120) == rec(2)[:20]
    assert log.read(150, 1000, upto=120) == b""  # at or past upto: nothing
    assert log.read(log.log_end, 1000) == b""
    segment, position, length = log.file_range(230, 1000)
    assert (segment.start, position, length) == (200, 30, 70)
    with pytest.raises(OffsetOutOfRange):
        log.read(log.log_end + 1, 10)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, 10)


def test_nearest_offset(tmp_path):
    log = open_log(tmp_path, max_segment_size=100)
    for i in range(6):
        log.append(rec(i))
    assert log.nearest_offset(0) == 0
    assert log.nearest_offset(99) == 0
    assert log.nearest_offset(100) == 100
    assert log.nearest_offset(250) == 200
    assert log.nearest_offset(300) == 300
    assert log.nearest_offset(10_000) == 300
    for segment in log.detach_segments_older_than(float("inf")):  # drops all closed segments
        segment.close()
    assert log.min_offset == 200
    assert log.nearest_offset(5) == 200
    with pytest.raises(OffsetOutOfRange):
        log.read(5, 10)


def test_empty_directory_starts_at_start_offset(tmp_path):
    log = open_log(tmp_path, start_offset=123_456)
    assert (log.min_offset, log.log_end, log.flushed_end) == (123_456, 123_456, 123_456)
    assert segment_names(tmp_path) == [segment_file_name(123_456)]
    assert log.append(rec(0)) == 123_456
    assert log.last_msg_id() == 1000
    log.close()
    reopened = open_log(tmp_path, start_offset=0)  # an existing log ignores start_offset
    assert reopened.min_offset == 123_456 and reopened.log_end == 123_456 + len(rec(0))


def test_reopen_continues_at_log_end(tmp_path):
    log = open_log(tmp_path, max_segment_size=100)
    for i in range(5):
        log.append(rec(i, attribute=f"attr{i}"))
    end = log.log_end
    log.close()
    log = open_log(tmp_path, max_segment_size=100)
    assert log.log_end == end == log.flushed_end
    assert log.append(rec(5)) == end
    assert [r.attribute for r in records_in(log)] == [f"attr{i}" for i in range(5)] + [None]
    assert log.last_msg_id() == 1005


def test_overlap_error_names_the_files(tmp_path):
    log = open_log(tmp_path, max_segment_size=100)
    for i in range(4):
        log.append(rec(i))
    log.close()
    # (A gap is a missing range, not an error: tests/unit/test_store_scrub.py.)
    (tmp_path / segment_file_name(100)).rename(tmp_path / segment_file_name(80))
    with pytest.raises(LogCorruptError, match=r"00000000000000000000\.meta.*00000000000000000080\.meta"):
        open_log(tmp_path, max_segment_size=100)


def test_other_files_in_the_directory_are_ignored(tmp_path):
    log = open_log(tmp_path)
    log.append(rec(0))
    log.close()
    (tmp_path / "00000000000000000000.meta.corrupt-x").write_bytes(b"junk")
    (tmp_path / "00000000000000099999.arc").write_bytes(b"junk")
    assert open_log(tmp_path).log_end == len(rec(0))


# --- recovery --------------------------------------------------------------------------


def _write_then_damage(tmp_path: Path, damage) -> tuple[int, bytes]:
    log = open_log(tmp_path, max_segment_size=100)
    for i in range(5):
        log.append(rec(i))
    good_end = log.log_end
    log.close()
    last = max(tmp_path.glob("*.meta"))
    data = last.read_bytes()
    last.write_bytes(damage(data))
    return good_end, data


@pytest.mark.parametrize(
    "name, damage, kept_records",
    [
        ("half a record", lambda d: d + rec(5)[:33], 5),
        ("garbage bytes", lambda d: d + b"\xff" * 7 + b"\x00" * 40, 5),
        ("flipped crc byte", lambda d: d[:-50 + 5] + bytes([d[-50 + 5] ^ 0x01]) + d[-50 + 6 :], 4),
        ("flipped payload byte", lambda d: d[:-1] + bytes([d[-1] ^ 0x80]), 4),
    ],
)
def test_recovery_keeps_whole_records_and_moves_the_tail_aside(tmp_path, caplog, name, damage, kept_records):
    _good_end, _ = _write_then_damage(tmp_path, damage)
    damaged_size = sum(p.stat().st_size for p in tmp_path.glob("*.meta"))
    with caplog.at_level(logging.WARNING, logger="metaq.store.log"):
        log = open_log(tmp_path, max_segment_size=100)
    expected_end = kept_records * len(rec(0))
    assert log.log_end == expected_end == log.flushed_end
    assert [r.msg_id for r in records_in(log)] == [1000 + i for i in range(kept_records)]
    (aside,) = tmp_path.glob("*.corrupt-*")
    assert aside.name.startswith(segment_file_name(200))
    assert aside.stat().st_size == damaged_size - expected_end  # nothing silently lost
    assert f"{aside.stat().st_size} bytes" in caplog.text
    # Appends continue exactly where the good records end.
    assert log.append(rec(9)) == expected_end
    assert records_in(log)[-1].msg_id == 1009


def test_recovery_of_a_clean_log_moves_nothing(tmp_path):
    _write_then_damage(tmp_path, lambda d: d)
    open_log(tmp_path, max_segment_size=100)
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_recovery_accepts_records_bigger_than_a_scan_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "WALK_CHUNK", 64)
    big = record.encode_record(b"x" * 500, msg_id=7)
    log = open_log(tmp_path, max_segment_size=10_000, max_message_size=16)
    log.append(rec(0) + big + rec(1))
    log.append(big)
    end = log.log_end
    log.close()
    log = open_log(tmp_path, max_segment_size=10_000, max_message_size=16)
    assert log.log_end == end
    assert log.last_msg_id() == 7


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=120), min_size=1, max_size=25),
    cut_fraction=st.floats(min_value=0, max_value=1),
)
def test_recovery_after_a_cut_at_any_byte_keeps_exactly_the_whole_records(tmp_path_factory, sizes, cut_fraction):
    directory = tmp_path_factory.mktemp("cut")
    records = [
        record.encode_record(bytes([i % 251]) * size, "a" if i % 3 == 0 else None, msg_id=i + 1)
        for i, size in enumerate(sizes)
    ]
    log = open_log(directory, max_segment_size=1 << 20)
    log.append(b"".join(records))
    log.close()
    path = directory / segment_file_name(0)
    data = path.read_bytes()
    cut = int(len(data) * cut_fraction)
    path.write_bytes(data[:cut])
    log = open_log(directory, max_segment_size=1 << 20)
    whole = [r for r, end in zip(records, record.record_ends(data)) if end <= cut]
    assert log.log_end == sum(map(len, whole))
    assert log.read(0, 1 << 20) == b"".join(whole)
    log.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(
        st.lists(st.tuples(st.binary(max_size=60), st.one_of(st.none(), st.text(max_size=8))), min_size=1, max_size=6),
        min_size=1,
        max_size=15,
    ),
    max_segment_size=st.integers(min_value=1, max_value=400),
)
def test_random_batches_read_back_record_by_record(tmp_path_factory, batches, max_segment_size):
    log = open_log(tmp_path_factory.mktemp("batches"), max_segment_size=max_segment_size)
    expected = []  # (offset, data, attribute) per record
    for batch in batches:
        buf = record.encode_batch(batch)
        offset = log.append(buf)
        assert offset == log.log_end - len(buf)
        # A batch is never split: one read from its start returns all of it.
        assert log.read(offset, len(buf)) == buf
        decoded = list(record.iter_records(buf, offset))
        assert [(r.data, r.attribute) for r in decoded] == batch
        expected.extend((r.offset, r.data, r.attribute) for r in decoded)
    for offset, data, attribute in expected:
        got = next(record.iter_records(log.read(offset, 1 << 20), offset))
        assert (got.data, got.attribute) == (data, attribute)
    assert [(r.offset, r.data, r.attribute) for r in records_in(log)] == expected
    log.close()


# --- truncate_to -----------------------------------------------------------------------


def test_truncate_to_within_the_active_segment(tmp_path):
    log = open_log(tmp_path, max_segment_size=1000)
    for i in range(6):
        log.append(rec(i))
    log.flush()
    aside = log.truncate_to(200)
    assert aside is not None and aside.name.startswith("truncated-00000000000000000200-")
    assert aside.read_bytes() == b"".join(rec(i) for i in range(4, 6))
    assert (log.log_end, log.flushed_end) == (200, 200)
    assert log.append(rec(7)) == 200
    assert [r.msg_id for r in records_in(log)] == [1000, 1001, 1002, 1003, 1007]
    assert log.truncate_to(log.log_end) is None


def test_truncate_to_across_several_segments(tmp_path):
    log = open_log(tmp_path, max_segment_size=100)
    for i in range(9):
        log.append(rec(i))
    assert [s.start for s in log.segments] == [0, 100, 200, 300, 400]
    aside = log.truncate_to(150)
    assert aside.read_bytes() == b"".join(rec(i) for i in range(3, 9))
    assert [s.start for s in log.segments] == [0, 100]
    assert segment_names(tmp_path) == [segment_file_name(0), segment_file_name(100)]
    assert not log.segments[-1].read_only and log.log_end == 150
    assert log.append(rec(20)) == 150
    assert log.append(rec(21)) == 200  # the segment is full again: rolls to a new file at 200
    assert [s.start for s in log.segments] == [0, 100, 200]
    log.close()
    reopened = open_log(tmp_path, max_segment_size=100)
    assert [r.msg_id for r in records_in(reopened)] == [1000, 1001, 1002, 1020, 1021]


def test_truncate_to_a_segment_boundary_and_bad_offsets(tmp_path):
    log = open_log(tmp_path, max_segment_size=100)
    for i in range(5):
        log.append(rec(i))
    with pytest.raises(ValueError, match="not the start of a record"):
        log.truncate_to(120)
    with pytest.raises(OffsetOutOfRange):
        log.truncate_to(log.log_end + 50)
    log.truncate_to(100)
    assert [(s.start, s.size) for s in log.segments] == [(0, 100), (100, 0)]
    assert log.append(rec(9)) == 100


# --- flush and retention primitives --------------------------------------------------


def test_flush_syncs_rolled_segments_and_advances(tmp_path, monkeypatch):
    log = open_log(tmp_path, max_segment_size=100)
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    for i in range(5):
        log.append(rec(i))
    assert log.flushed_end == 0
    assert log.flush() == log.log_end == 250
    segment_fds = {s.fileno() for s in log.segments}
    assert segment_fds <= set(synced)  # rolled-but-unsynced segments included
    synced.clear()
    assert log.flush() == 250 and synced == []  # nothing new: no fsync


def test_detach_segments_older_than_only_takes_closed_old_segments(tmp_path):
    log = open_log(tmp_path, max_segment_size=100)
    for i in range(7):
        log.append(rec(i))
    starts = [s.start for s in log.segments]
    assert starts == [0, 100, 200, 300]
    # Make the second segment newer than the cutoff: detaching stops there.
    os.utime(log.segments[0].path, (1000, 1000))
    os.utime(log.segments[1].path, (5000, 5000))
    os.utime(log.segments[2].path, (1000, 1000))
    os.utime(log.segments[3].path, (1000, 1000))
    (detached,) = log.detach_segments_older_than(2000)
    assert detached.start == 0 and log.min_offset == 100
    assert not detached.closed and detached.path.exists(), "the caller disposes of the file"
    detached.close()
    later = log.detach_segments_older_than(10_000)
    assert [s.start for s in later] == [100, 200]
    for segment in later:
        segment.close()
    assert [s.start for s in log.segments] == [300]  # the active segment always stays
    assert log.detach_segments_older_than(float("inf")) == []


def test_truncate_fully_and_start_at(tmp_path):
    log = open_log(tmp_path, max_segment_size=100)
    for i in range(5):
        log.append(rec(i))
    aside = log.truncate_fully_and_start_at(10_000)
    assert aside.read_bytes() == b"".join(rec(i) for i in range(5))
    assert (log.min_offset, log.log_end, log.flushed_end) == (10_000, 10_000, 10_000)
    assert segment_names(tmp_path) == [segment_file_name(10_000)]
    assert log.append(rec(5)) == 10_000
    assert log.truncate_fully_and_start_at(0) is not None and log.truncate_fully_and_start_at(7) is None
