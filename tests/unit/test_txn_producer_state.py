"""The idempotence table (metaq/txn/producer_state.py): every verdict, bounds, expiry."""

from __future__ import annotations

import pytest

from metaq.txn.control import MAX_SEQUENCE, Control, Kind
from metaq.txn.producer_state import Decision, ProducerStateTable, Verdict

HEADER = 72  # a BATCH header without a transaction id


def batch(pid: int, epoch: int, first: int, count: int, ts: int = 0) -> Control:
    return Control(Kind.BATCH, pid, epoch, ts, "", first, count, 100 * count)


def table_with(*batches: tuple[int, int, int, int], max_batches: int = 5) -> ProducerStateTable:
    table = ProducerStateTable(max_batches=max_batches)
    offset = 0
    for pid, epoch, first, count in batches:
        table.apply(batch(pid, epoch, first, count), offset, HEADER)
        offset += HEADER + 100 * count
    return table


def test_an_unknown_producer_is_new_whatever_its_sequence() -> None:
    assert ProducerStateTable().check(1, 0, 0, 1) == Decision(Verdict.NEW)
    assert ProducerStateTable().check(1, 0, 77, 3) == Decision(Verdict.NEW)


def test_the_next_sequence_is_new() -> None:
    assert table_with((1, 0, 0, 3)).check(1, 0, 3, 2).verdict is Verdict.NEW


def test_a_retry_of_a_cached_batch_returns_its_original_offsets() -> None:
    table = table_with((1, 0, 0, 3), (1, 0, 3, 2))
    assert table.check(1, 0, 0, 3) == Decision(Verdict.DUPLICATE, HEADER, HEADER + 300)
    second = HEADER + 300 + HEADER
    assert table.check(1, 0, 3, 2) == Decision(Verdict.DUPLICATE, second, second + 200)


def test_a_retry_older_than_the_cache_is_a_duplicate_without_offsets() -> None:
    table = table_with(*[(1, 0, i, 1) for i in range(8)], max_batches=3)
    assert [b.first_seq for b in table.producers[1].batches] == [5, 6, 7]
    assert table.check(1, 0, 2, 1) == Decision(Verdict.DUPLICATE)


def test_a_gap_is_out_of_order_and_names_the_expected_sequence() -> None:
    assert table_with((1, 0, 0, 3)).check(1, 0, 5, 1) == Decision(Verdict.OUT_OF_ORDER, expected_seq=3)
    # an overlapping range that is not one of the batches is not a retry either
    assert table_with((1, 0, 0, 3)).check(1, 0, 2, 3).verdict is Verdict.OUT_OF_ORDER


def test_an_older_epoch_is_fenced_and_a_newer_one_restarts_at_zero() -> None:
    table = table_with((1, 3, 0, 1))
    assert table.check(1, 2, 1, 1) == Decision(Verdict.FENCED, current_epoch=3)
    assert table.check(1, 4, 0, 1).verdict is Verdict.NEW
    assert table.check(1, 4, 9, 1) == Decision(Verdict.OUT_OF_ORDER, expected_seq=0)
    table.apply(batch(1, 4, 0, 1), 10_000, HEADER)
    assert [b.first_seq for b in table.producers[1].batches] == [0] and table.producers[1].epoch == 4
    table.apply(batch(1, 3, 1, 1), 20_000, HEADER)  # a fenced epoch in the log changes nothing
    assert table.producers[1].epoch == 4 and len(table.producers[1].batches) == 1


def test_sequences_wrap_after_the_31_bit_maximum() -> None:
    table = table_with((1, 0, MAX_SEQUENCE - 1, 2))
    assert table.check(1, 0, 0, 1).verdict is Verdict.NEW
    assert table.check(1, 0, MAX_SEQUENCE - 1, 2).verdict is Verdict.DUPLICATE


def test_producers_are_independent() -> None:
    table = table_with((1, 0, 0, 1), (2, 0, 0, 1))
    assert table.check(2, 0, 1, 1).verdict is Verdict.NEW and table.check(1, 0, 0, 1).verdict is Verdict.DUPLICATE


def test_idle_producers_expire_by_the_logs_timestamps() -> None:
    table = ProducerStateTable(expiry_ms=1000)
    table.apply(batch(1, 0, 0, 1, ts=100), 0, HEADER)
    table.apply(batch(2, 0, 0, 1, ts=900), 200, HEADER)
    assert table.expire(1500) == [1] and set(table.producers) == {2}
    assert table.check(1, 0, 0, 1).verdict is Verdict.NEW  # forgotten: its old batch would be appended again


def test_batches_outside_idempotence_are_ignored() -> None:
    table = ProducerStateTable()
    table.apply(batch(-1, 0, 0, 1), 0, HEADER)
    table.apply(Control(Kind.COMMIT, 1, 0, 0, "t"), 0, 50)
    assert table.producers == {}


def test_the_json_form_round_trips_and_keeps_the_bound() -> None:
    table = table_with((1, 0, 0, 3), (1, 0, 3, 2), (5, 1, 0, 1))
    again = ProducerStateTable()
    again.load_json(table.to_json())
    assert again == table
    small = ProducerStateTable(max_batches=1)
    small.load_json(table.to_json())
    assert [b.first_seq for b in small.producers[1].batches] == [3]


@pytest.mark.parametrize("first, count", [(-1, 1), (MAX_SEQUENCE + 1, 1), (0, 0)])
def test_bad_sequence_ranges_are_refused(first: int, count: int) -> None:
    with pytest.raises(ValueError, match="bad sequence range"):
        ProducerStateTable().check(1, 0, first, count)
