"""Sync replication on the master: the sync set, and acks that wait for it.

Sync mode is async replication plus a wait (as in RocketMQ's SYNC_MASTER and
Kafka's acks=all): slaves pull exactly as in async mode, each fetch reports the
slave's log end, and a put is acked once **every** member of the *sync set*
(at least ``minSyncSlaves`` of them) has reported a log end at or past the
put's end offset. The wait is per put request, not per message, so batches and
pipelining keep their throughput.

Invariant: **every slave named in the sync set in ZooKeeper holds every acked
message.** Failover elects only from that set, so it can never lose an ack.
The rules that keep it:

* **Join** (two steps): a slave whose log end has reached, on every partition,
  what no failover can take back (``_safe_end``: the committed offset before it is
  moved down to a batch boundary) becomes *joining*: from that moment acks wait for it too.
  Then the set including it is written to ZooKeeper and it is a member. It had
  everything acked before it became joining, and every ack since waited for
  it, so it holds every acked message when ZooKeeper first names it.
* **Leave**: a member leaves when a put has waited ``syncSlaveTimeoutMs`` for
  it, when it has not been heard from (fetch or heartbeat) for that long, or
  when its replication connection closes. **The smaller set is written to
  ZooKeeper before any ack stops waiting for the removed slave**, so the set in
  ZooKeeper always names slaves that hold every acked message; failover (which
  elects only from that set) can therefore never lose an acked message.
* **Too small** (fewer members than ``minSyncSlaves``): with
  ``onSyncSlaveLoss=reject`` new puts are refused before anything is written
  (503, retriable: nothing stored) and puts already waiting end with 504
  (unknown outcome: the master has them, a slave may); with ``degrade`` puts
  are acked by the master alone and the state shows in stats and the log.

Committed offset (what consumers may read) per partition: the highest offset
that ``minSyncSlaves`` members have, never decreasing; with nobody counted
(a master alone) what it holds that no failover can take back: degrade, its
flushed end; reject, the flushed part of the log it took over with.
Then **the committed offset is never inside a batch** (an idempotent or
transactional put: a BATCH header and its records, appended at once): a slave
reports record boundaries, and its fetch (or a 256 KiB piece of a large reply)
may stop inside a batch, so the candidate is moved down to the start of the batch
it falls in (the injected ``batch_boundary``). Readers, on the master and on the
slaves that learn it, then never see part of a batch that is not acked; a failover
cuts such a part and the producer's resend stores it again. Acks are unaffected:
they compare a put's end (never inside another batch) with the slaves' positions.

A slave's position is not stored here: the injected ``position`` reads the one
record of it (``ReplicationProgress``, limited to the current epoch, so a
position from an earlier term never counts). A position past our log end
counts as nothing: a slave's log is a prefix of ours, so a longer one has a
divergent tail that must never count as a replica of our puts.

Where the state lives: what is per slave (members, joining slaves, each slave's last
contact and join bookkeeping) is here; what is per partition (committed offset, the
offset consumers were last woken for, the safe end, the log end this term started
with, the puts waiting) is one ``PartitionSync`` per partition and term, kept in the
partition's replication record (record.py, ``ReplicationRecord.sync``, through the
injected ``records``): a partition dropped takes it along (its waiting puts end with
404), and a new term's ``SyncReplication`` starts each partition afresh (a record
holding the previous term's state is given a new one at first use). ``_waiting``
indexes the partitions with puts waiting, so the periodic check (every 100 ms at most)
never walks every partition: it is this module's one map by partition, and a state leaves
it when its last waiter does or its partition is dropped (``PartitionSync.dropped``).

Nothing here does I/O itself: ZooKeeper writes go through the injected
``publish`` coroutine, so the rules are unit-tested without a server.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from ..deferred import Deferred
from ..protocol import commands as c
from .record import RecordTable, ReplicationRecords

log = logging.getLogger(__name__)


class SyncWaitFailed(Exception):
    """A put that cannot be acked as replicated; ``code`` is 503 (not stored) or 504 (unknown)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Waiter:
    topic: str
    partition: int
    end: int
    deadline: float
    #: Released synchronously by the slave's report that covers the put: the ack goes out
    #: inside that report's handling, without a task or a turn of the loop.
    future: "Deferred[None]" = field(repr=False)


class PartitionSync:
    """One partition's sync state in one term (``ReplicationRecord.sync``)."""

    __slots__ = ("term", "key", "committed", "woken_at", "safe", "term_start", "waiters")

    def __init__(self, term: "SyncReplication", key: tuple[str, int], term_start: int = 0) -> None:
        self.term = term
        self.key = key
        #: What readers may read (``committed``) and what no failover can take back (``safe``).
        self.committed = 0
        #: The committed offset consumers' parked fetches were last woken for. Apart from
        #: ``committed``: a reader's ``committed()`` may be what moved it (nobody is woken
        #: then), and the next ``_note_committed`` must still wake them.
        self.woken_at = 0
        self.safe = 0
        #: The log end this master took over with (0 for a partition created in the term).
        self.term_start = term_start
        self.waiters: list[_Waiter] = []

    def fail_waiters(self, code: int, message: str) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(SyncWaitFailed(code, message))

    def dropped(self) -> None:
        """The partition is no longer served (topic deleted or re-created; from
        ``ReplicationRecord.close``): its waiting puts end (404: the topic is gone, its log with
        them) and it leaves its term's index of waiting partitions."""
        self.fail_waiters(c.NOT_FOUND, f"topic {self.key[0]} was deleted while this put waited for its slaves; outcome unknown")
        self.term._unindex(self)


#: A slave that is not counted yet is looked at over every partition (``_rescan``) from its
#: reports at most once per P / RESCAN_SHARE of them (P partitions: a look costs P, so a report
#: pays for 1/RESCAN_SHARE of one), and besides once per ``_check_periodically`` interval.
RESCAN_SHARE = 64
#: How often the master logs what a slave that is not in the sync set yet is waiting for.
WAITING_LOG_S = 5.0


@dataclass
class _Member:
    last_contact: float
    #: Not counted yet: the partitions its last full look found it behind on (None: no look yet).
    #: A report on one of them that reaches its target takes it out; once empty, a new look
    #: decides (targets move with puts, so a partition caught up at the look may be behind now).
    behind: set[tuple[str, int]] | None = None
    #: Reports since the last full look, and how many partitions that look covered.
    reports: int = 0
    looked_at: int = 0
    logged_at: float = float("-inf")


@dataclass(frozen=True)
class SyncTerm:
    """What a stopped sync set leaves for a master that leads the same epoch again.

    A master fenced by a ZooKeeper disconnection that comes back with its session (and so
    its epoch) leads on in the same term. It acked nothing while fenced, and every ack before
    waited for each member: the members still hold every acked message, and the set
    ZooKeeper names is the one this master published. Starting that term again with an
    empty set would publish ``[]`` (no slave may take over any more: a ZooKeeper cut that
    follows leaves the group without a master) and ack alone until the slaves re-join."""
    epoch: int
    members: frozenset[int]
    term_start: dict[tuple[str, int], int]


class SyncReplication:
    def __init__(
        self,
        min_sync_slaves: int,
        timeout_ms: int,
        on_loss: str,
        publish: Callable[[frozenset[int]], Awaitable[None]],
        log_end: Callable[[str, int], int],
        flushed_end: Callable[[str, int], int],
        partitions: Callable[[], list[tuple[str, int]]],
        position: Callable[[int, str, int], int | None],
        on_committed: Callable[[str, int], None] = lambda topic, partition: None,
        clock: Callable[[], float] = time.monotonic,
        batch_boundary: Callable[[str, int, int, int], int] = lambda topic, partition, offset, committed: offset,
        records: ReplicationRecords | None = None,
    ) -> None:
        self.min_sync_slaves = min_sync_slaves
        self.timeout = timeout_ms / 1000
        self.on_loss = on_loss
        self._publish = publish
        self._log_end = log_end
        self._flushed_end = flushed_end
        self._partitions = partitions
        self._position = position
        self._on_committed = on_committed
        self._clock = clock
        #: (topic, partition, offset, committed) -> the highest offset <= offset not inside a
        #: batch, or ``committed`` when that cannot be told (metaq/server/partitions.py).
        self._batch_boundary = batch_boundary
        #: Members as published in ZooKeeper.
        self.members: frozenset[int] = frozenset()
        #: Caught-up slaves on their way into ZooKeeper; acks already wait for them.
        self.joining: set[int] = set()
        self._slaves: dict[int, _Member] = {}
        #: Each partition's replication record, holding its ``PartitionSync`` (the broker's
        #: ``Partitions``; a table of our own when none is given).
        self._records: ReplicationRecords = records if records is not None else RecordTable()
        #: The partitions with puts waiting (an index for the periodic sweep, which would
        #: otherwise walk every partition every tick: their state is in their records).
        #: A state is in it while it has waiters (``wait``, ``_unindex``).
        self._waiting: dict[tuple[str, int], PartitionSync] = {}
        self._publish_lock = asyncio.Lock()
        self._pending_changes = False
        self._checker: asyncio.Task[None] | None = None
        #: The task publishing membership changes, if one was started (cancelled by ``stop``).
        self._publisher: asyncio.Task[None] | None = None
        #: Set by stop(): a fenced or stopping master must never publish a sync set again
        #: (a publish retried after losing the ZK session would overwrite the new master's).
        self._stopped = False
        #: Set once ``start`` published this term's (empty) sync set; see ``refusal``.
        self._term_published = False
        self.degraded_since: float | None = None
        self.removals = 0
        self.joins = 0

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, resume: SyncTerm | None = None) -> None:
        """Publish this term's sync set before the first ack: empty for a new term, or the
        members of ``resume`` when this master leads the same term again (``SyncTerm``)."""
        # What this master took over with: readable even before a slave joins.
        for key in self._partitions():
            self._sync(*key).term_start = self._log_end(*key)
        members: frozenset[int] = frozenset()
        if resume is not None:
            for (topic, partition), start in resume.term_start.items():
                self._sync(topic, partition).term_start = start
            members = resume.members
            # Heard from as of now: a member that is gone is removed after the timeout, and
            # that smaller set is published before any ack stops waiting for it.
            self._slaves = {slave_id: _Member(self._clock()) for slave_id in members}
        # Whatever a previous master wrote is not ours to trust: start empty (or with what
        # this master published in this very term), and publish that before the first ack
        # (acks in degrade mode count on it).
        await self._publish(members)
        self.members = members
        self._term_published = True
        self._update_degraded()
        self._checker = asyncio.ensure_future(self._check_periodically())

    def term(self, epoch: int) -> SyncTerm:
        """This term's members and start, for ``start(resume=...)`` if the master leads ``epoch`` again."""
        return SyncTerm(epoch, self.members, {key: self._sync(*key).term_start for key in self._partitions()})

    async def stop(self) -> None:
        self._stopped = True
        if self._checker is not None:
            self._checker.cancel()
            await asyncio.gather(self._checker, return_exceptions=True)
        for state in self._waiting.values():
            state.fail_waiters(c.GATEWAY_TIMEOUT, "this master stopped waiting for its slaves (fenced or stopping); outcome unknown")
        self._waiting.clear()
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            # Stopped: nothing is published again; a write already sent goes on in ZooKeeper's
            # worker, but nobody waits for its answer (every waiting ack failed above).
            publisher.cancel()
            await asyncio.gather(publisher, return_exceptions=True)

    def _sync(self, topic: str, partition: int) -> PartitionSync:
        """The partition's state in this term, in its record (made at first use in the term)."""
        record = self._records.replication(topic, partition)
        if record is None:  # not served (dropped): nothing to remember
            return PartitionSync(self, (topic, partition))
        state = record.sync
        if state is None or state.term is not self:  # none yet, or the previous term's
            state = record.sync = PartitionSync(self, (topic, partition))
        return state

    # --- state ------------------------------------------------------------------------------

    @property
    def too_small(self) -> bool:
        return len(self.members) < self.min_sync_slaves

    @property
    def counted(self) -> set[int]:
        """The slaves every ack waits for: members and joining slaves."""
        return self.members | self.joining

    @property
    def nobody_counted(self) -> bool:
        """``not counted``, without building the set (asked several times per put)."""
        return not self.members and not self.joining

    def refusal(self) -> tuple[int, str] | None:
        """Why a new put must be refused before it is written, or None.

        Invariant (enforced here; ``wait`` asks this first): an ack in term E implies
        ZooKeeper names term E's sync set. Until ``start`` has published it, ZooKeeper
        may still name the previous term's set: a slave from it could be elected and
        lose a put this master acked alone (degrade mode, nobody counted).
        """
        if not self._term_published:
            return (c.SERVICE_UNAVAILABLE,
                    "sync replication: this master's sync set is not yet published in ZooKeeper; nothing was stored, retry")
        if self.too_small and self.on_loss == "reject":
            return (
                c.SERVICE_UNAVAILABLE,
                f"sync replication: {len(self.members)} of minSyncSlaves={self.min_sync_slaves} slaves in the sync set"
                " (onSyncSlaveLoss=reject); nothing was stored, retry later",
            )
        return None

    def committed(self, topic: str, partition: int, replicated: int | None = None) -> int:
        """What consumers may read: ``_safe_end`` moved down to a batch boundary; never decreases.
        ``replicated``: ``_replicated_end`` as the caller has just computed it (see ``_safe_end``)."""
        state = self._sync(topic, partition)
        current = state.committed
        candidate = self._safe_end(topic, partition, replicated, state)
        if candidate > current:
            # Invariant: committed is never inside a batch (see the module docstring). Only
            # a candidate that would move it is looked at: one lookup per advance, and none
            # of a partition's batches to look at if it has only plain puts.
            candidate = self._batch_boundary(topic, partition, candidate, current)
            if candidate > current:
                state.committed = candidate
                return candidate
        return current

    def _safe_end(self, topic: str, partition: int, replicated: int | None = None, state: PartitionSync | None = None) -> int:
        """What no failover can take back (a record boundary); never decreases. The join bar.

        Unlike ``committed`` it is not moved down to a batch boundary, so a slave joins
        exactly when it holds everything acked, whatever the batches. ``replicated``:
        ``_replicated_end(topic, partition)`` computed by the caller with nothing moved since
        (``_resolve``, in the same slave report), so it is not walked again.
        """
        if state is None:
            state = self._sync(topic, partition)
        current = state.safe
        if self.nobody_counted:
            # Invariant: the safe end = the lowest end over the counted slaves; with nobody
            # counted, what no failover can take back and (reject) no ack is pending on.
            # An empty set is published before the first ack and before any waiter is
            # released, so ZooKeeper names no slave that could be elected instead of us.
            # degrade: the flushed end (the master alone acks). reject: the flushed part
            # of the log we took over with (it holds every message acked before this
            # term), never past it: puts of this term that ended in 504 stay invisible
            # until a slave holds them. Reject mode refuses writes, never reads.
            flushed = self._flushed_end(topic, partition)
            candidate = flushed if self.on_loss == "degrade" else min(flushed, state.term_start)
        else:
            candidate = self._replicated_end(topic, partition) if replicated is None else replicated
        if candidate > current:
            state.safe = candidate
            return candidate
        return current

    def _replicated_end(self, topic: str, partition: int) -> int:
        """The highest offset every counted slave has (capped at the log end).

        ``_replica_end`` of each counted slave, inlined: this runs several times per put
        on a sync master, and the log end is looked up once here instead of per slave (and
        the counted slaves are walked without building their set; one in both is seen twice).
        """
        if self.nobody_counted:
            return 0
        log_end = lowest = self._log_end(topic, partition)
        for slave_id in itertools.chain(self.members, self.joining):
            position = self._position(slave_id, topic, partition) if slave_id in self._slaves else None
            if position is None or position > log_end:
                return 0  # unknown, or a divergent tail: holds nothing of ours
            lowest = min(lowest, position)
        return lowest

    def _replica_end(self, slave_id: int, topic: str, partition: int) -> int:
        """How much of our log a slave holds: its position, or 0 if unknown or past our end."""
        position = self._position(slave_id, topic, partition)
        if position is None or position > self._log_end(topic, partition):
            return 0
        return position

    # --- events from the broker --------------------------------------------------------

    def slave_position(self, slave_id: int, topic: str, partition: int) -> None:
        """A slave's fetch reported (and ``position`` now returns) its log end for a partition."""
        member = self._slaves.get(slave_id)
        if member is None:
            member = self._slaves[slave_id] = _Member(self._clock())
        member.last_contact = self._clock()
        log_end = self._position(slave_id, topic, partition)
        if log_end is not None and log_end > self._log_end(topic, partition):
            # A slave's log is a prefix of ours: a longer one has bytes we never wrote
            # (a divergent tail). They must never count as replicas of our puts.
            log.warning(
                "slave %d reports log end %d for %s-%d, past ours (%d); not counted",
                slave_id, log_end, topic, partition, self._log_end(topic, partition),
            )
            return
        if slave_id in self.members or slave_id in self.joining:  # counted
            self._resolve(topic, partition)
        else:
            self._consider_joining(slave_id, member, (topic, partition))

    def slave_heard(self, slave_id: int) -> None:
        member = self._slaves.get(slave_id)
        if member is not None:
            member.last_contact = self._clock()

    def slave_disconnected(self, slave_id: int) -> None:
        """Its replication connection closed: it cannot be counted on any more."""
        member = self._slaves.pop(slave_id, None)
        if member is not None and slave_id in self.counted:
            log.warning("sync slave %d disconnected; removing it from the sync set", slave_id)
            self._schedule_publish()

    def forget_partitions(self, keys: list[tuple[str, int]]) -> None:
        """Partitions no longer served (topic deleted or re-created): their states went with
        their records (``Partitions.drop``; a table of our own drops them here), whose close
        ended their waiting puts (404) and took them out of ``_waiting``; their offsets restart
        with the new log. What is left is the slaves' join bookkeeping."""
        if isinstance(self._records, RecordTable):
            self._records.drop(keys)
        gone = set(keys)
        for member in self._slaves.values():
            if member.behind:
                member.behind -= gone  # never reported again: must not hold a join up

    def wait(self, topic: str, partition: int, end: int) -> "Deferred[None] | None":
        """What a put ending at ``end`` waits for, or None if it can be acked now."""
        refusal = self.refusal()
        if refusal is not None:
            raise SyncWaitFailed(*refusal)
        if self.nobody_counted:
            return None  # degraded: the master alone
        replicated = self._replicated_end(topic, partition)
        if replicated >= end:
            self._note_committed(topic, partition, replicated)
            return None
        future: Deferred[None] = Deferred()
        state = self._sync(topic, partition)
        state.waiters.append(_Waiter(topic, partition, end, self._clock() + self.timeout, future))
        self._waiting[state.key] = state
        return future

    # --- internals ------------------------------------------------------------------------------

    def _consider_joining(self, slave_id: int, member: _Member, key: tuple[str, int]) -> None:
        """A report of a slave that is not counted: let it join once it holds what it must.

        Not a walk over every partition per report (at thousands of partitions and one report
        per partition that was quadratic, and kept a master's loop busy until its lease
        lapsed): the report takes its partition out of the slave's ``behind`` set, and only
        an empty set, or enough reports since the last look, pays for a new full look.
        """
        member.reports += 1
        behind = member.behind
        if behind:
            if key in behind and not self._partition_behind(slave_id, key, not self.counted):
                behind.discard(key)
            if behind:
                return
        if behind is not None and member.reports * RESCAN_SHARE < member.looked_at:
            return  # too soon for another full look: the periodic one (``_look_at_waiting_slaves``) decides
        self._rescan(slave_id, member)

    def _rescan(self, slave_id: int, member: _Member) -> None:
        """Look at every partition: join the slave if it is behind on none, else remember where."""
        member.reports = 0
        keys = self._partitions()
        member.looked_at = len(keys)
        # With nobody counted, puts already appended are acked without waiting for any
        # slave (degrade: after the master's flush, or at once with unflushThreshold>0;
        # minSyncSlaves=0: at once), and their ends can lie past the committed offset.
        # A slave that joins then must already hold the whole log, or ZooKeeper would
        # name a slave that lacks an acked message.
        alone = not self.counted
        member.behind = {key for key in keys if self._partition_behind(slave_id, key, alone)}
        if not member.behind:
            # From here on acks wait for it; ZooKeeper names it once published.
            self.joining.add(slave_id)
            self._schedule_publish()

    def _partition_behind(self, slave_id: int, key: tuple[str, int], alone: bool) -> bool:
        """Whether the slave lacks, in one partition, what it must hold to join (the whole log
        when nobody is counted, else what no failover can take back)."""
        topic, partition = key
        log_end = self._log_end(topic, partition)
        target = log_end if alone else self._safe_end(topic, partition)
        if self._replica_end(slave_id, topic, partition) < target:
            return True
        return self._position(slave_id, topic, partition) is None and log_end > 0

    def _look_at_waiting_slaves(self) -> None:
        """Periodically: a fresh look for slaves whose ``behind`` set emptied between looks (or
        was never made), and, every WAITING_LOG_S, a log line saying what the others wait for."""
        now = self._clock()
        for slave_id, member in list(self._slaves.items()):
            if slave_id in self.members or slave_id in self.joining:
                continue
            if not member.behind or now - member.logged_at >= WAITING_LOG_S:
                self._rescan(slave_id, member)
            if member.behind and now - member.logged_at >= WAITING_LOG_S:
                member.logged_at = now
                sample = ", ".join(f"{t}-{p} at {self._position(slave_id, t, p)} of {self._safe_end(t, p)}"
                                   for t, p in sorted(member.behind)[:5])
                log.info("slave %d is not in the sync set yet: behind on %d of %d partitions (%s%s)",
                         slave_id, len(member.behind), member.looked_at, sample,
                         ", ..." if len(member.behind) > 5 else "")

    def _resolve(self, topic: str, partition: int) -> None:
        self._resolve_state(self._sync(topic, partition))

    def _resolve_state(self, state: PartitionSync) -> None:
        topic, partition = state.key
        waiters = state.waiters
        if not waiters:
            self._note_committed(topic, partition, state=state)
            return
        replicated = self._replicated_end(topic, partition)
        # Releasing a waiter writes its put's ack (a Deferred's callback) and nothing else: no
        # log end and no slave position moves before ``_note_committed`` uses ``replicated``.
        still = []
        for waiter in waiters:
            if waiter.end <= replicated:
                if not waiter.future.done():
                    waiter.future.set_result(None)
            else:
                still.append(waiter)
        state.waiters = still
        if not still:
            self._unindex(state)
        self._note_committed(topic, partition, replicated, state)

    def _unindex(self, state: PartitionSync) -> None:
        """``state`` has no puts waiting any more (or its partition was dropped)."""
        if self._waiting.get(state.key) is state:
            del self._waiting[state.key]

    def _note_committed(self, topic: str, partition: int, replicated: int | None = None,
                        state: PartitionSync | None = None) -> None:
        """Move the committed offset and wake consumers' fetches if it is past where they
        were last woken, whoever moved it (this call, or a reader's ``committed()`` before)."""
        committed = self.committed(topic, partition, replicated)
        if state is None:
            state = self._sync(topic, partition)
        if committed > state.woken_at:
            state.woken_at = committed
            self._on_committed(topic, partition)

    def _desired_members(self) -> frozenset[int]:
        """Counted slaves that are still heard from and hold up no expired put."""
        now = self._clock()
        desired = set()
        expired = [w for w in self._all_waiters() if w.deadline <= now]
        for slave_id in self.counted:
            member = self._slaves.get(slave_id)
            if member is None or now - member.last_contact > self.timeout:
                continue
            if any(self._replica_end(slave_id, w.topic, w.partition) < w.end for w in expired):
                continue
            desired.add(slave_id)
        return frozenset(desired)

    def _all_waiters(self) -> list[_Waiter]:
        return [w for state in self._waiting.values() for w in state.waiters]

    def _schedule_publish(self) -> None:
        if self._stopped:
            return
        self._pending_changes = True
        if not self._publish_lock.locked():
            self._publisher = asyncio.ensure_future(self._publish_changes())

    async def _publish_changes(self) -> None:
        async with self._publish_lock:
            while self._pending_changes and not self._stopped:
                self._pending_changes = False
                desired = self._desired_members()
                if desired == self.members:
                    self.joining -= self.joining - desired  # dropped before being published
                    self._after_membership_change()
                    continue
                removed, added = self.members - desired, desired - self.members
                try:
                    await self._publish(desired)
                except Exception as exc:  # ZK down: keep waiting on the old set (safe), retry later
                    log.error("cannot publish the sync set %s: %s", sorted(desired), exc)
                    self._pending_changes = True
                    await asyncio.sleep(0.2)
                    continue
                self.members = desired
                # Only now may acks stop waiting for removed slaves.
                self.joining -= desired | removed
                self.joining &= set(self._slaves)
                self.removals += len(removed)
                self.joins += len(added)
                if removed:
                    log.warning("sync set is now %s (removed %s)", sorted(desired), sorted(removed))
                if added:
                    log.info("sync set is now %s (slave %s caught up)", sorted(desired), ", ".join(map(str, sorted(added))))
                self._update_degraded()
                self._after_membership_change()

    def _update_degraded(self) -> None:
        if self.too_small and self.degraded_since is None:
            self.degraded_since = self._clock()
            log.warning(
                "sync set has %d of minSyncSlaves=%d slaves: %s",
                len(self.members),
                self.min_sync_slaves,
                "acking with the master alone (onSyncSlaveLoss=degrade)" if self.on_loss == "degrade" else "refusing puts (onSyncSlaveLoss=reject)",
            )
        elif not self.too_small and self.degraded_since is not None:
            log.info("sync set has %d slaves again; puts wait for replication", len(self.members))
            self.degraded_since = None

    def _after_membership_change(self) -> None:
        """Re-evaluate every waiting put against the published set."""
        for key, state in list(self._waiting.items()):
            if not self.counted or (self.too_small and self.on_loss == "reject"):
                waiters, state.waiters = state.waiters, []
                for waiter in waiters:
                    if waiter.future.done():
                        continue
                    if self.on_loss == "degrade":
                        waiter.future.set_result(None)
                    else:
                        waiter.future.set_exception(
                            SyncWaitFailed(
                                c.GATEWAY_TIMEOUT,
                                "sync slave lost while waiting; the message is stored on the master and may or may not be"
                                " on a slave (outcome unknown)",
                            )
                        )
                del self._waiting[key]
            else:
                self._resolve_state(state)

    async def _check_periodically(self) -> None:
        """Expire silent members and timed-out waits; let caught-up slaves join."""
        interval = min(0.1, self.timeout / 4)
        while True:
            await asyncio.sleep(interval)
            self._look_at_waiting_slaves()
            if self._desired_members() != frozenset(self.counted):
                self._schedule_publish()
                continue
            now = self._clock()
            for state in list(self._waiting.values()):
                for waiter in state.waiters:
                    if waiter.deadline <= now and not waiter.future.done():
                        # Every member has it, or the lagging ones would have been removed.
                        self._resolve_state(state)
                        break

    def status_pairs(self) -> list[tuple[str, object]]:
        state = "ok" if not self.too_small else ("degraded" if self.on_loss == "degrade" else "rejecting")
        return [
            ("sync_set", ",".join(map(str, sorted(self.members))) or "-"),
            ("sync_joining", ",".join(map(str, sorted(self.joining))) or "-"),
            ("sync_state", state),
            ("sync_min_slaves", self.min_sync_slaves),
            ("sync_waiting_puts", sum(len(state.waiters) for state in self._waiting.values())),
            ("sync_set_removals", self.removals),
            ("sync_set_joins", self.joins),
        ]
