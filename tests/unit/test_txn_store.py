"""The transaction layer over a real partition log (metaq/store/log.py): control records
survive the store's recovery scan, segment rolls and reopen, and a torn batch is found.
"""

from __future__ import annotations

from pathlib import Path

from metaq.record import encode_batch, stamp_msg_ids
from metaq.store.log import PartitionLog
from metaq.txn.control import Kind, marker
from metaq.txn.put import plan_put
from metaq.txn.rebuild import PartitionTxnState, load_state, write_snapshot


def put(log: PartitionLog, state: PartitionTxnState, pid: int, seq: int, count: int, txid: str = "") -> int:
    plan = plan_put(state.producers, encode_batch([(b"m" * 40, None)] * count), count, producer_id=pid,
                    producer_epoch=0, first_seq=seq, timestamp_ms=seq, txid=txid)
    stamp_msg_ids(plan.append, 1 + log.log_end)
    offset = log.append(plan.append)
    state.appended(offset, plan.append, plan.header)
    return offset


def mark(log: PartitionLog, state: PartitionTxnState, kind: Kind, txid: str) -> None:
    log.append(bytearray(marker(kind, txid, producer_id=1, producer_epoch=0, timestamp_ms=9)))
    state.catch_up(log.read, log.log_end)


def test_state_rebuilt_after_a_reopen_equals_the_masters(tmp_path: Path) -> None:
    log, state = PartitionLog(tmp_path, max_segment_size=300), PartitionTxnState()
    put(log, state, 1, 0, 3)
    put(log, state, 2, 0, 2, "TX:2:0")
    put(log, state, 1, 3, 1)
    mark(log, state, Kind.ABORT, "TX:2:0")
    write_snapshot(tmp_path, state)
    put(log, state, 2, 2, 2, "TX:2:1")
    mark(log, state, Kind.PREPARE, "TX:2:1")
    log.flush()
    log.close()
    assert len(list(tmp_path.glob("*.meta"))) > 2  # batches spread over several segments

    reopened = PartitionLog(tmp_path, max_segment_size=300)
    assert reopened.log_end == state.position  # recovery kept every control record
    assert load_state(tmp_path, reopened.read, 0, reopened.log_end) == state
    fresh = PartitionTxnState()
    fresh.catch_up(reopened.read, reopened.log_end)
    assert fresh == state and [t.txid for t in fresh.index.prepared()] == ["TX:2:1"]
    reopened.close()


def test_a_torn_batch_is_cut_back_to_its_header(tmp_path: Path) -> None:
    log, state = PartitionLog(tmp_path, max_segment_size=1 << 20), PartitionTxnState()
    put(log, state, 1, 0, 2)
    log.flush()
    log.close()
    header_at = state.position
    plan = plan_put(state.producers, encode_batch([(b"m" * 40, None)] * 3), 3, producer_id=1, producer_epoch=0,
                    first_seq=2, timestamp_ms=2)
    (segment,) = tmp_path.glob("*.meta")
    with open(segment, "ab") as handle:  # the crash tore the write of the batch's last record
        handle.write(plan.append[:-30])

    reopened = PartitionLog(tmp_path, max_segment_size=1 << 20)
    assert header_at < reopened.log_end < header_at + len(plan.append)  # the store kept the whole records
    recovered = load_state(tmp_path, reopened.read, 0, reopened.log_end)
    assert recovered.incomplete_tail(reopened.log_end) == header_at
    reopened.truncate_to(header_at)
    assert recovered == state and recovered.producers.check(1, 0, 2, 3).verdict.value == "new"
    reopened.close()
