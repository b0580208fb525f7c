"""The transaction index and the read-committed filter (metaq/txn/index.py, reader.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.record import iter_records
from metaq.txn.control import CONTROL_ATTRIBUTE, AbortReason, Control, Kind, control_of
from metaq.txn.index import Outcome, Span, TransactionIndex
from metaq.txn.reader import committed_records
from tests.unit.test_txn_rebuild import OPS, run
from tests.unit.txn_log_model import ModelLog


def test_the_lso_stops_at_the_first_open_transaction_and_moves_on_commit() -> None:
    model = ModelLog()
    model.put(1, 2)
    t_start = len(model.log)
    model.put(2, 2, "TX:2:0")
    model.put(1, 1)
    index, end = model.state.index, len(model.log)
    assert index.last_stable_offset(end, end) == t_start
    model.mark(Kind.COMMIT, "TX:2:0")
    assert index.last_stable_offset(len(model.log), len(model.log)) == len(model.log)
    assert index.last_stable_offset(t_start - 1, len(model.log)) == t_start - 1  # never past committed
    assert index.outcomes["TX:2:0"].kind is Kind.COMMIT


def test_a_transaction_stays_open_for_readers_until_its_marker_is_below_committed() -> None:
    model = ModelLog()
    t_start = len(model.log)
    model.put(2, 1, "TX:2:0")
    between = len(model.log)  # committed may stop here: the first batch in, the second not yet
    model.put(1, 1)
    model.put(2, 1, "TX:2:0")
    before_marker = len(model.log)
    model.mark(Kind.COMMIT, "TX:2:0")
    index, end = model.state.index, len(model.log)
    assert "TX:2:0" not in index.open  # the index follows the log to its end
    assert index.last_stable_offset(between, end) == t_start
    assert index.last_stable_offset(before_marker, end) == t_start
    assert index.last_stable_offset(end, end) == end
    model.mark(Kind.ABORT, "TX:9:9")  # no records here: nothing to hold back
    assert index.last_stable_offset(len(model.log), len(model.log)) == len(model.log)


@settings(max_examples=200, deadline=None)
@given(OPS, st.data())
def test_at_any_committed_offset_no_transaction_is_visible_before_its_marker(ops, data) -> None:
    model = run(ops)
    index, end = model.state.index, len(model.log)
    boundaries = [r.offset for r in iter_records(model.log)] + [end]
    committed = data.draw(st.sampled_from(boundaries))
    lso = index.last_stable_offset(committed, end)
    markers = {}
    for record in iter_records(model.log):
        control = control_of(record)
        if control is not None and control.kind in (Kind.COMMIT, Kind.ABORT) and record.offset + record.size <= committed:
            markers.setdefault(control.txid, record.offset)
    for offset, txid in model.owner.items():
        if txid and offset < lso:
            assert txid in markers and markers[txid] > offset, (txid, offset, lso, committed)
    for txid in {t for t in model.owner.values() if t}:  # never a transaction on both sides of the LSO
        sides = {offset < lso for offset, t in model.owner.items() if t == txid}
        assert len(sides) == 1, (txid, lso, committed)


def test_the_lso_does_not_cut_a_committed_transaction_that_interleaves_with_an_open_one() -> None:
    model = ModelLog()
    t1 = len(model.log)
    model.put(1, 1, "TX:1:0")
    model.put(2, 1, "TX:2:0")  # opens between TX:1:0's two batches
    model.put(1, 1, "TX:1:0")
    model.mark(Kind.COMMIT, "TX:1:0")
    index, end = model.state.index, len(model.log)
    assert index.last_stable_offset(end, end) == t1  # not TX:2:0's first offset: TX:1:0 would be cut
    model.mark(Kind.COMMIT, "TX:2:0")
    assert index.last_stable_offset(len(model.log), len(model.log)) == len(model.log)


def test_a_prepared_transaction_stays_open_and_is_listed() -> None:
    model = ModelLog()
    model.put(1, 1, "XID:1:aa:bb")
    model.mark(Kind.PREPARE, "XID:1:aa:bb")
    (txn,) = model.state.index.prepared()
    assert txn.txid == "XID:1:aa:bb" and txn.timeout_s == 30 and txn.first_offset == 0
    assert model.state.index.last_stable_offset(len(model.log), len(model.log)) == 0


def test_an_abort_records_every_batch_span_and_its_reason() -> None:
    model = ModelLog()
    model.put(1, 2, "TX:1:0")
    model.put(2, 1)
    model.put(1, 1, "TX:1:0")
    model.mark(Kind.ABORT, "TX:1:0", AbortReason.TIMEOUT)
    index = model.state.index
    assert len(index.aborted) == 2 and index.outcomes["TX:1:0"].reason is AbortReason.TIMEOUT
    owned = [o for o, t in model.owner.items() if t == "TX:1:0"]
    assert all(any(s.start <= o < s.end for s in index.aborted) for o in owned)


def test_aborted_between_finds_spans_overlapping_a_range() -> None:
    index = TransactionIndex()
    index.aborted = [Span(0, 100), Span(200, 300), Span(400, 500)]
    assert index.aborted_between(50, 60) == [Span(0, 100)]
    assert index.aborted_between(100, 200) == []
    assert index.aborted_between(250, 450) == [Span(200, 300), Span(400, 500)]
    assert index.aborted_between(0, 1000) == index.aborted


def test_markers_of_unknown_transactions_and_plain_batches_change_nothing() -> None:
    index = TransactionIndex()
    index.observe(Control(Kind.COMMIT, 1, 0, 0, "TX:9:9"), 0, 60)
    index.observe(Control(Kind.BATCH, 1, 0, 0, "", 0, 1, 30), 60, 72)
    assert index == TransactionIndex()


def test_outcomes_are_bounded_oldest_first() -> None:
    index = TransactionIndex(max_outcomes=2)
    for n in range(3):
        index.observe(Control(Kind.BATCH, 1, 0, 0, f"T{n}", 0, 1, 10), n * 100, 80)
        index.observe(Control(Kind.COMMIT, 1, 0, 0, f"T{n}"), n * 100 + 90, 10)
    assert list(index.outcomes) == ["T1", "T2"] and index.outcomes["T2"] == Outcome(Kind.COMMIT, None, 290)


@settings(max_examples=150, deadline=None)
@given(OPS, st.data())
def test_random_interleavings_keep_the_lso_before_every_open_transaction(ops, data) -> None:
    model = run(ops)
    end = len(model.log)
    committed = data.draw(st.integers(0, end))
    lso = model.state.index.last_stable_offset(committed, model.state.position)
    assert lso <= committed
    for txid, first in model.first_open_offsets().items():
        assert lso <= first, txid


def random_fetch(ops: list[tuple], data: st.DataObject) -> tuple[ModelLog, TransactionIndex, int, int, int]:
    """A random history, and a fetch range up to its LSO: (model, index, lso, start, end)."""
    model = run(ops)
    index, end = model.state.index, len(model.log)
    lso = index.last_stable_offset(end, end)
    boundaries = [r.offset for r in iter_records(model.log)] + [end]
    start = data.draw(st.sampled_from([b for b in boundaries if b <= lso]))
    return model, index, lso, start, data.draw(st.integers(start, lso))  # a fetch may end mid-record


@settings(max_examples=150, deadline=None)
@given(OPS, st.data())
def test_the_filter_never_yields_an_aborted_open_or_control_record(ops, data) -> None:
    model, index, lso, start, fetch_end = random_fetch(ops, data)
    got = committed_records(model.log[start:fetch_end], start, index.aborted_between(start, fetch_end))
    for record in got.records:
        assert record.attribute != CONTROL_ATTRIBUTE
        owner = model.owner[record.offset]
        assert owner == "" or model.status[owner] == "commit", (owner, model.status.get(owner))
    assert start <= got.next_offset <= fetch_end
    # from the start up to the LSO, exactly the committed and plain records come out
    everything = committed_records(model.log[:lso], 0, index.aborted_between(0, lso))
    expected = [o for o, t in sorted(model.owner.items()) if o < lso and (t == "" or model.status[t] == "commit")]
    assert [r.offset for r in everything.records] == expected


def test_the_filter_stops_at_the_stable_end_and_skips_past_aborted_records() -> None:
    model = ModelLog()
    model.put(1, 2, "TX:1:0")
    model.mark(Kind.ABORT, "TX:1:0")
    model.put(2, 1)
    end = len(model.log)
    got = committed_records(model.log, 0, model.state.index.aborted)
    assert [r.data for r in got.records] == [b"|2|0"] and got.next_offset == end
    capped = committed_records(model.log, 0, model.state.index.aborted, stable_end=end - 1)
    assert capped.records == [] and capped.next_offset < end
