"""Each partition's one owner (metaq/server/partitions.py) over real logs: appends, truncations,
the transaction state and the epoch history kept in step by it alone."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from metaq.config import TopicConfig
from metaq.ha.epochs import EpochCache
from metaq.record import encode_batch, iter_records, record_ends
from metaq.protocol import commands as c
from metaq.server.partitions import NotLeader, PartitionDropped, PartitionLoading, Partitions
from metaq.store.msgid import MsgIdGenerator
from metaq.store.manager import MessageStoreManager
from metaq.txn.put import plan_put
from metaq.txn import rebuild
from metaq.txn.rebuild import SNAPSHOT_FILE, PartitionTxnState, load_state
from metaq.txn.producer_state import Verdict

TOPIC = "t"


def store(tmp_path: Path) -> MessageStoreManager:
    config = TopicConfig(name=TOPIC, data_path=str(tmp_path), num_partitions=2, max_segment_size=400)
    return MessageStoreManager({TOPIC: config}, max_message_size=1024)


class Gate:
    """The HA side of a leader append: a master in epoch 0 that may write, no slave streaming."""

    epoch = 0
    streams = None
    refusal: tuple[int, str] | None = None

    def write_refusal(self) -> tuple[int, str] | None:
        return self.refusal


class Leader:
    """What the broker gives a master's appends (``LeaderHost``): msg ids, the gate, the appends seen."""

    def __init__(self) -> None:
        self.ids = MsgIdGenerator(1)
        self.ha = Gate()
        self.appends: list[tuple[str, int, int, int]] = []

    def appended(self, topic: str, partition: int, end: int, count: int) -> None:
        self.appends.append((topic, partition, end, count))

    def durability_wait(self, topic: str, partition: int, end: int, count: int) -> None:
        return None


def owners_of(manager: MessageStoreManager, **kwargs: Any) -> Partitions:
    return Partitions(manager, leader=Leader(), **kwargs)


def idempotent_put(manager: MessageStoreManager, states: Partitions, pid: int, seq: int, count: int) -> int:
    """What the put handler does for a batch with a producer id: returns the first record's offset."""
    owner = states.get(TOPIC, 0)
    plan = plan_put(owner.state.producers, encode_batch([(b"m" * 30, None)] * count), count, producer_id=pid,
                    producer_epoch=0, first_seq=seq, timestamp_ms=1000 + seq)
    assert plan.append is not None
    appended = owner.append_as_leader(plan.append, count + 1, plan.header)
    return appended.offset + plan.data_start


def plain_put(manager: MessageStoreManager, states: Partitions, count: int) -> None:
    body = encode_batch([(b"p" * 30, None)] * count)
    states.get(TOPIC, 0).append_as_leader(bytearray(body), count)


def fresh(manager: MessageStoreManager) -> PartitionTxnState:
    log = manager.get_log(TOPIC, 0)
    state = PartitionTxnState(position=log.min_offset)
    state.catch_up(log.read, log.log_end)
    return state


def test_the_state_follows_plain_and_idempotent_puts_and_equals_a_walk_of_the_log(tmp_path: Path) -> None:
    manager = store(tmp_path)
    states = owners_of(manager)
    plain_put(manager, states, 2)
    first = idempotent_put(manager, states, 7, 0, 3)
    plain_put(manager, states, 1)
    idempotent_put(manager, states, 7, 3, 2)
    state = states.state(TOPIC, 0)
    assert state.position == manager.get_log(TOPIC, 0).log_end
    assert state == fresh(manager)
    decision = state.producers.check(7, 0, 0, 3)
    assert (decision.verdict, decision.first_offset) == (Verdict.DUPLICATE, first)
    assert set(states.all()) == {(TOPIC, 0)}
    manager.close()


class Streams:
    """The broker's stream hub (metaq/ha/stream.py): what it was asked to push."""

    def __init__(self) -> None:
        self.pushed: list[tuple[list[Any], int, int, bytes]] = []

    def push(self, subs: list[Any], offset: int, epoch: int, data: bytearray) -> None:
        self.pushed.append((subs, offset, epoch, bytes(data)))


def test_the_leader_append_entry_stamps_appends_pushes_and_records_in_one_step(tmp_path: Path) -> None:
    manager = store(tmp_path)
    owners = owners_of(manager)
    leader = owners.leader
    leader.ha.streams, leader.ha.epoch = Streams(), 6
    owner = owners.get(TOPIC, 0)
    owner.replication.streams = subscribers = ["a slave's stream"]  # metaq/ha/stream.py subscribes there
    owners.get(TOPIC, 1).append_as_leader(bytearray(encode_batch([(b"p" * 30, None)])), 1)  # nobody streams it
    body = bytearray(encode_batch([(b"p" * 30, None)] * 3))
    appended = owner.append_as_leader(body, 3)
    assert (appended.offset, appended.end) == (0, len(body)) == (0, owner.log.log_end)
    ids = [record.msg_id for record in iter_records(owner.log.read(0, appended.end), 0)]
    assert ids == [appended.first_id, appended.first_id + 1, appended.first_id + 2]
    assert leader.ha.streams.pushed == [(subscribers, 0, 6, bytes(owner.log.read(0, appended.end)))]
    assert leader.appends[1:] == [(TOPIC, 0, appended.end, 3)]
    assert owner.state.position == appended.end
    manager.close()


def test_the_leader_append_entry_refuses_a_broker_that_may_not_write_and_a_dropped_partition(tmp_path: Path) -> None:
    manager = store(tmp_path)
    owners = owners_of(manager)
    leader = owners.leader
    owner = owners.get(TOPIC, 0)
    owner.append_as_leader(bytearray(encode_batch([(b"p" * 30, None)])), 1)
    end, recorded = owner.log.log_end, list(leader.appends)

    leader.ha.refusal = (c.FORBIDDEN, "broker 0 follower is a slave")  # a slave, a fenced or lapsed master
    with pytest.raises(NotLeader) as refused:
        owner.append_as_leader(bytearray(encode_batch([(b"q" * 30, None)])), 1)
    assert refused.value.code == c.FORBIDDEN and "slave" in refused.value.message
    assert owner.log.log_end == end and leader.appends == recorded

    leader.ha.refusal = None
    owners.drop([(TOPIC, 0)])  # its topic deleted meanwhile
    with pytest.raises(PartitionDropped) as dropped:
        owner.append_as_leader(bytearray(encode_batch([(b"q" * 30, None)])), 1)
    assert dropped.value.code == c.NOT_FOUND
    with pytest.raises(PartitionDropped):
        owner.append_as_follower(encode_batch([(b"q" * 30, None)]))  # a replica task that outlived the drop
    assert owner.log.log_end == end and leader.appends == recorded
    with pytest.raises(RuntimeError, match="no leader side"):
        Partitions(manager).get(TOPIC, 1).append_as_leader(bytearray(encode_batch([(b"q" * 30, None)])), 1)
    manager.close()


def test_a_follower_append_derives_the_masters_state(tmp_path: Path) -> None:
    """A slave appending its master's bytes verbatim holds the master's state at once."""
    manager = store(tmp_path)
    states = owners_of(manager)
    other = store(tmp_path / "master")
    other_states = owners_of(other)
    idempotent_put(other, other_states, 3, 0, 4)
    master_log = other.get_log(TOPIC, 0)
    states.get(TOPIC, 0).append_as_follower(master_log.read(0, master_log.log_end))
    assert states.state(TOPIC, 0) == other_states.state(TOPIC, 0)
    manager.close()
    other.close()


def two_batches(tmp_path: Path) -> tuple[MessageStoreManager, Partitions, int]:
    """A partition holding two idempotent batches of producer 1, and the offset between them."""
    manager = store(tmp_path)
    states = owners_of(manager)
    idempotent_put(manager, states, 1, 0, 2)
    cut_at = manager.get_log(TOPIC, 0).log_end
    idempotent_put(manager, states, 1, 2, 2)
    return manager, states, cut_at


def test_a_truncation_rebuilds_the_state_and_discards_the_snapshot(tmp_path: Path) -> None:
    manager, states, cut_at = two_batches(tmp_path)
    states.snapshot_all()
    snapshot = tmp_path / f"{TOPIC}-0" / SNAPSHOT_FILE
    assert snapshot.exists()
    states.get(TOPIC, 0).truncate_to(cut_at)
    # The log grows again with other bytes: position alone could not tell the state is stale.
    idempotent_put_after_cut = plan_put(states.state(TOPIC, 0).producers, encode_batch([(b"x" * 30, None)] * 2), 2,
                                        producer_id=1, producer_epoch=0, first_seq=2, timestamp_ms=5)
    assert idempotent_put_after_cut.decision.verdict is Verdict.NEW  # seq 2..3 is gone with the cut
    assert not snapshot.exists()
    assert states.state(TOPIC, 0) == fresh(manager)
    manager.close()


def test_open_all_cuts_a_torn_batch_and_a_reopen_loads_the_snapshot(tmp_path: Path) -> None:
    manager = store(tmp_path)
    states = owners_of(manager)
    idempotent_put(manager, states, 1, 0, 2)
    before = states.state(TOPIC, 0).position
    state = states.state(TOPIC, 0)
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
    again = owners_of(reopened)
    again.open_all()
    log = reopened.get_log(TOPIC, 0)
    assert log.log_end == before and again.state(TOPIC, 0).position == before
    assert list((tmp_path / f"{TOPIC}-0").glob("truncated-*")), "the cut bytes are kept aside"
    assert again.state(TOPIC, 0).producers.check(1, 0, 0, 2).verdict is Verdict.DUPLICATE
    reopened.close()


def test_a_snapshot_ending_in_plain_puts_is_reused_and_one_from_before_a_cut_is_not(tmp_path: Path) -> None:
    manager = store(tmp_path)
    states = owners_of(manager)
    idempotent_put(manager, states, 1, 0, 2)
    plain_put(manager, states, 3)
    cut_at = manager.get_log(TOPIC, 0).log_end
    plain_put(manager, states, 2)
    states.snapshot_all()
    snapshot = tmp_path / f"{TOPIC}-0" / SNAPSHOT_FILE
    taken = snapshot.read_bytes()
    log = manager.get_log(TOPIC, 0)
    assert load_state(snapshot.parent, log.read, 0, log.log_end) == states.state(TOPIC, 0)
    assert rebuild._fits(json.loads(taken.partition(b"\n")[2]), log.read, 0, log.log_end)

    # Cut after the last plain put's first record and grow again with an idempotent batch:
    # the old snapshot's anchor (that first record) is still there, but the records from it
    # no longer end at the snapshot's position, so it is refused (had it survived the cut).
    states.get(TOPIC, 0).truncate_to(record_ends(log.read(cut_at, 1 << 16), cut_at)[0])
    idempotent_put(manager, states, 2, 0, 1)
    snapshot.write_bytes(taken)
    reloaded = load_state(snapshot.parent, log.read, 0, log.log_end)
    assert reloaded == fresh(manager) and 2 in reloaded.producers.producers
    manager.close()


def test_cutting_a_half_replicated_batch_keeps_the_state_without_a_rebuild(tmp_path: Path) -> None:
    """Promotion's cut: the state has seen nothing past the cut, so it stays (no walk of the log)."""
    manager = store(tmp_path)
    states = owners_of(manager)
    idempotent_put(manager, states, 1, 0, 2)
    state = states.state(TOPIC, 0)
    header_at = state.position
    plan = plan_put(state.producers, encode_batch([(b"m" * 30, None)] * 3), 3, producer_id=1, producer_epoch=0,
                    first_seq=2, timestamp_ms=2)
    assert plan.append is not None
    half = record_ends(plan.append)[1]  # the BATCH header and the first record: what a slave fetched so far
    log = manager.get_log(TOPIC, 0)
    states.get(TOPIC, 0).append_as_follower(plan.append[:half])
    assert states.state(TOPIC, 0).position == header_at  # stops before the incomplete batch
    assert states.get(TOPIC, 0).cut_incomplete_tail("at promotion") == header_at
    assert log.log_end == header_at and states.state(TOPIC, 0) is state
    assert states.get(TOPIC, 0).cut_incomplete_tail("at promotion") is None
    manager.close()


def test_a_snapshot_serialized_before_a_cut_is_not_written_after_it(tmp_path: Path) -> None:
    """The periodic snapshot is serialized on the loop and written in a thread; a cut in between wins."""
    manager, states, cut_at = two_batches(tmp_path)
    serialized = states._changed_snapshots()
    states.get(TOPIC, 0).truncate_to(cut_at)
    states._write_all(serialized)
    assert not (tmp_path / f"{TOPIC}-0" / SNAPSHOT_FILE).exists()
    manager.close()


def test_idle_producers_are_forgotten_by_the_log_clock_and_the_snapshot_loop_survives_errors(tmp_path: Path) -> None:
    manager = store(tmp_path)
    states = owners_of(manager, expiry_ms=50)
    idempotent_put(manager, states, pid=1, seq=0, count=1)  # timestamp 1000
    idempotent_put(manager, states, pid=2, seq=40, count=1)  # timestamp 1040: 1 is idle 40 ms by the log
    assert states.expire_producers() == 0
    idempotent_put(manager, states, pid=3, seq=51, count=1)  # timestamp 1051
    state = states.state(TOPIC, 0)
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


def test_truncate_to_cuts_the_epoch_history_with_the_log(tmp_path: Path) -> None:
    """The one truncation path fixes the epoch history itself: no epoch starts past the log end,
    saved durably (a reload sees it), and the state follows the cut."""
    manager, states, cut_at = two_batches(tmp_path)
    owner = states.get(TOPIC, 0)
    owner.epochs.assign(1, 0)
    owner.epochs.assign(2, cut_at)
    owner.epochs.save()
    owner.truncate_to(cut_at)
    assert owner.epochs.entries == [(1, 0)]
    assert EpochCache.load(owner.log.directory).entries == [(1, 0)]
    assert owner.state == fresh(manager) and owner.state.position == owner.log.log_end == cut_at
    assert owner.truncate_to(cut_at) is None  # nothing to cut
    manager.close()


def test_a_marker_a_bit_flip_broke_in_a_sealed_segment_is_marked_corrupt_not_fatal(tmp_path: Path) -> None:
    """The walk at start does not check CRCs: a flip in a marker's body used to raise
    ControlError and stop the broker at every start (chaos campaign seed 2028, corrupt-master:
    `record at 1730: control record body is truncated`). It is corruption like any other: the
    record and the rest of its sealed segment are unserved until a replica puts them back."""
    from metaq.record import HEADER_SIZE
    from metaq.txn.control import _ATTR_BLOCK, ControlError, Kind, decode_body, marker

    manager = store(tmp_path)
    states = owners_of(manager)
    plain_put(manager, states, 3)
    log = manager.get_log(TOPIC, 0)
    at = log.append(marker(Kind.ABORT, "tx-1", producer_id=7, producer_epoch=0, timestamp_ms=5))
    for _ in range(6):  # seal the marker's segment (400 bytes each)
        plain_put(manager, states, 3)
    log.flush()
    sealed_end = next(s.end for s in log._segments if s.start <= at < s.end)
    assert sealed_end < log.log_end
    states.close()
    manager.close()

    (tmp_path / f"{TOPIC}-0" / SNAPSHOT_FILE).unlink(missing_ok=True)  # the walk reads the marker again
    segment = max((p for p in (tmp_path / f"{TOPIC}-0").glob("*.meta") if int(p.stem) <= at), key=lambda p: int(p.stem))
    version_byte = at - int(segment.stem) + HEADER_SIZE + len(_ATTR_BLOCK)
    data = bytearray(segment.read_bytes())
    data[version_byte] ^= 0x40
    segment.write_bytes(bytes(data))
    try:
        decode_body(bytes(data[version_byte:version_byte + 40]))
        raise AssertionError("the flip should break the marker's body")
    except ControlError:
        pass

    reopened = store(tmp_path)
    reopened.open_existing()
    again = owners_of(reopened)
    again.open_all()  # raised ControlError before
    log = reopened.get_log(TOPIC, 0)
    assert log.corrupt_ranges == [(at, sealed_end)]
    assert again.state(TOPIC, 0).position == log.log_end  # the walk went on past the range
    again.close()
    reopened.close()


class HeldLoads:
    """``rebuild.load_state`` held until ``release`` is set; ``threads``: where each load ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.threads: list[int] = []
        self._real = rebuild.load_state
        monkeypatch.setattr(rebuild, "load_state", self._held)

    def _held(self, *args: Any, **kwargs: Any) -> PartitionTxnState:
        self.threads.append(threading.get_ident())
        assert self.release.wait(10), "never released"
        return self._real(*args, **kwargs)


def test_a_log_opened_at_run_time_loads_its_state_in_a_worker_thread_and_puts_get_a_retriable_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition with bytes opened after start (a topic re-added, partitions added): its snapshot
    and walk run in a worker thread; meanwhile the put and fetch paths get 503 (LOAD_IN_PROGRESS),
    never a wait; the owner's other readers (HA, the reconcile) wait for it; an empty new partition is ready at once."""
    manager = store(tmp_path)
    states = owners_of(manager)
    idempotent_put(manager, states, 7, 0, 3)
    states.close()
    manager.close()

    held = HeldLoads(monkeypatch)
    reopened = store(tmp_path)
    again = owners_of(reopened)  # started: open_all ran over no log; the topic's files come back now
    again.open_added()
    owner = again.get(TOPIC, 0)
    assert not owner.ready and (TOPIC, 1) not in reopened.logs()  # partition 1 has no files: not opened
    for ask in (lambda: again.serving(TOPIC, 0), lambda: again.state(TOPIC, 0)):
        with pytest.raises(PartitionLoading) as refused:
            ask()
        assert refused.value.code == c.SERVICE_UNAVAILABLE and "retry" in refused.value.message
    assert again.batch_boundary(TOPIC, 0, 10, 5) == 5  # unknown yet: the committed offset stays
    assert again.get(TOPIC, 1).ready  # no bytes, no snapshot: nothing to load
    assert held.threads and threading.get_ident() not in held.threads
    held.release.set()
    assert again.all()[(TOPIC, 0)] is owner.state  # the reconcile's read waits for the load
    assert again.serving(TOPIC, 0) is owner and owner.ready
    assert again.state(TOPIC, 0) == fresh(reopened)
    assert again.state(TOPIC, 0).producers.check(7, 0, 0, 3).verdict is Verdict.DUPLICATE
    again.close()
    reopened.close()


def test_assign_epoch_gives_every_served_partition_the_epoch_durably_in_one_batch(tmp_path: Path, monkeypatch: Any) -> None:
    from metaq.ha import epochs

    manager = store(tmp_path)
    owners = owners_of(manager)
    plain_put(manager, owners, 2)
    end = manager.get_log(TOPIC, 0).log_end
    batches: list[int] = []
    real = epochs.save_all
    monkeypatch.setattr("metaq.server.partitions.save_all", lambda caches: batches.append(len(caches)) or real(caches))
    monkeypatch.setattr(EpochCache, "save", lambda self: pytest.fail("one save per partition"))
    topics = manager.topics

    assert asyncio.run(owners.assign_epoch(topics, 4)) == 2
    assert batches == [2], "one batch for every partition, with bytes or not"
    assert EpochCache.load(manager.partition_dir(TOPIC, 0)).entries == [(4, end)]
    assert EpochCache.load(manager.partition_dir(TOPIC, 1)).entries == [(4, 0)]
    assert asyncio.run(owners.assign_epoch(topics, 4)) == 0, "the same epoch again changes nothing"
    with pytest.raises(ValueError, match="older than the latest"):
        asyncio.run(owners.assign_epoch(topics, 3))  # epochs only grow
    assert owners.get(TOPIC, 0).epochs.entries == [(4, end)]
    manager.close()


def test_adopt_epochs_copies_the_masters_history_and_saves_only_a_change(tmp_path: Path, monkeypatch: Any) -> None:
    manager = store(tmp_path)
    owners = owners_of(manager)
    saves: list[Path] = []
    real = EpochCache.save
    monkeypatch.setattr(EpochCache, "save", lambda self: saves.append(self.path) or real(self))

    master = [(2, 0), (5, 120)]
    assert asyncio.run(owners.adopt_epochs(TOPIC, 0, master)) is True
    assert EpochCache.load(manager.partition_dir(TOPIC, 0)).entries == master
    assert len(saves) == 1
    assert asyncio.run(owners.adopt_epochs(TOPIC, 0, master)) is False, "nothing new: no save"
    assert len(saves) == 1
    assert owners.get(TOPIC, 0).epochs.entries == master
    manager.close()
