"""Batch boundaries for a sync master's committed offset (metaq/txn/batch_spans.py, the state's use of it).

The property: the answer is never strictly inside a batch, never above the offset
asked, and is the offset itself whenever no batch contains it (so a log of plain
puts sees no change); "cannot tell" only below what the spans still know, and then
the committed offset does not move.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.config import TopicConfig
from metaq.record import buffer_reader, encode_batch, record_ends
from metaq.server.partitions import Partitions
from metaq.store.manager import MessageStoreManager
from metaq.txn.batch_spans import BatchSpans
from metaq.txn.control import frame_batch
from metaq.txn.rebuild import PartitionTxnState, load_state, write_snapshot


def layout(items: list[tuple[bool, int]]) -> tuple[list[tuple[int, int]], int]:
    """(is a batch, size) in log order -> the batch spans and the log end."""
    spans, at = [], 0
    for is_batch, size in items:
        if is_batch:
            spans.append((at, at + size))
        at += size
    return spans, at


def expected(spans: list[tuple[int, int]], offset: int) -> int:
    """The plain answer: the start of the batch strictly containing ``offset``, else ``offset``."""
    return next((start for start, end in spans if start < offset < end), offset)


ITEMS = st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(ITEMS, st.integers(2, 6), st.lists(st.integers(0, 1300), max_size=8))
def test_the_bound_is_never_inside_a_batch_and_is_the_plain_answer_outside_batches(
    items: list[tuple[bool, int]], max_spans: int, forgets: list[int]
) -> None:
    spans, end = layout(items)
    known = BatchSpans(0, max_spans=max_spans)
    for start, stop in spans:
        known.add(start, stop)
    for committed in sorted(expected(spans, min(f, end)) for f in forgets):  # committed: boundaries, rising
        known.forget_ending_by(committed)
    assert len(known) <= max_spans
    assert known.known_from == 0 or known.known_from in {stop for _, stop in spans}
    for offset in range(end + 1):
        answer = known.boundary_at_or_below(offset)
        if answer is None:
            assert offset < known.known_from  # only below what it still knows
            assert known.committed_bound(offset, known.known_from) == known.known_from
            continue
        assert not any(start < answer < stop for start, stop in spans)
        assert answer == offset or answer in {start for start, _ in spans}
        if len(spans) <= max_spans:
            assert answer == expected(spans, offset)
        else:  # coarsened: never above the plain answer
            assert answer <= expected(spans, offset)


def test_more_batches_than_the_cap_in_one_flush_still_let_committed_move() -> None:
    known = BatchSpans(0, max_spans=4)
    for start in range(0, 100, 10):  # ten batches of 10 bytes before any question
        known.add(start, start + 10)
    assert len(known) <= 4 and known.known_from == 0
    moved = known.committed_bound(55, 0)  # a slave reports the middle of the sixth batch
    assert 0 < moved <= 50 and moved % 10 == 0
    assert known.committed_bound(100, moved) == 100


def test_a_log_of_plain_puts_keeps_every_offset() -> None:
    spans = BatchSpans(100)
    assert [spans.committed_bound(o, 100) for o in (100, 150, 9999)] == [100, 150, 9999]
    assert len(spans) == 0


def test_batches_out_of_log_order_or_a_tiny_cap_are_refused() -> None:
    spans = BatchSpans()
    spans.add(0, 10)
    with pytest.raises(ValueError, match="starts before the end"):
        spans.add(5, 20)
    with pytest.raises(ValueError, match="max_spans"):
        BatchSpans(max_spans=1)


# --- the partition state, over real bytes ------------------------------------------------------


def plain(count: int) -> bytes:
    return encode_batch([(b"p" * 20, None)] * count)


def batch(pid: int, seq: int, count: int) -> bytes:
    return bytes(frame_batch(bytearray(plain(count)), count, producer_id=pid, producer_epoch=0, first_seq=seq,
                             timestamp_ms=1000 + seq))


def build_log() -> tuple[bytearray, list[tuple[int, int]]]:
    log, spans = bytearray(), []
    for n, (is_batch, count) in enumerate([(False, 2), (True, 3), (True, 1), (False, 1), (True, 4), (False, 3)]):
        start = len(log)
        log += batch(1, n * 10, count) if is_batch else plain(count)
        if is_batch:
            spans.append((start, len(log)))
    return log, spans


def test_the_state_knows_every_batch_it_walked_or_appended() -> None:
    log, spans = build_log()
    walked = PartitionTxnState()
    walked.catch_up(buffer_reader(log, 0), len(log))
    for offset in [0, *record_ends(log)]:  # every position a slave can report
        assert walked.committed_bound(offset, 0) == expected(spans, offset)


def test_a_slave_with_half_a_batch_vouches_only_for_its_start() -> None:
    log, spans = build_log()
    start, end = spans[-1]
    for cut in [e for e in record_ends(log) if start < e < end]:
        state = PartitionTxnState()
        state.catch_up(buffer_reader(log[:cut], 0), cut)
        assert state.position == start and state.committed_bound(cut, 0) == start


def test_below_a_snapshot_the_state_cannot_tell_and_committed_stays() -> None:
    log, spans = build_log()
    reader = buffer_reader(log, 0)
    taken = PartitionTxnState()
    taken.catch_up(reader, spans[1][1])  # a snapshot after the second batch
    with tempfile.TemporaryDirectory() as tmp:
        write_snapshot(Path(tmp), taken)
        loaded = load_state(Path(tmp), reader, 0, len(log))
    inside_first = record_ends(log, 0)[3]  # inside the first batch, below the snapshot
    assert spans[0][0] < inside_first < spans[0][1]
    assert loaded.committed_bound(inside_first, 7) == 7
    inside_last = record_ends(log[spans[-1][0]:], spans[-1][0])[1]
    assert loaded.committed_bound(inside_last, 7) == spans[-1][0]


def test_the_registry_answers_for_a_real_partition_and_forgets_committed_batches(tmp_path: Path) -> None:
    config = TopicConfig(name="t", data_path=str(tmp_path), num_partitions=1, max_segment_size=300)
    manager = MessageStoreManager({"t": config}, max_message_size=1024)
    try:
        states = Partitions(manager)
        data, spans = build_log()
        states.get("t", 0).append_as_follower(data)  # as a slave appends (in segments of 300 bytes)
        ends = record_ends(data)
        assert [states.batch_boundary("t", 0, o, 0) for o in ends] == [expected(spans, o) for o in ends]
        state = states.state("t", 0)
        states.batch_boundary("t", 0, len(data), spans[1][1])
        assert len(state.batches) == 1  # the two batches below committed are gone
    finally:
        manager.close()
