"""Rebuilding a partition's transaction state from its log (metaq/txn/rebuild.py).

The central property: walking the log once from the start, or from a snapshot,
gives exactly the state the master built incrementally while it appended.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.record import buffer_reader, encode_batch
from metaq.txn.control import Kind, frame_batch
from metaq.txn.producer_state import Verdict
from metaq.txn.rebuild import SNAPSHOT_FILE, PartitionTxnState, discard_snapshot, load_state, write_snapshot
from tests.unit.txn_log_model import ModelLog

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 2), st.integers(1, 3), st.sampled_from([None, 0, 1])),
        st.tuples(st.just("retry"), st.integers(0, 2), st.integers(1, 3), st.none()),
        st.tuples(st.sampled_from(["prepare", "commit", "abort"]), st.integers(0, 1), st.none(), st.none()),
    ),
    max_size=40,
)


def run(ops: list[tuple]) -> ModelLog:
    """Play ``ops`` against a model broker; transaction slot k is reused once its transaction ends."""
    model, generation = ModelLog(), {0: 0, 1: 0}

    def txid(slot: int) -> str:
        return f"TX:{slot}:{generation[slot]}"

    for op, a, b, slot in ops:
        if op == "put":
            if slot is not None and model.status.get(txid(slot)) == "prepared":
                continue  # a prepared transaction takes no more records
            model.put(a, b, txid(slot) if slot is not None else "")
        elif op == "retry":
            if model.next_seq.get(a, 0) >= b:
                model.retry_last(a, b)
        elif model.status.get(txid(a)) in ("open", "prepared"):
            kind = {"prepare": Kind.PREPARE, "commit": Kind.COMMIT, "abort": Kind.ABORT}[op]
            if kind is Kind.PREPARE and model.status[txid(a)] == "prepared":
                continue
            model.mark(kind, txid(a))
            if kind is not Kind.PREPARE:
                generation[a] += 1
    return model


@settings(max_examples=150, deadline=None)
@given(OPS, st.integers(0, 40))
def test_rebuild_from_the_log_or_a_snapshot_equals_the_incremental_state(ops: list[tuple], cut: int) -> None:
    model = run(ops)
    rebuilt = PartitionTxnState()
    rebuilt.catch_up(model.read, len(model.log))
    assert rebuilt == model.state and rebuilt.position == len(model.log)

    # a snapshot taken part-way (at a record boundary the master had reached), then the rest of the log
    partial = run(ops[:cut])
    with tempfile.TemporaryDirectory() as tmp:
        write_snapshot(Path(tmp), partial.state)
        assert load_state(Path(tmp), model.read, 0, len(model.log)) == model.state


def test_a_retry_is_answered_from_the_state_and_not_appended() -> None:
    model = ModelLog()
    model.put(1, 3)
    size = len(model.log)
    assert model.retry_last(1, 3) is Verdict.DUPLICATE and len(model.log) == size


def test_a_batch_cut_by_the_end_stops_the_walk_at_its_header() -> None:
    model = ModelLog()
    model.put(1, 1)
    header_at = len(model.log)
    model.put(1, 3, "TX:1:0")
    for end in range(header_at + 1, len(model.log)):
        state = PartitionTxnState()
        state.catch_up(buffer_reader(model.log[:end], 0), end)
        assert state.position == header_at and state.incomplete_tail(end) == header_at
        assert "TX:1:0" not in state.index.open and state.producers.producers[1].batches[-1].first_seq == 0
        # the LSO never passes bytes the walk has not accounted for
        assert state.index.last_stable_offset(end, state.position) == header_at
    # a slave that receives the rest resumes at the header
    state.catch_up(model.read, len(model.log))
    assert state == model.state and state.incomplete_tail(len(model.log)) is None


def test_a_snapshot_from_before_a_truncation_is_not_reused(tmp_path: Path) -> None:
    model = ModelLog()
    model.put(1, 2)
    model.put(2, 1, "TX:2:0")
    write_snapshot(tmp_path, model.state)
    # the log is cut back to the first batch and grows again with different records
    first_end = model.state.producers.producers[1].batches[0].end_offset
    other = bytearray(model.log[:first_end])
    other += frame_batch(bytearray(encode_batch([(b"other", None)] * 3)), 3, producer_id=3, producer_epoch=0,
                         first_seq=0, timestamp_ms=5)
    expected = PartitionTxnState()
    expected.catch_up(buffer_reader(other, 0), len(other))
    loaded = load_state(tmp_path, buffer_reader(other, 0), 0, len(other))
    assert loaded == expected and "TX:2:0" not in loaded.index.open


def test_a_snapshot_past_the_log_end_or_damaged_is_ignored(tmp_path: Path) -> None:
    model = ModelLog()
    model.put(1, 2)
    write_snapshot(tmp_path, model.state)
    empty = load_state(tmp_path, buffer_reader(b"", 0), 0, 0)
    assert empty == PartitionTxnState()
    (tmp_path / SNAPSHOT_FILE).write_bytes(b"123\n{}")
    assert load_state(tmp_path, model.read, 0, len(model.log)) == model.state
    discard_snapshot(tmp_path)
    discard_snapshot(tmp_path)  # twice is fine
    assert not (tmp_path / SNAPSHOT_FILE).exists()


def test_retention_past_the_snapshot_keeps_the_state_and_drops_old_aborted_spans(tmp_path: Path) -> None:
    model = ModelLog()
    model.put(1, 1, "TX:1:0")
    model.mark(Kind.ABORT, "TX:1:0")
    model.put(2, 1)
    write_snapshot(tmp_path, model.state)
    log_start = model.state.producers.producers[2].batches[0].first_offset - 72
    loaded = load_state(tmp_path, model.read, log_start, len(model.log))
    assert loaded.index.aborted == [] and loaded.producers == model.state.producers
