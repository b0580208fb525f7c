"""The put step of the transaction layer (metaq/txn/put.py)."""

from __future__ import annotations

import pytest

from metaq.record import buffer_reader, encode_batch, iter_records
from metaq.txn.control import Control, Kind, encode_control
from metaq.txn.put import BATCH_HEADER_SIZE, PutRefused, plan_put
from metaq.txn.producer_state import Verdict
from metaq.txn.rebuild import PartitionTxnState


def test_a_new_batch_is_framed_and_a_retry_is_re_acked_at_the_original_offset() -> None:
    state, log = PartitionTxnState(), bytearray(encode_batch([(b"before", None)]))
    state.catch_up(buffer_reader(log, 0), len(log))
    batch = encode_batch([(b"a", None), (b"b", None)])
    plan = plan_put(state.producers, batch, 2, producer_id=4, producer_epoch=0, first_seq=0, timestamp_ms=1)
    assert plan.decision.verdict is Verdict.NEW and plan.data_start == BATCH_HEADER_SIZE
    acked_offset = len(log) + plan.data_start
    log += plan.append
    state.catch_up(buffer_reader(log, 0), len(log))
    assert [r.data for r in iter_records(log[acked_offset:], acked_offset)] == [b"a", b"b"]

    retry = plan_put(state.producers, batch, 2, producer_id=4, producer_epoch=0, first_seq=0, timestamp_ms=2)
    assert retry.append is None and retry.decision.verdict is Verdict.DUPLICATE
    assert (retry.decision.first_offset, retry.decision.end_offset) == (acked_offset, len(log))


def test_a_transactional_batch_opens_its_transaction() -> None:
    state = PartitionTxnState()
    plan = plan_put(state.producers, encode_batch([(b"x", None)]), 1, producer_id=1, producer_epoch=0,
                    first_seq=0, timestamp_ms=1, txid="TX:1:0")
    state.catch_up(buffer_reader(plan.append, 0), len(plan.append))
    assert state.index.first_open_offset() == 0 and plan.data_start > BATCH_HEADER_SIZE


def test_a_forged_control_record_is_refused_before_the_table_is_asked() -> None:
    forged = encode_batch([(b"x", None)]) + encode_control(Control(Kind.COMMIT, 1, 0, 0, "TX:1:0"))
    with pytest.raises(PutRefused, match="record 1 of the batch uses the reserved control attribute"):
        plan_put(PartitionTxnState().producers, forged, 2, producer_id=1, producer_epoch=0, first_seq=0,
                 timestamp_ms=0)


def test_the_masters_fast_path_equals_a_slaves_walk_and_refuses_a_wrong_position() -> None:
    master, log = PartitionTxnState(), bytearray()
    for seq, txid in enumerate(["", "TX:1:0", ""]):
        plan = plan_put(master.producers, encode_batch([(b"m", None)] * 3), 3, producer_id=1, producer_epoch=0,
                        first_seq=seq * 3, timestamp_ms=seq, txid=txid)
        master.appended(len(log), plan.append, plan.header if seq else None)
        log += plan.append
    slave = PartitionTxnState()
    slave.catch_up(buffer_reader(log, 0), len(log))
    assert slave == master and slave.anchor == master.anchor
    with pytest.raises(ValueError, match="catch up first"):
        master.appended(0, plan.append)
    with pytest.raises(ValueError, match="BATCH header of exactly these records"):
        master.appended(len(log), encode_batch([(b"plain", None)]))
