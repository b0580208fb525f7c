"""The sparse time index (metaq/store/timeindex.py) and PartitionLog.offset_for_time.

Every answer is checked against a brute-force walk of the log's records: the first
record whose msg id's time is >= T.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq import record
from metaq.store import timeindex
from metaq.store.log import PartitionLog
from metaq.store.msgid import MsgIdGenerator, msg_id_timestamp_ms
from metaq.store.retention import delete_segment_file
from metaq.store.timeindex import ENTRY_SIZE, MAX_UNINDEXED_APPEND, index_path, parse_entries

from .test_store_log import records_in

T0 = 1_700_000_000_000


class Writer:
    """Appends batches stamped by a MsgIdGenerator whose clock moves ``step_ms`` per batch."""

    def __init__(self, log: PartitionLog, step_ms: int = 3, size: int = 100) -> None:
        self.log, self.step_ms, self.size = log, step_ms, size
        self.now = T0
        self.ids = MsgIdGenerator(7, clock_ms=lambda: self.now)

    def batch(self, count: int) -> bytearray:
        buf = bytearray(record.encode_batch([(os.urandom(self.size), None)] * count))
        record.stamp_msg_ids(buf, self.ids.allocate(count))
        self.now += self.step_ms
        return buf

    def put(self, count: int = 10) -> int:
        return self.log.append(self.batch(count))


def brute_force(log: PartitionLog, time_ms: int) -> int | None:
    for r in records_in(log):
        if msg_id_timestamp_ms(r.msg_id) >= time_ms:
            return r.offset
    return None


def check_all(log: PartitionLog, times: list[int]) -> None:
    for t in times:
        assert log.offset_for_time(t) == brute_force(log, t), t


def sample_times(log: PartitionLog, n: int = 60, seed: int = 1) -> list[int]:
    stamps = [msg_id_timestamp_ms(r.msg_id) for r in records_in(log)]
    rng = random.Random(seed)
    picks = [rng.choice(stamps) + rng.choice((-1, 0, 1)) for _ in range(n)]
    return [0, stamps[0], stamps[-1], stamps[-1] + 1, *picks]


def filled(tmp_path: Path, batches: int = 200, segment: int = 32 * 1024) -> tuple[PartitionLog, Writer]:
    log = PartitionLog(tmp_path / "t-0", max_segment_size=segment)
    writer = Writer(log)
    for i in range(batches):
        writer.put(1 + i % 13)
    log.flush()
    return log, writer


def test_answers_match_a_walk_of_the_log_across_segments(tmp_path: Path) -> None:
    log, _ = filled(tmp_path)
    assert len(log.segments) > 3
    check_all(log, sample_times(log))
    assert log.offset_for_time(T0 - 10) == 0  # before everything: the first record
    assert log.offset_for_time(T0 + 10**9) is None  # past the end: none ("latest")


def test_upto_bounds_the_answer(tmp_path: Path) -> None:
    log, writer = filled(tmp_path, batches=20)
    middle = writer.put(5)
    writer.put(5)
    late = msg_id_timestamp_ms(records_in(log)[-1].msg_id)
    assert log.offset_for_time(late) is not None
    assert log.offset_for_time(late, upto=middle) is None


def test_entries_are_sparse_and_appends_keep_no_descriptor(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    log, _ = filled(tmp_path, batches=400, segment=1 << 30)
    log.flush()
    assert len(os.listdir("/proc/self/fd")) == before + 1  # the one segment's descriptor only
    entries, sealed, problem = parse_entries(index_path(log.segments[0].path).read_bytes(), 0, log.log_end)
    assert problem is None and not sealed
    gaps = [b[1] - a[1] for a, b in zip(entries, entries[1:])]
    assert min(gaps) >= timeindex.DEFAULT_INTERVAL
    assert len(entries) <= log.log_end // timeindex.DEFAULT_INTERVAL + 1


def test_a_large_append_is_indexed_inside(tmp_path: Path) -> None:
    """A slave's fetch reply piece: one append of many batches gets entries every interval."""
    source, _ = filled(tmp_path / "master", batches=500, segment=1 << 30)
    replica = PartitionLog(tmp_path / "slave", max_segment_size=1 << 30)
    data = source.read(0, 1 << 30)
    assert len(data) > MAX_UNINDEXED_APPEND
    replica.append(data)
    replica.flush()
    entries, _, _ = parse_entries(index_path(replica.segments[0].path).read_bytes(), 0, replica.log_end)
    gaps = [b[1] - a[1] for a, b in zip(entries, entries[1:])]
    assert max(gaps) < timeindex.DEFAULT_INTERVAL + 2000
    times = sample_times(source)
    assert [replica.offset_for_time(t) for t in times] == [source.offset_for_time(t) for t in times]


def reopen(log: PartitionLog, segment: int = 32 * 1024) -> PartitionLog:
    log.close()
    return PartitionLog(log.directory, max_segment_size=segment)


def test_reopened_log_uses_its_files_without_rebuilding(tmp_path: Path) -> None:
    log, _ = filled(tmp_path)
    expected = {t: log.offset_for_time(t) for t in sample_times(log)}
    before = timeindex.REBUILDS.total
    log = reopen(log)
    assert {t: log.offset_for_time(t) for t in expected} == expected
    assert timeindex.REBUILDS.total == before


def test_a_log_laid_out_empty_and_opened_indexes_its_first_segment_without_a_rebuild(tmp_path: Path) -> None:
    """A log made by the store's batch (``lay_out_empty_log``, then opened as an existing log)
    indexes its first segment as it fills, as a log created by ``PartitionLog`` does."""
    from metaq.store.log import lay_out_empty_log

    lay_out_empty_log(tmp_path / "p", 0)
    log = PartitionLog(tmp_path / "p", max_segment_size=32 * 1024)
    writer = Writer(log)
    for _ in range(120):
        writer.put()
    assert len(log.segments) > 2
    assert index_path(log.segments[0].path).exists()  # sealed with its entries, not left to a rebuild
    before = timeindex.REBUILDS.total
    check_all(log, sample_times(log))
    assert timeindex.REBUILDS.total == before


@pytest.mark.parametrize("damage", ["delete", "torn", "flip", "garbage"])
def test_missing_torn_or_corrupt_files_are_rebuilt_on_first_use(tmp_path: Path, damage: str, caplog) -> None:
    log, writer = filled(tmp_path)
    expected = {t: log.offset_for_time(t) for t in sample_times(log)}
    log.close()
    for path in sorted((tmp_path / "t-0").glob("*.timeindex")):
        data = path.read_bytes()
        if damage == "delete":
            path.unlink()
        elif damage == "torn":
            path.write_bytes(data[: len(data) - 7])
        elif damage == "flip":
            path.write_bytes(data[:30] + bytes([data[30] ^ 0x40]) + data[31:])
        else:
            path.write_bytes(os.urandom(len(data)))
    before = timeindex.REBUILDS.total
    log = PartitionLog(tmp_path / "t-0", max_segment_size=32 * 1024)
    assert {t: log.offset_for_time(t) for t in expected} == expected
    assert timeindex.REBUILDS.total > before
    assert "rebuilt from the segment" in caplog.text
    # rebuilt files are whole again: a second open uses them as they are
    writer.log = log
    log = reopen(log)
    before = timeindex.REBUILDS.total
    assert {t: log.offset_for_time(t) for t in expected} == expected
    assert timeindex.REBUILDS.total == before


def test_lost_unflushed_entries_of_the_active_segment_are_walked_again(tmp_path: Path) -> None:
    """A crash before the index flush: the file ends early, the first lookup walks the rest."""
    log, writer = filled(tmp_path, batches=30, segment=1 << 30)
    path = index_path(log.segments[0].path)
    for _ in range(100):
        writer.put(7)
    log.close()
    path.write_bytes(path.read_bytes()[: 3 * ENTRY_SIZE])
    log = PartitionLog(tmp_path / "t-0", max_segment_size=1 << 30)
    check_all(log, sample_times(log))


def test_truncation_keeps_the_index_exact(tmp_path: Path) -> None:
    log, writer = filled(tmp_path)
    records = records_in(log)
    cut = records[len(records) // 2].offset
    log.truncate_to(cut)
    assert not any(p.name > index_path(log.segments[-1].path).name for p in (tmp_path / "t-0").glob("*.timeindex"))
    writer.now += 1000  # the new master's records after the cut are later
    for i in range(80):
        writer.put(3)
    log.flush()
    check_all(log, sample_times(log, seed=2))
    log = reopen(log)
    check_all(log, sample_times(log, seed=3))


def test_truncate_fully_and_recreated_logs(tmp_path: Path) -> None:
    log, writer = filled(tmp_path, batches=50)
    log.truncate_fully_and_start_at(10_000_000)
    assert list((tmp_path / "t-0").glob("*.timeindex")) in ([], [index_path(log.segments[0].path)])
    assert log.offset_for_time(0) is None
    writer.put(5)
    assert log.offset_for_time(0) == 10_000_000


def test_repaired_range_is_indexed_from_the_restored_bytes(tmp_path: Path) -> None:
    log, _ = filled(tmp_path)
    sealed = log.segments[1]
    expected = {t: log.offset_for_time(t) for t in sample_times(log)}
    good = sealed.read(sealed.start, sealed.size)
    log.mark_corrupt(sealed.start, sealed.end)
    sealed.time_index.invalidate()  # as if rebuilt while the range was bad
    assert all(not sealed.start <= (log.offset_for_time(t) or -1) < sealed.end for t in expected)
    assert log.repair_corrupt(sealed.start, good)
    assert {t: log.offset_for_time(t) for t in expected} == expected


def test_torn_log_tail_cut_at_start_cuts_the_index(tmp_path: Path) -> None:
    log, writer = filled(tmp_path, batches=30, segment=1 << 30)
    end = log.log_end
    writer.put(50)  # not flushed: the checkpoint stays at ``end``, the index file gets its entries at close
    log.close()
    path = log.segments[0].path
    with open(path, "r+b") as handle:
        handle.truncate(end + 500)  # a torn write: part of the last batch
    log = PartitionLog(tmp_path / "t-0", max_segment_size=1 << 30)
    assert end <= log.log_end < end + 500  # the whole records of the torn batch stay
    check_all(log, sample_times(log))


def test_retention_removes_the_index_file(tmp_path: Path) -> None:
    log, _ = filled(tmp_path)
    old = log.detach_segments_older_than(float("inf"))
    assert old
    for segment in old:
        delete_segment_file(segment)
        assert not index_path(segment.path).exists()
    check_all(log, sample_times(log))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 20), st.integers(1, 3000)), min_size=1, max_size=60),
    segment=st.sampled_from([2048, 16 * 1024, 1 << 30]),
)
def test_any_history_answers_like_a_walk(tmp_path_factory, batches, segment) -> None:
    log = PartitionLog(tmp_path_factory.mktemp("p") / "t-0", max_segment_size=segment)
    writer = Writer(log)
    for count, step, size in batches:
        writer.step_ms, writer.size = step, size
        writer.put(count)
    check_all(log, sample_times(log, n=30))


def test_a_build_that_a_truncation_overtakes_is_thrown_away(tmp_path: Path) -> None:
    """First use builds without the log's lock: a cut meanwhile must not let stale entries in."""
    log, writer = filled(tmp_path, batches=60, segment=1 << 30)
    records = records_in(log)
    cut = records[len(records) // 2].offset
    segment = log.segments[0]
    segment.time_index.invalidate()
    calls = []

    def read_then_cut(offset: int, length: int) -> bytes:
        if not calls:
            log.truncate_to(cut)  # what an HA truncation does while the build walks
        calls.append(offset)
        return segment.read(offset, min(length, max(0, segment.end - offset)))

    built = segment.time_index.ensure_ready(read_then_cut, lambda: segment.end, lambda: False, [], "t-0")
    assert built is False and not segment.time_index.ready
    entries, _, _ = parse_entries(index_path(segment.path).read_bytes(), 0, cut)
    assert all(offset < cut for _, offset in entries)
    writer.now += 1000
    for _ in range(20):
        writer.put(4)
    check_all(log, sample_times(log))


def test_retention_during_a_build_leaves_no_index_file_behind(tmp_path: Path) -> None:
    log, _ = filled(tmp_path)
    oldest = log.segments[0]
    oldest.time_index.invalidate()

    def read_then_retire(offset: int, length: int) -> bytes:
        if oldest in log.segments:
            for segment in log.detach_segments_older_than(float("inf")):
                delete_segment_file(segment)
        return b""

    assert oldest.time_index.ensure_ready(read_then_retire, lambda: oldest.end, lambda: True, [], "t-0") is False
    assert not index_path(oldest.path).exists()
