"""Coordinator, partition logs and the read-committed filter together, through failovers.

Random local and XA transactions over two partitions, with timeouts and failovers
(a new coordinator that knows only what it rebuilds from the log bytes). At the end,
after every open branch is rolled back, a read-committed consumer of each partition
sees exactly the records of the transactions whose commit succeeded, and the LSO
has reached the log end.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.record import buffer_reader
from metaq.txn.config import TxnSettings
from metaq.txn.coordinator import Reply, TransactionCoordinator
from metaq.txn.reader import committed_records
from metaq.txn.rebuild import PartitionTxnState
from metaq.txn.xa import Code, State
from tests.unit.txn_log_model import ModelLog

PARTS = [("t", 0), ("t", 1)]
SETTINGS = TxnSettings(max_tx_timeout_s=5)
# Mostly "advance": the next plausible request of a slot's branch (so transactions do
# commit); then timeouts, failovers and any request at any time (protocol errors included).
OPS = st.lists(st.one_of(
    st.tuples(st.just("advance"), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("advance"), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("advance"), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.sampled_from(["wait", "failover"]), st.just(0), st.just(0)),
    st.tuples(st.sampled_from(["start", "send", "end", "prepare", "commit1", "commit2", "rollback"]),
              st.integers(0, 2), st.integers(0, 1)),
), max_size=60)
#: The request "advance" makes, by the branch's state and a choice 0..3.
NEXT = {
    State.ACTIVE: ["send", "send", "send", "end"],
    State.IDLE: ["prepare", "commit1", "prepare", "rollback"],
    State.PREPARED: ["commit2", "commit2", "commit2", "rollback"],
    State.ROLLBACK_ONLY: ["rollback"] * 4,
    State.HEURISTIC_ROLLED_BACK: ["forget"] * 4,
}


class World:
    def __init__(self) -> None:
        self.logs = {p: ModelLog() for p in PARTS}
        self.coordinator = TransactionCoordinator(SETTINGS)
        self.now = 0
        self.xids = {slot: f"X{slot}:0" for slot in range(3)}
        self.generation = {slot: 0 for slot in range(3)}
        self.committed: set[str] = set()

    def write(self, xid: str, reply: Reply) -> None:
        for m in reply.markers:
            self.logs[(m.topic, m.partition)].mark(m.kind, m.xid, m.reason)
            if m.kind.name == "COMMIT":
                self.committed.add(m.xid)

    def op(self, name: str, slot: int, part: int) -> None:
        c, xid = self.coordinator, self.xids[slot]
        if name == "advance":
            choice, part = part, part % 2
            name = NEXT.get(c.state_of(xid), ["start"] * 4)[choice]
        if name == "start":
            if c.state_of(xid) in (State.COMMITTED, State.ROLLED_BACK):
                self.generation[slot] += 1
                xid = self.xids[slot] = f"X{slot}:{self.generation[slot]}"
            reply = c.start(xid, self.now, 3)
        elif name == "send":
            reply = c.send(xid, *PARTS[part], self.now)
            if reply.code is Code.XA_OK:
                self.logs[PARTS[part]].put(slot, 1, xid)
        elif name == "end":
            reply = c.end(xid, self.now)
        elif name == "prepare":
            reply = c.prepare(xid, self.now)
        elif name in ("commit1", "commit2"):
            reply = c.commit(xid, self.now, one_phase=name == "commit1")
        elif name == "rollback":
            reply = c.rollback(xid, self.now)
        elif name == "forget":
            reply = c.forget(xid, self.now)
        elif name == "wait":
            self.now += 2000
            for fired_xid, fired in c.expire(self.now):
                self.write(fired_xid, fired)
            return
        else:
            self.failover()
            return
        self.write(xid, reply)

    def failover(self) -> None:
        """A new master: the partition states rebuilt from the log bytes alone, an empty journal."""
        replicas = {}
        for part, log in self.logs.items():
            state = PartitionTxnState()
            state.catch_up(buffer_reader(bytes(log.log), 0), len(log.log))
            assert state == log.state
            replicas[part] = state.index
        self.coordinator = TransactionCoordinator(SETTINGS)
        for xid, reply in self.coordinator.reconcile(replicas, self.now):
            self.write(xid, reply)

    def finish(self) -> None:
        c = self.coordinator
        for xid in list(c.branches):
            if c.state_of(xid) is State.ACTIVE:
                c.end(xid, self.now)
            self.write(xid, c.rollback(xid, self.now))


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_consumers_see_exactly_the_committed_transactions(ops: list[tuple[str, int, int]]) -> None:
    world = World()
    for op in ops:
        world.op(*op)
        for log in world.logs.values():  # at every step: nothing uncommitted is readable
            end = len(log.log)
            lso = log.state.index.last_stable_offset(end, log.state.position)
            got = committed_records(log.log[:lso], 0, log.state.index.aborted_between(0, lso))
            assert all(log.owner[r.offset] in world.committed for r in got.records)
    world.finish()
    for log in world.logs.values():
        end = len(log.log)
        assert log.state.index.last_stable_offset(end, log.state.position) == end
        got = committed_records(log.log, 0, log.state.index.aborted)
        expected = [o for o, xid in sorted(log.owner.items()) if xid in world.committed]
        assert [r.offset for r in got.records] == expected
