"""The broker's transaction coordinator: branches, timeouts, markers to write, recovery.

It applies the XA table (xa.py) to one branch per transaction id and tells its
caller what to do; it does no network or log I/O itself:

* every request returns a ``Reply``: the XA code, and the markers (PREPARE,
  COMMIT or ABORT) the caller must append to the listed partitions, durably and
  replicated, *before* it sends the code back;
* ``send`` enlists a partition (the put handler calls it before appending a
  transactional batch there, and appends only on XA_OK);
* ``expire(now)`` fires the timeouts that are due (a timer calls it);
* ``reconcile`` rebuilds the branches at start or on promotion from the
  transaction indexes of the partitions (the replicated truth) and the journal.

Every state change is journaled (txlog.py) when a journal is given; a decision
(prepare, commit, rollback, timeout) is flushed as ``flushTxLogAtCommit`` says.

Timeouts: a branch gets ``cap_timeout(requested)`` seconds from its start,
and again from its prepare. At most ``maxTxTimeoutTimerCapacity`` branches may
hold a pending timeout (ACTIVE, IDLE, ROLLBACK_ONLY, PREPARED); a start past it
is refused with XAER_RMERR.

Starters: a branch records the tag of the principal that started it (``starter``,
"" when unknown: security off, or a branch learnt from a PREPARE marker written
before starters were recorded). It is journaled with the branch and written into
the branch's PREPARE markers, so a restarted broker (its journal) and a promoted
slave (the replicated logs) both know whose branch it is.

Bookkeeping is O(1) per request: the branches holding a timeout and the live
branches of each starter are counted as branches come, change state and go
(``_insert``, ``_set_state``, ``_remove`` are the only places that do), never by a
scan, so a flood of starts costs the same however many branches are open.

Reconcile rules, per transaction id, from what the partition logs show:

1. a COMMIT marker in any partition: it was committed; append COMMIT wherever it
   is still open (a crash between two partitions' markers is rolled forward);
2. else an ABORT marker in any partition: ABORT wherever it is still open;
3. else open and prepared in every partition where it is open: PREPARED, in doubt
   (``recover`` lists it), its timeout counted from its PREPARE marker's time, its
   starter the one its PREPARE markers carry (else the journal's);
4. else (open, not prepared everywhere): the FAILOVER row: rolled back, ABORT
   markers with reason FAILOVER (the client's session is gone; XA lets a resource
   manager roll back an unprepared branch);
5. a transaction the logs show finished (and open nowhere) is remembered as
   committed or rolled back, so a retried commit or rollback gets its outcome;
6. a branch only the journal knows (no open record in any log) takes the
   outcome the logs show if there is one, else keeps its journaled state if it is
   PREPARED or HEURISTIC_ROLLED_BACK, else gets the FAILOVER row; no markers.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

from metaq.txn.config import TxnSettings
from metaq.txn.control import NO_PRODUCER, AbortReason, Kind
from metaq.txn.index import TransactionIndex
from metaq.txn.txlog import TxLog
from metaq.txn.xa import IN_DOUBT, IN_FLIGHT, Code, Event, Marker, State, step

Partition = tuple[str, int]
DEFAULT_MAX_TOMBSTONES = 10000
#: Stale timeout entries tolerated beyond the live ones before the heap is rebuilt (see _arm).
STALE_DEADLINES_SLACK = 1024
_MARKER_KIND = {Marker.PREPARE: Kind.PREPARE, Marker.COMMIT: Kind.COMMIT, Marker.ABORT: Kind.ABORT}
_ABORT_REASON = {Event.TIMEOUT: AbortReason.TIMEOUT, Event.FAILOVER: AbortReason.FAILOVER}


class MarkerWrite(NamedTuple):
    topic: str
    partition: int
    kind: Kind
    xid: str
    producer_id: int
    producer_epoch: int
    timeout_s: int = 0
    reason: AbortReason = AbortReason.ROLLBACK
    starter: str = ""  # PREPARE markers carry it


class Reply(NamedTuple):
    code: Code
    markers: list[MarkerWrite] = []


@dataclass
class Branch:
    xid: str
    state: State
    timeout_s: int
    deadline_ms: int
    producer_id: int = NO_PRODUCER
    producer_epoch: int = 0
    partitions: list[Partition] = field(default_factory=list)
    #: The tag of the principal that started it ("" unknown; see the module's docstring).
    starter: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "timeout_s": self.timeout_s, "deadline_ms": self.deadline_ms,
                "producer": [self.producer_id, self.producer_epoch], "partitions": [list(p) for p in self.partitions],
                "starter": self.starter}

    @classmethod
    def from_json(cls, xid: str, data: Mapping[str, Any]) -> Branch:
        # A journal written before starters were recorded has none: unknown.
        return cls(xid, State(data["state"]), data["timeout_s"], data["deadline_ms"], *data["producer"],
                   [(t, int(n)) for t, n in data["partitions"]], str(data.get("starter") or ""))


#: Requests a branch's deadline binds (see ``_request``). Not SEND: a put's enlistment writes no
#: markers, and the timer's ABORT marker, written after it, rolls its records back anyway. Not
#: ROLLBACK or FORGET: after the deadline they end the branch as the timeout would.
_BOUND_BY_DEADLINE = frozenset({Event.START_JOIN, Event.END, Event.END_FAIL, Event.PREPARE,
                                Event.PREPARE_READ_ONLY, Event.COMMIT_ONE_PHASE, Event.COMMIT})


class TransactionCoordinator:
    def __init__(self, settings: TxnSettings, journal: TxLog | None = None,
                 max_tombstones: int = DEFAULT_MAX_TOMBSTONES) -> None:
        self.settings = settings
        self.journal = journal
        self.branches: dict[str, Branch] = {}
        #: finished branches (COMMITTED / ROLLED_BACK), newest last, so retries get the outcome
        self.tombstones: OrderedDict[str, State] = OrderedDict()
        self.max_tombstones = max_tombstones
        self._deadlines: list[tuple[int, str]] = []
        #: Branches in IN_FLIGHT (holding a timeout), live branches per starter, and the in-doubt
        #: xids per starter (what ``recover`` lists, without a scan of every branch; see _count).
        self._in_flight = 0
        self._live_by_starter: dict[str, int] = {}
        self._in_doubt_by_starter: dict[str, set[str]] = {}
        if journal is not None:
            for xid, data in journal.branches.items():
                self._keep(Branch.from_json(xid, data))

    # --- requests ------------------------------------------------------------------

    def start(self, xid: str, now_ms: int, timeout_s: int = 0, *, join: bool = False,
              producer_id: int = NO_PRODUCER, producer_epoch: int = 0, starter: str = "") -> Reply:
        state = self.state_of(xid)
        if not join and state not in IN_FLIGHT and state is not State.HEURISTIC_ROLLED_BACK:
            if self.pending_timeouts() >= self.settings.max_tx_timeout_timer_capacity:
                return Reply(Code.XAER_RMERR)
            timeout = self.settings.cap_timeout(timeout_s)
            self._insert(Branch(xid, State.NONEXISTENT, timeout, now_ms + timeout * 1000,
                                producer_id, producer_epoch, starter=starter))
        return self._request(xid, Event.START_JOIN if join else Event.START, now_ms)

    def send(self, xid: str, topic: str, partition: int, now_ms: int) -> Reply:
        reply = self._apply(xid, Event.SEND, now_ms, journal=False)
        branch = self.branches.get(xid)
        if reply.code is Code.XA_OK and branch is not None and (topic, partition) not in branch.partitions:
            branch.partitions.append((topic, partition))
            self._journal(branch, decision=False, now_ms=now_ms)
        return reply

    def end(self, xid: str, now_ms: int, *, fail: bool = False) -> Reply:
        return self._request(xid, Event.END_FAIL if fail else Event.END, now_ms)

    def prepare(self, xid: str, now_ms: int) -> Reply:
        branch = self.branches.get(xid)
        read_only = branch is not None and not branch.partitions
        return self._request(xid, Event.PREPARE_READ_ONLY if read_only else Event.PREPARE, now_ms)

    def commit(self, xid: str, now_ms: int, *, one_phase: bool) -> Reply:
        return self._request(xid, Event.COMMIT_ONE_PHASE if one_phase else Event.COMMIT, now_ms)

    def rollback(self, xid: str, now_ms: int) -> Reply:
        return self._apply(xid, Event.ROLLBACK, now_ms)

    def forget(self, xid: str, now_ms: int) -> Reply:
        return self._apply(xid, Event.FORGET, now_ms)

    def fence(self, producer_id: int, epoch: int, now_ms: int) -> list[tuple[str, Reply]]:
        """A newer instance of the producer exists: roll back its branches under a lower epoch.

        Only unprepared ones (the FAILOVER row: ABORT markers): a prepared branch belongs to
        its transaction manager now, which commits or rolls it back through ``recover``.
        """
        zombies = [xid for xid, b in self.branches.items()
                   if b.producer_id == producer_id and b.producer_epoch < epoch and b.state in IN_FLIGHT
                   and b.state is not State.PREPARED]
        return [(xid, self._apply(xid, Event.FAILOVER, now_ms)) for xid in zombies]

    def recover(self, starter: str | None = None) -> list[str]:
        """In-doubt branches (prepared, or heuristically rolled back and not yet forgotten), sorted:
        every one, or (``starter`` given) those that starter started. Costs the in-doubt branches
        listed, never a pass over the open ones."""
        if starter is None:
            return sorted(xid for xids in self._in_doubt_by_starter.values() for xid in xids)
        return sorted(self._in_doubt_by_starter.get(starter, ()))

    def expire(self, now_ms: int) -> list[tuple[str, Reply]]:
        fired = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            deadline, xid = heapq.heappop(self._deadlines)
            branch = self.branches.get(xid)
            if branch is None or branch.deadline_ms != deadline or branch.state not in IN_FLIGHT:
                continue  # re-armed, finished or forgotten since
            fired.append((xid, self._apply(xid, Event.TIMEOUT, now_ms)))
        return fired

    def state_of(self, xid: str) -> State:
        branch = self.branches.get(xid)
        if branch is not None:
            return branch.state
        return self.tombstones.get(xid, State.NONEXISTENT)

    def pending_timeouts(self) -> int:
        return self._in_flight

    def live_branches_of(self, starter: str) -> int:
        """Branches of ``starter`` this coordinator holds (open, prepared or awaiting forget)."""
        return self._live_by_starter.get(starter, 0)

    # --- start and promotion ---------------------------------------------------------

    def reconcile(self, indexes: Mapping[Partition, TransactionIndex], now_ms: int) -> list[tuple[str, Reply]]:
        """Merge what the partition logs show into the branches; return the markers to write (rules 1-6)."""
        open_in: dict[str, dict[Partition, Any]] = {}
        decided: dict[str, tuple[Kind, AbortReason | None]] = {}
        for part, index in indexes.items():
            for txid, txn in index.open.items():
                open_in.setdefault(txid, {})[part] = txn
            for txid, outcome in index.outcomes.items():
                if outcome.kind is Kind.COMMIT or txid not in decided:
                    decided[txid] = (outcome.kind, outcome.reason)
        results = []
        for xid, parts in open_in.items():
            first = next(iter(parts.values()))
            journaled = self.branches.get(xid)
            timeout = journaled.timeout_s if journaled else self.settings.cap_timeout(first.timeout_s)
            # Whose branch: its PREPARE markers say (the replicated truth), else this broker's journal.
            starter = next((t.starter for t in parts.values() if t.starter), journaled.starter if journaled else "")
            all_prepared = all(t.prepared for t in parts.values())
            branch = Branch(xid, State.PREPARED if all_prepared else State.IDLE, timeout, now_ms + timeout * 1000,
                            first.producer_id, first.producer_epoch, sorted(parts), starter)
            if all_prepared:
                branch.deadline_ms = max(t.prepared_at_ms for t in parts.values()) + timeout * 1000
            self._insert(branch)
            outcome = decided.get(xid)
            if outcome is not None and outcome[0] is Kind.COMMIT:
                event = Event.COMMIT if all_prepared else Event.COMMIT_ONE_PHASE
                results.append((xid, self._apply(xid, event, now_ms)))
            elif outcome is not None:
                results.append((xid, self._apply(xid, Event.ROLLBACK, now_ms, reason=outcome[1])))
            elif all_prepared:
                self._arm(branch)
                self._journal(branch, decision=True, now_ms=now_ms)
            else:
                results.append((xid, self._apply(xid, Event.FAILOVER, now_ms)))
        for xid, (kind, _reason) in decided.items():
            if xid not in open_in and xid not in self.branches:
                # finished before the crash: a retried commit or rollback gets the outcome
                self._remember(xid, State.COMMITTED if kind is Kind.COMMIT else State.ROLLED_BACK)
        for xid in [x for x in self.branches if x not in open_in]:
            branch = self.branches[xid]
            branch.partitions = []  # no log holds an open record of it: nothing to mark
            outcome = decided.get(xid)
            if outcome is not None:
                self._finish(branch, State.COMMITTED if outcome[0] is Kind.COMMIT else State.ROLLED_BACK)
                self._journal_drop(xid, now_ms)
            elif branch.state in IN_DOUBT:
                self._arm(branch)
            else:
                results.append((xid, self._apply(xid, Event.FAILOVER, now_ms)))
        return results

    # --- internals -----------------------------------------------------------------

    def _request(self, xid: str, event: Event, now_ms: int) -> Reply:
        """A client's step on a branch: ``_apply``, after the deadline has had its say.

        Invariant: a branch's deadline binds whether or not its timer has fired. The timer does
        not run while the master refuses requests (fenced, ZooKeeper without quorum), so a commit
        retried as the quorum returns can arrive first: the branch times out here, as the timer
        would have, and the request is answered from what that leaves. (Only requests: a
        reconcile's roll-forward of a commit already in a log is never undone by a deadline.)
        """
        branch = self.branches.get(xid)
        if (event in _BOUND_BY_DEADLINE and branch is not None and branch.state in IN_FLIGHT
                and branch.deadline_ms <= now_ms):
            timed_out = self._apply(xid, Event.TIMEOUT, now_ms)
            answer = self._apply(xid, event, now_ms)
            return Reply(answer.code, timed_out.markers + answer.markers)
        return self._apply(xid, event, now_ms)

    def _apply(self, xid: str, event: Event, now_ms: int, *, journal: bool = True,
               reason: AbortReason | None = None) -> Reply:
        """Apply the table's row; a row that refuses (an error code) keeps the state and writes nothing."""
        branch = self.branches.get(xid)
        row = step(self.state_of(xid), event)
        if branch is None:
            return Reply(row.code)  # unknown or finished: the row only answers
        before = branch.state
        self._set_state(branch, row.state)
        if row.state is State.HEURISTIC_ROLLED_BACK:
            reason = AbortReason.HEURISTIC
        elif reason is None:
            reason = _ABORT_REASON.get(event, AbortReason.ROLLBACK)
        markers = self._markers(branch, row.marker, reason)
        if row.state in (State.COMMITTED, State.ROLLED_BACK, State.NONEXISTENT):
            self._finish(branch, row.state)
            if journal and before is not State.NONEXISTENT:
                self._journal_drop(xid, now_ms)
            return Reply(row.code, markers)
        if row.state is State.PREPARED and before is not State.PREPARED:
            branch.deadline_ms = now_ms + branch.timeout_s * 1000  # the timeout runs again from the prepare
            self._arm(branch)
        elif row.state is State.ACTIVE and before is State.NONEXISTENT:
            self.tombstones.pop(xid, None)
            self._arm(branch)
        if journal and row.state is not before:
            self._journal(branch, decision=row.marker is not None, now_ms=now_ms)
        return Reply(row.code, markers)

    def _finish(self, branch: Branch, final: State) -> None:
        self._remove(branch.xid)
        self.tombstones.pop(branch.xid, None)
        if final is not State.NONEXISTENT:  # read-only and forgotten branches leave no tombstone
            self._remember(branch.xid, final)

    def _remember(self, xid: str, final: State) -> None:
        self.tombstones[xid] = final
        self.tombstones.move_to_end(xid)
        while len(self.tombstones) > self.max_tombstones:
            self.tombstones.popitem(last=False)

    @staticmethod
    def _markers(branch: Branch, marker: Marker | None, reason: AbortReason) -> list[MarkerWrite]:
        if marker is None:
            return []
        return [MarkerWrite(topic, n, _MARKER_KIND[marker], branch.xid, branch.producer_id, branch.producer_epoch,
                            branch.timeout_s, reason, branch.starter) for topic, n in branch.partitions]

    def _arm(self, branch: Branch) -> None:
        heapq.heappush(self._deadlines, (branch.deadline_ms, branch.xid))
        # A finished or re-armed branch leaves its old entry behind until that deadline passes
        # (up to maxTxTimeoutInSeconds): a churn of short branches would grow the heap without
        # bound. Rebuilt from the live branches once stale entries outnumber them: O(1) amortised.
        if len(self._deadlines) > 2 * self._in_flight + STALE_DEADLINES_SLACK:
            self._deadlines = [(b.deadline_ms, xid) for xid, b in self.branches.items() if b.state in IN_FLIGHT]
            heapq.heapify(self._deadlines)

    def _keep(self, branch: Branch) -> None:
        self._insert(branch)
        if branch.state in IN_FLIGHT:
            self._arm(branch)

    # Invariant: ``_in_flight``, ``_live_by_starter`` and ``_in_doubt_by_starter`` equal what a scan
    # of ``branches`` would find; these three are the only places that add, change the state of,
    # or drop a branch.

    def _insert(self, branch: Branch) -> None:
        """Hold ``branch`` (replacing any branch of its xid)."""
        if branch.xid in self.branches:
            self._remove(branch.xid)
        self.branches[branch.xid] = branch
        self._count(branch, 1)

    def _remove(self, xid: str) -> None:
        self._count(self.branches.pop(xid), -1)

    def _set_state(self, branch: Branch, state: State) -> None:
        if (branch.state in IN_FLIGHT) is not (state in IN_FLIGHT):
            self._in_flight += 1 if state in IN_FLIGHT else -1
        if (branch.state in IN_DOUBT) is not (state in IN_DOUBT):
            self._index_in_doubt(branch, state in IN_DOUBT)
        branch.state = state

    def _count(self, branch: Branch, sign: int) -> None:
        if branch.state in IN_FLIGHT:
            self._in_flight += sign
        if branch.state in IN_DOUBT:
            self._index_in_doubt(branch, sign > 0)
        live = self._live_by_starter.get(branch.starter, 0) + sign
        if live:
            self._live_by_starter[branch.starter] = live
        else:
            del self._live_by_starter[branch.starter]

    def _index_in_doubt(self, branch: Branch, in_doubt: bool) -> None:
        if in_doubt:
            self._in_doubt_by_starter.setdefault(branch.starter, set()).add(branch.xid)
            return
        xids = self._in_doubt_by_starter[branch.starter]
        xids.discard(branch.xid)
        if not xids:
            del self._in_doubt_by_starter[branch.starter]

    def _journal(self, branch: Branch, *, decision: bool, now_ms: int) -> None:
        if self.journal is not None:
            self.journal.record(branch.xid, branch.to_json(), decision=decision, now_ms=now_ms)

    def _journal_drop(self, xid: str, now_ms: int) -> None:
        if self.journal is not None:
            self.journal.record(xid, None, decision=True, now_ms=now_ms)


def partitions_of(replies: Iterable[tuple[str, Reply]]) -> set[Partition]:
    """Every partition a batch of replies asks the caller to write a marker to."""
    return {(m.topic, m.partition) for _xid, reply in replies for m in reply.markers}
