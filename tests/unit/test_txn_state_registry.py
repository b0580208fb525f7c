"""The broker's per-partition transaction state registry (metaq/server/txn_state.py) over real logs."""

from __future__ import annotations

import json
from pathlib import Path

from metaq.config import TopicConfig
from metaq.record import encode_batch, record_ends, stamp_msg_ids
from metaq.server.txn_state import TxnStates
from metaq.store.manager import MessageStoreManager
from metaq.txn.put import plan_put
from metaq.txn import rebuild
from metaq.txn.rebuild import SNAPSHOT_FILE, PartitionTxnState, load_state
from metaq.txn.producer_state import Verdict

TOPIC = "t"


def store(tmp_path: Path) -> MessageStoreManager:
    config = TopicConfig(name=TOPIC, data_path=str(tmp_path), num_partitions=2, max_segment_size=400)
    return MessageStoreManager({TOPIC: config}, max_message_size=1024)


def idempotent_put(manager: MessageStoreManager, states: TxnStates, pid: int, seq: int, count: int) -> int:
    """What the put handler does for a batch with a producer id: returns the first record's offset."""
    state = states.partition(TOPIC, 0)
    plan = plan_put(state.producers, encode_batch([(b"m" * 30, None)] * count), count, producer_id=pid,
                    producer_epoch=0, first_seq=seq, timestamp_ms=1000 + seq)
    assert plan.append is not None
    log = manager.get_log(TOPIC, 0)
    stamp_msg_ids(plan.append, 1 + log.log_end)
    offset = log.append(plan.append)
    state.appended(offset, plan.append, plan.header)
    return offset + plan.data_start


def plain_put(manager: MessageStoreManager, states: TxnStates, count: int) -> None:
    body = encode_batch([(b"p" * 30, None)] * count)
    offset = manager.get_log(TOPIC, 0).append(body)
    states.note_append(TOPIC, 0, offset, body)


def fresh(manager: MessageStoreManager) -> PartitionTxnState:
    log = manager.get_log(TOPIC, 0)
    state = PartitionTxnState(position=log.min_offset)
    state.catch_up(log.read, log.log_end)
    return state


def test_the_state_follows_plain_and_idempotent_puts_and_equals_a_walk_of_the_log(tmp_path: Path) -> None:
    manager = store(tmp_path)
    states = TxnStates(manager)
    plain_put(manager, states, 2)
    first = idempotent_put(manager, states, 7, 0, 3)
    plain_put(manager, states, 1)
    idempotent_put(manager, states, 7, 3, 2)
    state = states.partition(TOPIC, 0)
    assert state.position == manager.get_log(TOPIC, 0).log_end
    assert state == fresh(manager)
    decision = state.producers.check(7, 0, 0, 3)
    assert (decision.verdict, decision.first_offset) == (Verdict.DUPLICATE, first)
    assert set(states.all()) == {(TOPIC, 0)}
    manager.close()


def test_a_slave_style_append_is_seen_on_the_next_lookup(tmp_path: Path) -> None:
    """Bytes appended without telling the registry (a replica append) are walked lazily."""
    manager = store(tmp_path)
    states = TxnStates(manager)
    other = store(tmp_path / "master")
    other_states = TxnStates(other)
    idempotent_put(other, other_states, 3, 0, 4)
    master_log = other.get_log(TOPIC, 0)
    manager.get_log(TOPIC, 0).append(master_log.read(0, master_log.log_end))
    assert states.partition(TOPIC, 0) == other_states.partition(TOPIC, 0)
    manager.close()
    other.close()


def two_batches(tmp_path: Path) -> tuple[MessageStoreManager, TxnStates, int]:
    """A partition holding two idempotent batches of producer 1, and the offset between them."""
    manager = store(tmp_path)
    states = TxnStates(manager)
    idempotent_put(manager, states, 1, 0, 2)
    cut_at = manager.get_log(TOPIC, 0).log_end
    idempotent_put(manager, states, 1, 2, 2)
    return manager, states, cut_at


def test_a_truncation_rebuilds_the_state_and_discards_the_snapshot(tmp_path: Path) -> None:
    manager, states, cut_at = two_batches(tmp_path)
    states.snapshot_all()
    snapshot = tmp_path / f"{TOPIC}-0" / SNAPSHOT_FILE
    assert snapshot.exists()
    manager.get_log(TOPIC, 0).truncate_to(cut_at)
    # The log grows again with other bytes: position alone could not tell the state is stale.
    idempotent_put_after_cut = plan_put(states.partition(TOPIC, 0).producers, encode_batch([(b"x" * 30, None)] * 2), 2,
                                        producer_id=1, producer_epoch=0, first_seq=2, timestamp_ms=5)
    assert idempotent_put_after_cut.decision.verdict is Verdict.NEW  # seq 2..3 is gone with the cut
    assert not snapshot.exists()
    assert states.partition(TOPIC, 0) == fresh(manager)
    manager.close()


def test_open_all_cuts_a_torn_batch_and_a_reopen_loads_the_snapshot(tmp_path: Path) -> None:
    manager = store(tmp_path)
    states = TxnStates(manager)
    idempotent_put(manager, states, 1, 0, 2)
    before = states.partition(TOPIC, 0).position
    state = states.partition(TOPIC, 0)
    plan = plan_put(state.producers, encode_batch([(b"m" * 30, None)] * 3), 3, producer_id=1, producer_epoch=0,
                    first_seq=2, timestamp_ms=2)
    assert plan.append is not None
    torn = plan.data_start + (len(plan.append) - plan.data_start) // 2  # the header and part of the records
    manager.get_log(TOPIC, 0).append(plan.append[:torn])
    states.close()
    manager.close()

    reopened = store(tmp_path)
    reopened.open_existing()
    assert reopened.get_log(TOPIC, 0).log_end > before  # the header and part of the records survived
    again = TxnStates(reopened)
    again.open_all()
    log = reopened.get_log(TOPIC, 0)
    assert log.log_end == before and again.partition(TOPIC, 0).position == before
    assert list((tmp_path / f"{TOPIC}-0").glob("truncated-*")), "the cut bytes are kept aside"
    assert again.partition(TOPIC, 0).producers.check(1, 0, 0, 2).verdict is Verdict.DUPLICATE
    reopened.close()


def test_a_snapshot_ending_in_plain_puts_is_reused_and_one_from_before_a_cut_is_not(tmp_path: Path) -> None:
    manager = store(tmp_path)
    states = TxnStates(manager)
    idempotent_put(manager, states, 1, 0, 2)
    plain_put(manager, states, 3)
    cut_at = manager.get_log(TOPIC, 0).log_end
    plain_put(manager, states, 2)
    states.snapshot_all()
    snapshot = tmp_path / f"{TOPIC}-0" / SNAPSHOT_FILE
    taken = snapshot.read_bytes()
    log = manager.get_log(TOPIC, 0)
    assert load_state(snapshot.parent, log.read, 0, log.log_end) == states.partition(TOPIC, 0)
    assert rebuild._fits(json.loads(taken.partition(b"\n")[2]), log.read, 0, log.log_end)

    # Cut after the last plain put's first record and grow again with an idempotent batch:
    # the old snapshot's anchor (that first record) is still there, but the records from it
    # no longer end at the snapshot's position, so it is refused (had it survived the cut).
    log.before_truncate = None
    log.truncate_to(record_ends(log.read(cut_at, 1 << 16), cut_at)[0])
    idempotent_put(manager, states, 2, 0, 1)
    snapshot.write_bytes(taken)
    reloaded = load_state(snapshot.parent, log.read, 0, log.log_end)
    assert reloaded == fresh(manager) and 2 in reloaded.producers.producers
    manager.close()


def test_cutting_a_half_replicated_batch_keeps_the_state_without_a_rebuild(tmp_path: Path) -> None:
    """Promotion's cut: the state has seen nothing past the cut, so it stays (no walk of the log)."""
    manager = store(tmp_path)
    states = TxnStates(manager)
    idempotent_put(manager, states, 1, 0, 2)
    state = states.partition(TOPIC, 0)
    header_at = state.position
    plan = plan_put(state.producers, encode_batch([(b"m" * 30, None)] * 3), 3, producer_id=1, producer_epoch=0,
                    first_seq=2, timestamp_ms=2)
    assert plan.append is not None
    half = record_ends(plan.append)[1]  # the BATCH header and the first record: what a slave fetched so far
    log = manager.get_log(TOPIC, 0)
    log.append(plan.append[:half])  # a replica append
    assert states.partition(TOPIC, 0).position == header_at  # stops before the incomplete batch
    assert states.cut_incomplete_tail(TOPIC, 0, "at promotion") == header_at
    assert log.log_end == header_at and states.partition(TOPIC, 0) is state
    assert states.cut_incomplete_tail(TOPIC, 0, "at promotion") is None
    manager.close()


def test_a_snapshot_serialized_before_a_cut_is_not_written_after_it(tmp_path: Path) -> None:
    """The periodic snapshot is serialized on the loop and written in a thread; a cut in between wins."""
    manager, states, cut_at = two_batches(tmp_path)
    serialized = states._changed_snapshots()
    manager.get_log(TOPIC, 0).truncate_to(cut_at)
    states._write_all(serialized)
    assert not (tmp_path / f"{TOPIC}-0" / SNAPSHOT_FILE).exists()
    manager.close()


def test_idle_producers_are_forgotten_by_the_log_clock_and_the_snapshot_loop_survives_errors(tmp_path: Path) -> None:
    import asyncio

    manager = store(tmp_path)
    states = TxnStates(manager, expiry_ms=50)
    idempotent_put(manager, states, pid=1, seq=0, count=1)  # timestamp 1000
    idempotent_put(manager, states, pid=2, seq=40, count=1)  # timestamp 1040: 1 is idle 40 ms by the log
    assert states.expire_producers() == 0
    idempotent_put(manager, states, pid=3, seq=51, count=1)  # timestamp 1051
    state = states.partition(TOPIC, 0)
    assert states.expire_producers() == 1  # 1000 + 50 < 1051, whatever this machine's clock says
    assert sorted(state.producers.producers) == [2, 3]

    rounds = []

    async def failing_round() -> None:
        rounds.append(1)
        raise ValueError("a bug in one round")

    async def run() -> None:
        states._snapshot_round = failing_round  # type: ignore[method-assign]
        states.start(interval_s=0.001)
        await asyncio.sleep(0.05)
        assert states._snapshots is not None and not states._snapshots.done()
        await states.stop()

    asyncio.run(run())
    assert len(rounds) >= 2
