"""The transaction coordinator (metaq/txn/coordinator.py): requests, timeouts, journal, failover."""

from __future__ import annotations

from pathlib import Path

from metaq.record import buffer_reader
from metaq.txn.config import TxnSettings
from metaq.txn.control import AbortReason, Kind, marker
from metaq.txn.coordinator import STALE_DEADLINES_SLACK, MarkerWrite, TransactionCoordinator, partitions_of
from metaq.txn.reader import committed_records
from metaq.txn.rebuild import PartitionTxnState
from metaq.txn.txlog import TxLog
from metaq.txn.xa import Code, State
from tests.unit.txn_log_model import ModelLog

XID = "XID:1:6774726964:6271"


def started(coordinator: TransactionCoordinator, xid: str = XID, *parts: tuple[str, int], timeout_s: int = 30,
            now: int = 0) -> None:
    assert coordinator.start(xid, now, timeout_s, producer_id=7).code is Code.XA_OK
    for topic, n in parts:
        assert coordinator.send(xid, topic, n, now).code is Code.XA_OK
    assert coordinator.end(xid, now).code is Code.XA_OK


def test_a_local_commit_marks_every_partition_written_once() -> None:
    coordinator = TransactionCoordinator(TxnSettings())
    started(coordinator, "TX:7:0", ("t", 0), ("t", 1), ("t", 0))
    reply = coordinator.commit("TX:7:0", 5, one_phase=True)
    assert reply.code is Code.XA_OK
    assert [(m.topic, m.partition, m.kind) for m in reply.markers] == [("t", 0, Kind.COMMIT), ("t", 1, Kind.COMMIT)]
    assert coordinator.state_of("TX:7:0") is State.COMMITTED
    again = coordinator.commit("TX:7:0", 6, one_phase=True)  # a retry after an unknown outcome
    assert again.code is Code.XA_OK and again.markers == []


def test_two_phase_commit_prepares_then_commits_and_recover_lists_the_prepared() -> None:
    coordinator = TransactionCoordinator(TxnSettings())
    started(coordinator, XID, ("t", 2))
    assert coordinator.commit(XID, 1, one_phase=False).code is Code.XAER_PROTO  # not prepared yet
    prepare = coordinator.prepare(XID, 1)
    assert prepare.markers == [MarkerWrite("t", 2, Kind.PREPARE, XID, 7, 0, 30, AbortReason.ROLLBACK)]
    assert coordinator.recover() == [XID]
    assert coordinator.commit(XID, 2, one_phase=False).markers[0].kind is Kind.COMMIT
    assert coordinator.recover() == []


def test_a_branch_without_messages_votes_read_only() -> None:
    coordinator = TransactionCoordinator(TxnSettings())
    started(coordinator, XID)
    assert coordinator.prepare(XID, 1) == (Code.XA_RDONLY, [])
    assert coordinator.state_of(XID) is State.NONEXISTENT


def test_unknown_branches_and_sends_after_a_rollback() -> None:
    coordinator = TransactionCoordinator(TxnSettings())
    assert coordinator.commit("nope", 0, one_phase=True).code is Code.XAER_NOTA
    started(coordinator, XID, ("t", 0))
    assert coordinator.rollback(XID, 1).markers[0].kind is Kind.ABORT
    assert coordinator.send(XID, "t", 0, 2).code is Code.XA_RBROLLBACK
    assert coordinator.start(XID, 3).code is Code.XA_OK  # a finished id may be reused


def test_timeouts_roll_back_and_a_prepared_timeout_is_heuristic_until_forgotten() -> None:
    coordinator = TransactionCoordinator(TxnSettings(max_tx_timeout_s=10))
    started(coordinator, "TX:7:1", ("t", 0), timeout_s=5)
    started(coordinator, XID, ("t", 1), timeout_s=600)  # capped at 10 s
    coordinator.prepare(XID, 2000)  # its timeout runs again from the prepare: 12 s
    assert coordinator.expire(4999) == []
    (fired,) = coordinator.expire(5000)
    assert fired[0] == "TX:7:1" and fired[1].code is Code.XA_RBTIMEOUT
    assert fired[1].markers[0].reason is AbortReason.TIMEOUT
    assert coordinator.expire(11999) == []
    (fired,) = coordinator.expire(12000)
    assert fired[1].code is Code.XA_HEURRB and fired[1].markers[0].reason is AbortReason.HEURISTIC
    assert coordinator.recover() == [XID]
    assert coordinator.commit(XID, 13000, one_phase=False).code is Code.XA_HEURRB
    assert coordinator.forget(XID, 13000).code is Code.XA_OK and coordinator.recover() == []


def test_a_deadline_binds_a_request_that_arrives_before_the_timer_fires() -> None:
    """Chaos seed 1005: a commit retried as ZooKeeper's quorum returned beat the timer (which
    does not run while the master refuses requests) and committed a timed-out transaction."""
    coordinator = TransactionCoordinator(TxnSettings())
    started(coordinator, "TX:7:1", ("t", 0), timeout_s=1)
    started(coordinator, XID, ("t", 1), timeout_s=1)
    assert coordinator.prepare(XID, 500).code is Code.XA_OK  # its deadline is now 1500
    late_commit = coordinator.commit("TX:7:1", 1000, one_phase=True)  # no expire() ran
    assert late_commit.code is Code.XA_RBROLLBACK
    assert [(m.kind, m.reason) for m in late_commit.markers] == [(Kind.ABORT, AbortReason.TIMEOUT)]
    assert coordinator.state_of("TX:7:1") is State.ROLLED_BACK
    late_phase_two = coordinator.commit(XID, 1500, one_phase=False)
    assert late_phase_two.code is Code.XA_HEURRB  # what the timer's heuristic rollback would answer
    assert [(m.kind, m.reason) for m in late_phase_two.markers] == [(Kind.ABORT, AbortReason.HEURISTIC)]
    assert coordinator.expire(10_000) == []  # nothing is rolled back twice


def test_a_reconcile_rolls_a_commit_forward_however_late() -> None:
    a, b = ModelLog(), ModelLog()
    for log in (a, b):
        log.put(7, 1, XID)
        log.mark(Kind.PREPARE, XID)
    a.mark(Kind.COMMIT, XID)  # the decision is in a log: no deadline may undo it
    promoted = TransactionCoordinator(TxnSettings())
    replies = dict(promoted.reconcile({("t", 0): a.state.index, ("t", 1): b.state.index}, 10**12))
    assert [(m.partition, m.kind) for m in replies[XID].markers] == [(1, Kind.COMMIT)]


def test_the_timeout_capacity_refuses_new_branches() -> None:
    coordinator = TransactionCoordinator(TxnSettings(max_tx_timeout_timer_capacity=2))
    started(coordinator, "a")
    started(coordinator, "b")
    assert coordinator.start("c", 0).code is Code.XAER_RMERR
    coordinator.rollback("a", 1)
    assert coordinator.start("c", 1).code is Code.XA_OK


class NoScan(dict):  # type: ignore[type-arg]
    """A branch table that fails any walk over it: what a request must not do."""

    def _scan(self, *args: object) -> None:
        raise AssertionError("a request walked every branch")

    __iter__ = keys = values = items = _scan  # type: ignore[assignment]


def test_a_start_or_recover_costs_the_same_however_many_branches_are_open_and_the_counts_stay_exact() -> None:
    coordinator = TransactionCoordinator(TxnSettings(max_tx_timeout_timer_capacity=10**6))
    for n in range(2000):
        assert coordinator.start(f"TX:1:{n}", 0, 30, starter=f"user{n % 3}").code is Code.XA_OK
    coordinator.branches = NoScan(coordinator.branches)
    # Starts, sends, decisions and timeouts, none of which may walk the table.
    for n in range(2000, 2300):
        assert coordinator.start(f"TX:1:{n}", 1, 30, starter="user0").code is Code.XA_OK
        coordinator.send(f"TX:1:{n}", "t", 0, 1)
        coordinator.end(f"TX:1:{n}", 1)
        decide = n % 4
        if decide == 0:
            coordinator.commit(f"TX:1:{n}", 2, one_phase=True)
        elif decide == 1:
            coordinator.prepare(f"TX:1:{n}", 2)
        elif decide == 2:
            coordinator.rollback(f"TX:1:{n}", 2)
    coordinator.expire(31_000)  # the first 2000 and the unprepared rest time out; the prepared ones too (heuristic)
    assert coordinator.pending_timeouts() == 0
    table = dict(dict.items(coordinator.branches))  # the test's own recount
    assert coordinator.live_branches_of("user0") == sum(1 for b in table.values() if b.starter == "user0")
    assert coordinator.live_branches_of("user1") == sum(1 for b in table.values() if b.starter == "user1") == 0
    heuristic = [xid for xid, b in table.items() if b.state is State.HEURISTIC_ROLLED_BACK]
    assert len(heuristic) == 75 and len(table) == 75  # the prepared ones, until forgotten
    # recover lists them from its index, per starter too, without walking the table either.
    assert coordinator.recover() == coordinator.recover("user0") == sorted(heuristic)
    assert coordinator.recover("user1") == []
    for xid in heuristic:
        coordinator.forget(xid, 32_000)
    assert coordinator.live_branches_of("user0") == 0 and len(coordinator.branches) == 0
    assert coordinator.recover() == []


def test_a_churn_of_short_branches_leaves_no_unbounded_timeout_entries() -> None:
    coordinator = TransactionCoordinator(TxnSettings())
    started(coordinator, "kept", ("t", 0), timeout_s=60)
    for n in range(5000):  # start, end, roll back at once: each leaves a timeout entry due in 60 s
        started(coordinator, f"TX:1:{n}", timeout_s=60)
        coordinator.rollback(f"TX:1:{n}", 0)
    assert len(coordinator._deadlines) <= 2 * coordinator.pending_timeouts() + STALE_DEADLINES_SLACK + 1
    fired = coordinator.expire(60_000)  # the live branch still times out, once
    assert [xid for xid, _reply in fired] == ["kept"]


def test_prepared_branches_survive_a_restart_through_the_journal(tmp_path: Path) -> None:
    journal = TxLog.open(tmp_path, TxnSettings(), 0)
    coordinator = TransactionCoordinator(TxnSettings(), journal)
    started(coordinator, XID, ("t", 0), timeout_s=20)
    coordinator.prepare(XID, 1000)
    started(coordinator, "TX:7:9", ("t", 1))  # active: its session dies with the broker
    journal.close()

    restarted = TransactionCoordinator(TxnSettings(), TxLog.open(tmp_path, TxnSettings(), 2000))
    replies = dict(restarted.reconcile({}, 2000))
    assert restarted.recover() == [XID] and replies["TX:7:9"].code is Code.XA_RBROLLBACK
    assert restarted.expire(20999) == [] and restarted.expire(21000)[0][0] == XID


def test_the_starter_is_journaled_and_an_older_journal_entry_has_none(tmp_path: Path) -> None:
    journal = TxLog.open(tmp_path, TxnSettings(), 0)
    coordinator = TransactionCoordinator(TxnSettings(), journal)
    assert coordinator.start(XID, 0, 20, producer_id=7, starter="tag-of-app").code is Code.XA_OK
    coordinator.send(XID, "t", 0, 0)
    coordinator.end(XID, 0)
    prepare = coordinator.prepare(XID, 1000)
    assert [m.starter for m in prepare.markers] == ["tag-of-app"]  # the PREPARE marker carries it
    journal.record("XID:1:6f6c64:", {"state": "prepared", "timeout_s": 20, "deadline_ms": 21000,  # as before starters
                                     "producer": [7, 0], "partitions": [["t", 1]]}, decision=True, now_ms=1000)
    journal.close()

    restarted = TransactionCoordinator(TxnSettings(), TxLog.open(tmp_path, TxnSettings(), 2000))
    assert restarted.branches[XID].starter == "tag-of-app"
    assert restarted.branches["XID:1:6f6c64:"].starter == ""
    assert (restarted.live_branches_of("tag-of-app"), restarted.live_branches_of("")) == (1, 1)


def write(log: ModelLog, markers: list[MarkerWrite]) -> None:
    for m in markers:
        log.mark(m.kind, m.xid, m.reason)


def test_a_new_master_learns_prepared_branches_from_the_replicated_logs_and_commits_them() -> None:
    master = TransactionCoordinator(TxnSettings())
    logs = {("t", 0): ModelLog(), ("t", 1): ModelLog()}
    started(master, XID)
    master.start(XID, 0, join=True)
    for part, log in logs.items():
        master.send(XID, *part, 0)
        log.put(7, 2, XID)
    master.end(XID, 0)
    write_all = master.prepare(XID, 100).markers
    for m in write_all:
        logs[(m.topic, m.partition)].mark(m.kind, m.xid)
    # kill -9: a slave holds byte-identical copies and rebuilds its state from them
    replicas = {}
    for part, log in logs.items():
        state = PartitionTxnState()
        state.catch_up(buffer_reader(bytes(log.log), 0), len(log.log))
        replicas[part] = state
    promoted = TransactionCoordinator(TxnSettings())
    assert promoted.reconcile({p: s.index for p, s in replicas.items()}, 5000) == []
    assert promoted.recover() == [XID]
    commit = promoted.commit(XID, 6000, one_phase=False)
    assert commit.code is Code.XA_OK and partitions_of([(XID, commit)]) == set(logs)
    for m in commit.markers:
        logs[(m.topic, m.partition)].mark(m.kind, m.xid)
    for log in logs.values():
        end = len(log.log)
        assert log.state.index.last_stable_offset(end, end) == end
        got = committed_records(log.log, 0, log.state.index.aborted)
        assert len(got.records) == 2


def test_reconcile_rolls_forward_a_half_written_commit_and_aborts_unprepared_work() -> None:
    a, b = ModelLog(), ModelLog()
    a.put(7, 1, XID)
    b.put(7, 1, XID)
    a.mark(Kind.PREPARE, XID)
    b.mark(Kind.PREPARE, XID)
    a.mark(Kind.COMMIT, XID)  # the old master died before writing b's COMMIT
    a.put(8, 1, "TX:8:0")  # an unprepared local transaction
    promoted = TransactionCoordinator(TxnSettings())
    replies = dict(promoted.reconcile({("t", 0): a.state.index, ("t", 1): b.state.index}, 10))
    assert [(m.partition, m.kind) for m in replies[XID].markers] == [(1, Kind.COMMIT)]
    assert [(m.partition, m.kind, m.reason) for m in replies["TX:8:0"].markers] == [
        (0, Kind.ABORT, AbortReason.FAILOVER)]
    assert promoted.state_of(XID) is State.COMMITTED and promoted.recover() == []


def test_a_branch_partly_prepared_at_the_crash_is_rolled_back() -> None:
    a, b = ModelLog(), ModelLog()
    a.put(7, 1, XID)
    b.put(7, 1, XID)
    a.mark(Kind.PREPARE, XID)  # the prepare was never acked: b has no PREPARE
    promoted = TransactionCoordinator(TxnSettings())
    replies = dict(promoted.reconcile({("t", 0): a.state.index, ("t", 1): b.state.index}, 10))
    assert {m.kind for m in replies[XID].markers} == {Kind.ABORT} and len(replies[XID].markers) == 2


def test_markers_written_from_replies_are_valid_control_records() -> None:
    m = MarkerWrite("t", 0, Kind.PREPARE, XID, 7, 0, 30)
    record = marker(m.kind, m.xid, producer_id=m.producer_id, producer_epoch=m.producer_epoch, timestamp_ms=1,
                    timeout_s=m.timeout_s, reason=m.reason)
    state = PartitionTxnState()
    state.catch_up(buffer_reader(record, 0), len(record))
    assert state.position == len(record)


def test_a_commit_retried_on_the_new_master_gets_the_outcome_from_the_logs() -> None:
    log = ModelLog()
    log.put(7, 1, XID)
    log.mark(Kind.PREPARE, XID)
    log.mark(Kind.COMMIT, XID)  # the old master wrote it, then died before replying
    log.put(7, 1, "TX:7:5")
    log.mark(Kind.ABORT, "TX:7:5")
    promoted = TransactionCoordinator(TxnSettings())
    assert promoted.reconcile({("t", 0): log.state.index}, 10) == []
    assert promoted.commit(XID, 11, one_phase=False) == (Code.XA_OK, [])
    assert promoted.rollback("TX:7:5", 11) == (Code.XA_OK, [])
    assert promoted.commit("TX:7:5", 11, one_phase=True).code is Code.XA_RBROLLBACK
