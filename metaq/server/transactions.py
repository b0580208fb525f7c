"""The broker's transaction service: the coordinator, its journal, markers in the logs, timers.

It owns one ``TransactionCoordinator`` (metaq/txn/coordinator.py) and the broker's
``TxLog`` journal (metaq/txn/txlog.py, in ``{dataLogPath or dataPath}/transactions``)
and does what the coordinator asks of its caller:

* ``serve(req)`` answers a ``transaction`` request (start, end, prepare, commit,
  rollback, forget, recover): it applies the XA table, appends every PREPARE /
  COMMIT / ABORT marker the step names to its partition through the ordinary
  append path (msg ids, the flush policy, sync replication), and replies only when
  each marker is as durable as an acked put would be;
* ``enlist(txid, topic, partition, producer_id, principal)`` is the put path's check
  before it appends a transactional batch (the branch must be ACTIVE, and the put its
  own: see below);
* a timer (every ``TICK_S``) fires due timeouts (their ABORT markers) and starts the
  journal's checkpoints and ``flushTxLogAtCommit=2`` fsyncs, which run in a worker thread;
* ``reconcile``: an explicit step when this broker takes up mastership of an epoch
  (``on_leading``, called by the HA coordinator's ``_lead``, or by the broker at start
  without ZooKeeper; Kafka's ``onElection``): as soon as the broker may write (at once,
  or on a later tick), before it answers any transaction request or enlists any batch,
  the coordinator merges what the replicated partition logs show (open, prepared,
  committed or aborted transactions: their control records) with its journal, and
  the markers that decides (roll a half-written commit forward, abort unprepared
  work of the old master) are appended. Until then requests get 503 (LOAD_IN_PROGRESS);
  ``refusal`` only reads that state. ``on_resigned`` (``Leadership.stop``) ends the mastership;
* journal fsyncs run in a worker thread, like the store's: a decision is journaled on the
  event loop and fsynced off it (flushTxLogAtCommit=1: ``_journal_durable``); no marker of a
  decision is appended, and no answer that depends on it sent, before that fsync. The
  once-a-second fsync of flushTxLogAtCommit=2 and the periodic checkpoint run there too
  (``_start_upkeep``): only serializing the branches and rotating the redo file stay on the
  loop, in one step, so a checkpoint covers exactly the redo files before it.

Invariants kept here:

* only the acting master that has reconciled in its current epoch serves a
  transaction request or enlists a batch (a slave answers like it does for puts:
  403 naming its master; a master still reconciling: 503, retry);
* an answer that depends on markers is sent only after those markers are durable
  and replicated like a sync put; a request on a branch whose markers are still
  settling (or failed to settle: a sync timeout) waits for them first, so a retried
  commit never gets XA_OK before its COMMIT markers are safe;
* fencing (transactional ids): a producer id's epochs below its newest known one are
  zombies: their puts and transaction steps get 403 ``fenced: ...``. The newest epoch has
  one owner, ``TransactionalIds`` (the group's mapping: raised by ``init_producer`` with a
  transactional id, read again when this broker takes up mastership; transaction requests
  and transactional puts wait for that read with 503); ``fence_of`` only reads it. A
  partition's producer table records only the epochs appended to it. An init answers
  only after the older epochs' unprepared branches are rolled back and their ABORT
  markers are as durable as a put's;
* a producer id and epoch in a step are checked like a put's: their ``producer_token``
  must verify for the caller (metaq/server/authz.py) before anything changes;
* who may start a branch (security on): a principal that may produce some topic (a
  branch of anyone else could never hold a message, so its start is refused at once,
  before any other work), holding fewer than ``maxOpenTransactionsPerUser`` live
  branches on this master (counted by the coordinator, O(1), never by a scan); each
  refusal is a 403;
* who may decide a branch's fate: every action but ``start`` on a branch (also on an
  empty one) needs the principal that started it (``admin`` may act on any branch).
  The starter is recorded with the branch as its keyed tag (metaq/security/principal_tags.py):
  in the journal and in the branch's PREPARE markers, so a restarted master and a
  promoted slave know it too (an unprepared branch does not outlive a take-over: the
  reconcile rolls it back). A branch whose starter is unknown (a PREPARE marker or a
  journal written before starters were recorded) is admin's alone. ``recover`` needs
  produce on some topic or admin (refused like a start, before any work) and lists only
  the branches the caller may decide, from the coordinator's per-starter index of in-doubt
  branches (never a pass over every open branch);
* who may add messages to a branch (security on): a put under the branch's producer id
  (the one its ``start`` carried; the put path has verified the put's producer_token for
  the sender) or from the branch's starter (an XA resource of the same application may
  join with another producer). Anyone else's put, an admin's too, gets 403 and stores
  nothing: otherwise a user could slip messages into another user's transaction,
  committed by its owner's commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, NamedTuple, Protocol

from ..protocol import commands as c
from ..protocol.messages import TransactionRequest
from ..txn import control
from ..txn.control import NO_PRODUCER
from ..txn.coordinator import MarkerWrite, Reply, TransactionCoordinator
from ..txn.txlog import TxLog, Upkeep
from ..txn.xa import Code
from .transactional_ids import Fence, Owner, TransactionalIds

if TYPE_CHECKING:
    from ..config import BrokerConfig
    from ..security.principals import Principal
    from ..txn.config import TxnSettings
    from ..txn.rebuild import PartitionTxnState
    from .authz import Authz, RequestContext
    from .partitions import Partitions

log = logging.getLogger(__name__)

#: The timer's period: timeouts fire at most this late; flushTxLogAtCommit=2 needs < 1 s.
TICK_S = 0.1
#: (topic, partition, end offset) of one appended marker.
MarkerEnd = tuple[str, int, int]


class PendingMarker(NamedTuple):
    """A decided marker, encoded, not yet in its partition's log (msg id stamped at append)."""

    topic: str
    partition: int
    kind: control.Kind
    data: bytes


Served = tuple[dict[str, Any], bytes]
#: How long to wait before reading the transactional id mapping again after a failure.
OWNERS_RETRY_S = 0.5


def fenced_message(producer_id: int, epoch: int, fence: Fence) -> str:
    name = f"transactional id {fence.name}" if fence.name else "its transactional id"
    return (f"fenced: a newer instance of {name} exists (producer {producer_id} epoch {epoch}, "
            f"current epoch {fence.epoch}); this producer must stop")


def _now_ms() -> int:
    return int(time.time() * 1000)


class WriteGate(Protocol):
    """Whether this broker may write now (metaq.ha.node.HaNode)."""

    def write_refusal(self) -> tuple[int, str] | None: ...


class TxnHost(Protocol):
    """What the transaction service needs of the broker (metaq.server.broker.Broker), and nothing more."""

    @property
    def config(self) -> "BrokerConfig": ...

    @property
    def authz(self) -> "Authz": ...

    @property
    def ha(self) -> WriteGate: ...

    @property
    def partitions(self) -> "Partitions": ...

    @property
    def transactional_ids(self) -> TransactionalIds | None: ...

    def durability_wait(self, topic: str, partition: int, end: int, count: int) -> Awaitable[None] | None: ...


class TransactionService:
    """One per broker; see the module's docstring."""

    @property
    def settings(self) -> "TxnSettings":
        """The transaction keys, from the broker's configuration now (never a copy: live_config.py)."""
        return self.host.config.txn

    def __init__(self, host: TxnHost, clock_ms: Callable[[], int] = _now_ms) -> None:
        self.host = host
        self.clock_ms = clock_ms
        self.journal: TxLog | None = None
        self.coordinator: TransactionCoordinator | None = None
        #: The epoch whose reconcile has run (None: not yet as master in any).
        self.reconciled_epoch: int | None = None
        #: The epoch this broker leads (``on_leading``; None: not leading, ``on_resigned``).
        self.leading_epoch: int | None = None
        #: The worker-thread fsync of the journal in flight (``_journal_durable``).
        self._journal_sync: asyncio.Future[None] | None = None
        #: The journal's mode-2 fsync or checkpoint in flight in a worker thread (``_start_upkeep``).
        self._upkeep: asyncio.Future[None] | None = None
        #: Branches whose markers are appended but not yet known durable (xid -> their ends).
        self._unsettled: dict[str, list[MarkerEnd]] = {}
        #: Branches whose decision is journaled but some of whose markers could not be appended
        #: yet (a full disk, a refused log): re-appended on the client's retry and by every tick,
        #: so a decided transaction never pins the LSO (xid -> its markers still to append, in
        #: order). Dropped by a reconcile: in a new epoch the logs decide.
        self._pending: dict[str, list[PendingMarker]] = {}
        self._timer: asyncio.Task[None] | None = None
        self._background: set[asyncio.Future[Any]] = set()
        #: Reads the group's transactional id mapping after a take-over (None: nothing to read).
        self._owners_loaded: asyncio.Future[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def open(self) -> None:
        """At start, after the logs are open and before serving: open the journal."""
        base = Path(self.settings.data_log_path or self.host.config.data_path)
        self.journal = TxLog.open(base, self.settings, self.clock_ms())
        self.journal.defer_decision_fsyncs = True  # fsynced in a worker thread: _journal_durable
        self.coordinator = TransactionCoordinator(self.settings, self.journal)
        if self.coordinator.branches:
            log.info("transaction journal %s: %d branches", self.journal.directory, len(self.coordinator.branches))

    def start(self) -> None:
        self._timer = asyncio.ensure_future(self._tick_loop())

    async def stop(self) -> None:
        tasks = [self._timer, self._owners_loaded, self._journal_sync, *self._background]
        for task in tasks:
            if task is not None:
                task.cancel()
        for task in tasks:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._timer = None
        if self._upkeep is not None:  # not cancelled: its thread runs on, and the journal closes after it
            with contextlib.suppress(Exception):
                await self._upkeep
        if self.journal is not None:
            self.journal.close()

    # --- who may serve -------------------------------------------------------------------

    def refusal(self) -> tuple[int, str] | None:
        """Why this broker must not take a transaction step now (as for puts), or None. A pure read."""
        refusal = self.host.ha.write_refusal()
        if refusal is not None:
            return refusal
        if (self.leading_epoch is None or self.reconciled_epoch != self.leading_epoch
                or (self._owners_loaded is not None and not self._owners_loaded.done())):
            return c.SERVICE_UNAVAILABLE, "transactions are being recovered from the logs after a start or take-over; retry"
        return None

    def on_leading(self, epoch: int) -> None:
        """This broker took up mastership of ``epoch``: reconcile for it as soon as it may write
        (now, or on a tick: a new sync master may still wait for its sync set to be published)."""
        self.leading_epoch = epoch
        self._reconcile_if_due()

    def on_resigned(self) -> None:
        """This broker stopped leading: no transaction step until ``on_leading`` again. What was
        reconciled stays (the same session may come back in the same epoch); a new epoch
        reconciles again."""
        self.leading_epoch = None

    def _reconcile_if_due(self) -> None:
        """Invariant: a leading epoch is reconciled exactly once, and only while this broker may write."""
        epoch = self.leading_epoch
        if epoch is None or self.reconciled_epoch == epoch or self.coordinator is None:
            return
        if self.host.ha.write_refusal() is not None:
            return  # the tick tries again
        self._reconcile(epoch)

    def _reconcile(self, epoch: int) -> None:
        assert self.coordinator is not None
        states = self.host.partitions.all()
        now = self.clock_ms()
        # Marker ends of an earlier mastership refer to logs that may have been truncated since:
        # waiting for them could stall a branch until the log grows back. Markers still queued
        # from then are dropped too: in a new epoch the logs decide (the reconcile below does,
        # as any other new master would: a commit none of whose COMMIT markers landed, never
        # answered XA_OK, is rolled back; a prepared one stays in doubt).
        for task in self._background:
            task.cancel()
        self._background.clear()
        self._unsettled.clear()
        self._pending.clear()
        replies = self.coordinator.reconcile({key: state.index for key, state in states.items()}, now)
        self.reconciled_epoch = epoch
        if self._owners_loaded is not None:
            self._owners_loaded.cancel()
        mapping = self.host.transactional_ids  # None: a broker not started (unit tests drive the service alone)
        self._owners_loaded = None if mapping is None else asyncio.ensure_future(self._load_owners(mapping))
        prepared = self.coordinator.recover()
        log.info("transactions reconciled in epoch %d: %d markers to write, %d branches in doubt",
                 epoch, sum(len(r.markers) for _x, r in replies), len(prepared))
        self._write_in_background(replies, now)

    # --- fencing ---------------------------------------------------------------------------

    def fence_of(self, producer_id: int) -> Fence | None:
        """The newest epoch of ``producer_id``'s transactional id (None: no name known), read from its
        one owner, ``TransactionalIds`` (metaq/server/transactional_ids.py): nothing here keeps a
        copy. The put path passes it to ``plan_put``; transaction steps and enlisted puts come
        only after a take-over's read of the mapping (``refusal``)."""
        mapping = self.host.transactional_ids
        return None if mapping is None else mapping.fence_of(producer_id)

    def check_fenced(self, producer_id: int, epoch: int) -> None:
        """RequestError 403 if ``epoch`` of ``producer_id`` is older than its newest instance's."""
        fence = self.fence_of(producer_id)
        if fence is not None and epoch < fence.epoch:
            raise c.RequestError(c.FORBIDDEN, fenced_message(producer_id, epoch, fence))

    async def _load_owners(self, mapping: TransactionalIds) -> None:
        """The group's transactional id mapping, read once per take-over (a newer instance may not have put yet)."""
        while True:
            try:
                await mapping.load()
            except Exception as exc:  # ZooKeeper away: transaction requests keep getting 503 meanwhile
                log.warning("reading the transactional id mapping failed, retrying: %s", exc)
                await asyncio.sleep(OWNERS_RETRY_S)
                continue
            return

    async def fence(self, name: str, owner: Owner, previous: Owner | None) -> None:
        """After ``init_producer`` of ``name`` took ``owner`` (``TransactionalIds.init`` raised its fence):
        roll back the older epochs' unprepared branches; returns once their ABORT markers are safe
        (RequestError if not)."""
        refusal = self.refusal()  # the init awaited ZooKeeper: the role may have changed
        if refusal is not None:
            raise c.RequestError(*refusal)
        coordinator = self.coordinator
        assert coordinator is not None
        now = self.clock_ms()
        fenced = {owner.producer_id} | ({previous.producer_id} if previous is not None else set())
        fences = [(pid, self.fence_of(pid)) for pid in sorted(fenced)]
        zombies = [z for pid, fence in fences if fence is not None for z in coordinator.fence(pid, fence.epoch, now)]
        for xid, reply in zombies:
            log.info("transaction %s of a fenced instance of transactional id %s rolled back", xid, name)
            if reply.markers:
                self._queue_markers(xid, reply.markers, now)
        await self._journal_durable()
        for xid, _reply in zombies:
            with contextlib.suppress(c.RequestError):  # every branch gets its try; the first failure is raised below
                self._append_pending(xid)
        for xid, _reply in zombies:
            await self._journal_durable()  # decisions journaled by other requests while we settled
            self._append_pending(xid)
            await self._settle(xid)

    # --- the put path --------------------------------------------------------------------------

    def enlist(self, txid: str, topic: str, partition: int, producer_id: int = NO_PRODUCER,
               principal: "Principal | None" = None) -> None:
        """Before a transactional batch of ``producer_id`` from ``principal`` is appended: its branch must
        take work, and from this put (RequestError if not; see the module's docstring)."""
        refusal = self.refusal()
        if refusal is not None:
            raise c.RequestError(*refusal)
        assert self.coordinator is not None
        if txid in self._unsettled or txid in self._pending:
            raise c.RequestError(c.SERVICE_UNAVAILABLE, f"transaction {txid} is being decided; retry")
        if not self.host.authz.may_enlist(principal, producer_id, self.coordinator.branches.get(txid)):
            raise c.AccessDenied(f"{principal} may not put in transaction {txid}: only its own producer "
                                 "or the user that started it may")
        reply = self.coordinator.send(txid, topic, partition, self.clock_ms())
        if reply.code is not Code.XA_OK:
            raise c.RequestError(
                c.BAD_REQUEST, f"transaction {txid} takes no more messages: {reply.code.name} (start it first; it may have ended or timed out)"
            )

    # --- the transaction command ---------------------------------------------------------------

    def serve(self, req: TransactionRequest, ctx: "RequestContext") -> Awaitable[Served]:
        refusal = self.refusal()
        if refusal is not None:
            raise c.RequestError(*refusal)
        return self._serve(req, ctx)

    async def _serve(self, req: TransactionRequest, ctx: "RequestContext") -> Served:
        principal = ctx.principal
        coordinator = self.coordinator
        assert coordinator is not None
        if req.action in ("start", "recover"):
            # First: a flood by a user who could never fill a branch (nor so own one) costs nothing.
            self.host.authz.check_may_use_transactions(principal, req.action)
        if req.action == "recover":
            return c.reply_header(req.opaque, c.OK, xa_code=int(Code.XA_OK), xids=self._recoverable(principal)), b""
        xid = req.xid
        if req.producer_id != NO_PRODUCER:
            self.host.authz.check_producer(ctx, req.producer_id, req.producer_epoch, req.producer_token)
            self.check_fenced(req.producer_id, req.producer_epoch)
        if xid in self._pending or xid in self._unsettled:
            await self._journal_durable()
            self._append_pending(xid)  # the previous decision's markers first (raises if they still fail)
            await self._settle(xid)
            if req.producer_id != NO_PRODUCER:  # an init may have fenced this epoch while we waited
                self.check_fenced(req.producer_id, req.producer_epoch)
        if req.action != "start" and not self.host.authz.may_decide(principal, coordinator.branches.get(xid)):
            raise c.AccessDenied(f"{principal} may not decide transaction {xid}: only the user that "
                                 "started it (or admin) may")
        refusal = self.refusal()  # the role may have changed while we waited
        if refusal is not None:
            raise c.RequestError(*refusal)
        now = self.clock_ms()
        starter = self._tag(principal)
        if req.action == "start" and starter and xid not in coordinator.branches:  # a retried start: XAER_DUPID below
            self._check_room(principal, starter)
        self._check_encodable(req, starter)
        reply = self._step(req, now, starter)
        if reply.markers:
            self._queue_markers(xid, reply.markers, now)  # queued first: a retry of the step waits for them
        await self._journal_durable()  # the decision (if any) before its markers and its answer
        if reply.markers:
            self._append_pending(xid)
            await self._settle(xid)
        return c.reply_header(req.opaque, c.OK, xa_code=int(reply.code)), b""

    def _recoverable(self, principal: "Principal | None") -> list[str]:
        """The in-doubt branches ``principal`` may decide (``Authz.may_decide``): every one for admin
        or with security off, else those it started, from the coordinator's per-starter index."""
        assert self.coordinator is not None
        if self.host.authz.sees_every_branch(principal):
            return self.coordinator.recover()
        return self.coordinator.recover(starter=self._tag(principal))

    def _check_room(self, principal: "Principal | None", starter: str) -> None:
        """RequestError 403 if a new branch of ``starter`` would pass maxOpenTransactionsPerUser."""
        assert self.coordinator is not None
        cap = self.settings.max_open_transactions_per_user
        if self.coordinator.live_branches_of(starter) >= cap:
            raise c.RequestError(c.FORBIDDEN, f"{principal} already holds {cap} open transaction branches on this "
                                              "broker (maxOpenTransactionsPerUser); end some first")

    def _tag(self, principal: "Principal | None") -> str:
        """The starter a branch started by ``principal`` records ("" with security off: nobody to tell apart)."""
        return self.host.authz.starter_tag(principal)

    def _check_encodable(self, req: TransactionRequest, starter: str) -> None:
        """Encode a marker of the branch before its state changes: a decision is journaled only if
        its markers can be written (RequestError 400 and no change if a field does not fit)."""
        assert self.coordinator is not None
        branch = self.coordinator.branches.get(req.xid)
        producer_id, epoch = (req.producer_id, req.producer_epoch) if branch is None else (branch.producer_id, branch.producer_epoch)
        try:
            control.marker(control.Kind.PREPARE, req.xid, producer_id=producer_id, producer_epoch=epoch,
                           timestamp_ms=self.clock_ms(), timeout_s=self.settings.max_tx_timeout_s,
                           starter=starter if branch is None else branch.starter)
        except (control.ControlError, struct.error, OverflowError) as exc:
            raise c.RequestError(c.BAD_REQUEST, f"transaction {req.xid}: its markers cannot be encoded ({exc})") from None

    def _step(self, req: TransactionRequest, now: int, starter: str) -> Reply:
        coordinator = self.coordinator
        assert coordinator is not None
        xid, action = req.xid, req.action
        if action in ("start", "start_join"):
            return coordinator.start(xid, now, req.timeout_s, join=action == "start_join",
                                     producer_id=req.producer_id, producer_epoch=req.producer_epoch, starter=starter)
        if action in ("end", "end_fail"):
            return coordinator.end(xid, now, fail=action == "end_fail")
        if action == "prepare":
            return coordinator.prepare(xid, now)
        if action in ("commit", "commit_one_phase"):
            return coordinator.commit(xid, now, one_phase=action == "commit_one_phase")
        if action == "rollback":
            return coordinator.rollback(xid, now)
        assert action == "forget", action  # TransactionRequest.check admits no other
        return coordinator.forget(xid, now)

    # --- markers ---------------------------------------------------------------------------------

    def forget_partitions(self, keys: list[tuple[str, int]]) -> None:
        """Partitions no longer served (topic deleted): their queued markers have no log to go to."""
        gone = set(keys)
        for table in (self._pending, self._unsettled):
            for xid, items in list(table.items()):
                items[:] = [item for item in items if (item[0], item[1]) not in gone]  # in place: _settle keeps its list
                if not items:
                    del table[xid]

    def _queue_markers(self, xid: str, markers: list[MarkerWrite], now: int) -> None:
        """Encode every marker of a decision (all of them before any is appended) and queue them."""
        queued = [PendingMarker(m.topic, m.partition, m.kind,
                                control.marker(m.kind, m.xid, producer_id=m.producer_id, producer_epoch=m.producer_epoch,
                                               timestamp_ms=now, timeout_s=m.timeout_s, reason=m.reason,
                                               starter=m.starter))
                  for m in markers]
        self._pending[xid] = self._pending.get(xid, []) + queued

    def _append_pending(self, xid: str) -> None:
        """Append the branch's queued markers, in order (no await: nothing runs in between).

        Invariant: a marker leaves ``_pending`` only once it is in its log, so a decided branch
        whose append failed keeps its markers until a retry or a tick appends them; a marker
        its partition's index already shows (an append that failed after writing) is not
        written twice. RequestError 503 if an append fails (the rest stay queued).

        Invariant: every decision journaled is fsynced first (flushTxLogAtCommit=1): each
        caller awaits ``_journal_durable`` and appends with no ``await`` in between."""
        host = self.host
        queued = self._pending.get(xid)
        if queued is None:
            return
        assert self._journal_synced(), "a marker may not reach a log before its decision is in the journal"
        # The journal's fsync was awaited: this broker may have stopped leading meanwhile (a
        # slave's log takes only its master's bytes). The markers stay queued; a new epoch's
        # reconcile decides them.
        if host.ha.write_refusal() is not None or self.leading_epoch != self.reconciled_epoch or self.leading_epoch is None:
            raise c.RequestError(c.SERVICE_UNAVAILABLE, f"transaction {xid}: this broker is not the writable master "
                                                        "right now; its markers are kept, retry")
        ends = list(self._unsettled.get(xid, []))
        try:
            while queued:
                marker = queued[0]
                if not host.partitions.serves(marker.topic, marker.partition):
                    queued.pop(0)  # its topic was deleted: no log to mark, none ever will be
                    continue
                if not self._in_log(xid, marker):
                    # The partition's one leader append entry, as a put's (msg id stamped, slaves
                    # streaming it sent the marker, parked fetches woken): its index follows its
                    # own marker at once.
                    appended = host.partitions.get(marker.topic, marker.partition).append_as_leader(bytearray(marker.data), 1)
                    ends.append((marker.topic, marker.partition, appended.end))
                queued.pop(0)
        except Exception as exc:
            log.warning("transaction %s: appending its %s marker to %s-%d failed, kept for a retry: %s",
                        xid, queued[0].kind.name, queued[0].topic, queued[0].partition, exc)
            raise c.RequestError(c.SERVICE_UNAVAILABLE, f"transaction {xid}: a marker could not be written "
                                                        f"({exc}); it is retried, retry") from None
        finally:
            if ends:
                self._unsettled[xid] = ends  # a new list: a _settle still waiting on the old one keeps it
            if not queued:
                self._pending.pop(xid, None)

    def _in_log(self, xid: str, marker: PendingMarker) -> bool:
        """Whether the partition's index already shows this marker of ``xid``."""
        index = self.host.partitions.state(marker.topic, marker.partition).index
        if marker.kind is control.Kind.PREPARE:
            txn = index.open.get(xid)
            return txn is not None and txn.prepared
        outcome = index.outcomes.get(xid)
        return outcome is not None and outcome.kind is marker.kind and xid not in index.open

    async def _settle(self, xid: str) -> None:
        """Wait until the branch's markers are durable and replicated; RequestError if that fails."""
        ends = self._unsettled.get(xid, [])
        waits = []
        try:
            for topic, partition, end in ends:
                wait = self.host.durability_wait(topic, partition, end, 0)
                if wait is not None:
                    waits.append(wait)
            if waits:
                await asyncio.gather(*waits)
        except Exception as exc:
            code, message = getattr(exc, "code", c.INTERNAL_ERROR), getattr(exc, "message", str(exc))
            raise c.RequestError(code, f"transaction {xid}: its markers are not yet safe ({message}); retry") from None
        if self._unsettled.get(xid) is ends:
            del self._unsettled[xid]

    def _write_in_background(self, replies: list[tuple[str, Reply]], now: int) -> None:
        """Markers nobody waits on (timeouts, reconcile): appended once journaled, settled by a task.

        Each branch on its own: one whose append fails keeps its markers queued (the next tick
        retries them) and the others' are still written."""
        for xid, reply in replies:
            if reply.markers:
                try:
                    self._queue_markers(xid, reply.markers, now)
                except Exception:  # not expected (the request check keeps fields encodable); never the others' loss
                    log.exception("transaction %s: its markers could not be encoded", xid)
        self._append_when_journaled([xid for xid, reply in replies if reply.markers])

    def _append_when_journaled(self, xids: list[str]) -> None:
        """Append the queued markers of ``xids``: at once if every decision is in the fsynced
        journal, else from a task once it is (the event loop never waits for the fsync)."""
        if not xids:
            return
        if self._journal_synced():
            self._append_all_pending(xids)
            return
        task = asyncio.ensure_future(self._append_after_journal(xids))
        self._background.add(task)
        task.add_done_callback(self._background_done)

    async def _append_after_journal(self, xids: list[str]) -> None:
        await self._journal_durable()
        self._append_all_pending(xids)

    def _journal_synced(self) -> bool:
        journal = self.journal
        return journal is None or journal.decisions_synced >= journal.decisions_written

    async def _journal_durable(self) -> None:
        """Every decision journaled so far is fsynced (flushTxLogAtCommit=1), in a worker thread:
        the event loop keeps serving meanwhile; callers waiting together share one fsync."""
        journal = self.journal
        while journal is not None and not self._journal_synced():
            if self._journal_sync is None or self._journal_sync.done():
                self._journal_sync = asyncio.ensure_future(self._fsync_journal(journal))
            await asyncio.shield(self._journal_sync)

    @staticmethod
    async def _fsync_journal(journal: TxLog) -> None:
        handle = journal.sync_handle()
        await asyncio.to_thread(journal.fsync_handle, handle)
        journal.synced(handle)

    def _start_upkeep(self, now: int) -> None:
        """The journal's flushTxLogAtCommit=2 fsync and its checkpoint, when due: what must see the
        journal as it is (the branches serialized, the redo file rotated) now on the event loop,
        the fsyncs and the checkpoint file in a worker thread. One at a time (``TxLog.begin_upkeep``)."""
        journal = self.journal
        if journal is None or (self._upkeep is not None and not self._upkeep.done()):
            return
        upkeep = journal.begin_upkeep(now)
        if upkeep is not None:
            self._upkeep = asyncio.ensure_future(self._run_upkeep(journal, upkeep))

    @staticmethod
    async def _run_upkeep(journal: TxLog, upkeep: Upkeep) -> None:
        ok = False
        try:
            await asyncio.to_thread(journal.run_upkeep, upkeep)
            ok = True
        except OSError as exc:  # the next tick tries again; decisions it did not make durable stay unsynced
            log.warning("transaction journal fsync or checkpoint failed, retried: %s", exc)
        finally:
            journal.upkeep_done(upkeep, ok=ok)

    def _append_all_pending(self, xids: Iterable[str]) -> None:
        for xid in list(xids):
            try:
                self._append_pending(xid)
            except c.RequestError:
                continue  # logged by _append_pending; still queued
            task = asyncio.ensure_future(self._settle(xid))
            self._background.add(task)
            task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Future[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s", task.exception())

    # --- the timer ---------------------------------------------------------------------------------

    def tick(self) -> None:
        """Reconcile a new mastership once writable; fire due timeouts, fsync/checkpoint the
        journal; only on the writable master."""
        if self.coordinator is None or self.journal is None:
            return
        self._reconcile_if_due()
        if self.refusal() is not None:
            return
        now = self.clock_ms()
        self._start_upkeep(now)
        self._append_when_journaled(list(self._pending))  # markers an earlier failure left queued
        fired = self.coordinator.expire(now)
        for xid, reply in fired:
            log.info("transaction %s timed out: %s", xid, reply.code.name)
        self._write_in_background(fired, now)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.tick()
            except Exception:  # the timer must outlive one bad tick (a full disk, a refused log)
                log.exception("transaction timer")


class TxnStates(Protocol):
    """Where the readers' side finds a partition's transaction state (``Partitions``)."""

    def state(self, topic: str, partition: int) -> "PartitionTxnState": ...


def stable_end(states: TxnStates, topic: str, partition: int, committed: int) -> int:
    """What a consumer may read up to: the last stable offset (LSO).

    min(committed, the state's position, the first offset of the earliest open
    transaction): a record of a transaction that may still roll back is never served.
    """
    state = states.state(topic, partition)
    return state.index.last_stable_offset(committed, state.position)


def aborted_spans(states: TxnStates, topic: str, partition: int, start: int, end: int) -> list[list[int]]:
    """The aborted spans overlapping [start, end), as a fetch reply's ``aborted`` field."""
    index = states.state(topic, partition).index
    if not index.aborted:
        return []
    return [[span.start, span.end] for span in index.aborted_between(start, end)]
