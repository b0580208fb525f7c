"""The master's side of the role machine: winning the lock, taking up a term, handing it back.

Theory of operation
-------------------
The coordinator (coordinator.py) calls in here from the entry actions of ELECTING,
LEADING, HANDING_OVER and RESIGNED (role.py), one at a time on its event worker.

* ``elect``: the election transaction (lock + next epoch, election.try_take_master),
  above every epoch a member's history holds; with the deposal of a dead master's
  session when the death watch proved it (takeover.py). Says WON or LOST.
* ``take_up`` (LEADING, before writes): read and clear the hand-over that was for us;
  stop following; serve the new epoch; fsync every log and then add ``(epoch, log end)``
  to every partition's epoch history, durably (``Partitions.assign_epoch``); record the led epoch;
  re-seed a group whose ZooKeeper lost its data; wait out a deposed master's lease
  (async mode); start the lease and (sync mode) the sync set, published before any ack.
* ``open_for_writes`` (LEADING, last): tell the broker it leads (the transaction service
  reconciles), register as master (producers come), write the takeover record in the
  background, and flush what we inherited as a slave so it is readable at once.
* ``hand_over`` (HANDING_OVER): writes are already refused (node.write_refusal); a task
  watches the target's reported position and posts CAUGHT_UP or ABANDONED.
* ``release_master`` (RESIGNED): stop acking, withdraw the master registration, delete
  the lock (only if our session holds it).
* ``stop``: ack nothing more (the lease goes, waiting sync acks fail, no sync set is
  published again); used by FENCED, RESIGNED, FOLLOWING and STOPPED.

Owns: the lease, the sync set, the hand-over target, the takeover's evidence (what
ZooKeeper showed when we won, the hand-over or dead master acted on), and its tasks
(the catch-up watch, the inherited-log flush), awaited on ``close``.

Invariant: every partition's epoch file is durable before the broker acks as master in
an epoch (``Partitions.assign_epoch`` returns after the fsyncs; the lease, the sync set and the
master role, which let puts in, come after it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from ..owned_tasks import OwnedTasks
from ..zk.group import ZK_CALL_TIMEOUT_S, GroupState
from .election import HANDOVER_TIMEOUT_S, ZK_ERRORS, Deposal, Handover
from .epochs import record_led_epoch
from .failover_record import REASONS, now_ms, write_takeover
from .followership import Followership, MasterSuperseded
from .group_view import GroupView
from .host import BrokerHost
from .lease import ZkLease
from .progress import ReplicationProgress
from .role import Event, Role, catch_up_event
from .sync_set import SyncReplication, SyncTerm
from .takeover import DeadMaster
from .terms import Epochs

log = logging.getLogger(__name__)


class Leadership:
    def __init__(self, host: BrokerHost, view: GroupView, epochs: Epochs, progress: ReplicationProgress,
                 followership: Followership, post: Callable[..., None], role: Callable[[], Role]) -> None:
        self.host = host
        self.view = view
        self.epochs = epochs
        self.progress = progress
        self.followership = followership
        self._post = post
        self._role = role
        self.lease: ZkLease | None = None
        #: The sync set while leading in sync mode (None otherwise).
        self.sync_set: SyncReplication | None = None
        #: The sync set's term when leading last stopped (``_start_sync_set`` resumes it in the same epoch).
        self._last_sync_term: SyncTerm | None = None
        #: The slave the last `metaq promote` hand-over went to (read while HANDING_OVER).
        self.handover_target: int | None = None
        #: The evidence the election in progress (or the epoch just won) deposes a dead master on.
        self.deposing: DeadMaster | None = None
        #: The hand-over request the election in progress acts on (its record says "planned").
        self.electing_on: Handover | None = None
        #: What ZooKeeper said when we won the epoch we are about to lead: its takeover record's
        #: previous epoch and master (failover_record.py). Taken by the first lead of the epoch.
        self._won_from: GroupState | None = None
        #: The epoch we won re-seeds a group whose ZooKeeper lost its data.
        self._reseeding = False
        #: The takeover record ``take_up`` prepared, written by ``open_for_writes``.
        self._takeover: dict[str, Any] | None = None
        #: This broker's stable identity (datadirs.broker_identity), recorded with each epoch it takes.
        self.identity: str | None = None
        self._tasks = OwnedTasks("leadership")

    @property
    def config(self) -> Any:
        return self.host.config

    def start(self) -> None:
        self.lease = ZkLease(self.view.zk, self.config.zk.session_timeout_ms)

    def may_ack(self) -> bool:
        return self.lease is not None and self.lease.valid()

    # --- ELECTING -------------------------------------------------------------------------

    async def elect(self, seen: GroupState, floor: int) -> None:
        """Try the election transaction; post WON or LOST."""
        death_watch = self.followership.death_watch
        try:
            epoch = await self.view.take_master(seen, self.identity, floor, self._deposal())
        except ZK_ERRORS as exc:
            log.warning("election transaction failed: %s", exc)
            epoch = None
        death_watch.forget()  # used: won, lost or stale, it is never acted on twice
        if epoch is None:
            self.deposing = None
            self._post(Event.LOST)
            self._post(Event.REEVALUATE)
            return
        self.epochs.won(epoch)
        self._reseeding = floor > seen.epoch
        self._won_from = seen
        self._post(Event.WON)

    def _deposal(self) -> Deposal | None:
        """The deletion of a dead master's lock the election transaction carries (takeover.py), if any."""
        dead = self.deposing
        if dead is None:
            return None
        sync_member = self.host.registry.slave_id if self.config.replication_mode == "sync" else None
        if sync_member is None and self.config.replication_mode == "sync":
            return None
        return Deposal(dead.session_id, sync_member)

    async def _wait_out_deposed_lease(self) -> None:
        """Async mode, after deposing a dead master's session: ack nothing until its lease would
        have run out (takeover.py: a master that had not yet seen its ZooKeeper connection go
        acks alone in async mode until then). Sync mode needs no wait: its acks need us."""
        dead, self.deposing = self.deposing, None
        if dead is None:
            return
        self.followership.death_watch.fast_takeovers += 1
        log.warning("took over from the dead master at %s without waiting for its session to expire", dead.url)
        if self.config.replication_mode == "sync":
            return
        lease_s = self.config.zk.session_timeout_ms / 2000
        remaining = dead.observed_at + lease_s - time.monotonic()
        if remaining > 0:
            await asyncio.sleep(remaining)

    # --- LEADING --------------------------------------------------------------------------

    async def take_up(self) -> None:
        """Everything before the first ack of the epoch won (see the module's docstring)."""
        host, view, epochs = self.host, self.view, self.epochs
        handover = None
        try:
            handover = await view.read_handover()
            if handover is not None and handover.epoch < epochs.seen:
                await view.clear_handover()  # done: it was for us
        except ZK_ERRORS as exc:
            log.warning("could not clear the hand-over node (%s)", exc)
        # Before unfollow (the lag we last knew) and the deposed-lease wait (which forgets the dead master).
        self._takeover = self._takeover_record(handover or self.electing_on)
        await self.followership.unfollow()
        epoch = epochs.serve()
        # The epoch's start offset is saved durably below: fsync the log it points into
        # first, so that a power loss never leaves an epoch starting past the log we keep.
        began = time.monotonic()
        await self._flush_all()
        flushed = time.monotonic()
        self._give_up_if_stopping("the flush of every log")
        assigned = await host.partitions.assign_epoch(host.config.topics, epoch)
        log.info("epoch %d: every log flushed in %.2f s, %d partitions' epoch histories durable in %.2f s",
                 epoch, flushed - began, assigned, time.monotonic() - flushed)
        self._give_up_if_stopping("the epoch's start in every partition")
        # Durably, before any ack in this epoch: what re-seeds the group if ZooKeeper loses its data.
        await asyncio.to_thread(record_led_epoch, self.config.data_path, epoch)
        epochs.led_in()
        if self._reseeding:
            # Before any producer id is handed out (a reused one would share an old producer's
            # sequence state: its batches taken for duplicates, acked, not stored). A failure
            # fails this entry (ZooKeeper away: fenced, and this runs again on the way back).
            await self._reseed_topic_config()
            await host.restore_after_zookeeper_loss()
            self._reseeding = False
        assert self.lease is not None
        await self._wait_out_deposed_lease()
        self._give_up_if_stopping("the wait for the deposed master's lease")
        await self.lease.start()
        await self._start_sync_set()

    def _give_up_if_stopping(self, step: str) -> None:
        """The broker is stopping (``Followership.give_up``): taking up leading ends after this
        step, not after the whole walk (each step is per partition: seconds at 10,000). Nothing
        was acked in the epoch; what is left is what a kill -9 at this point would leave."""
        if self.followership.stopping:
            raise MasterSuperseded(f"stopped taking up leading after {step}: this broker is stopping")

    async def open_for_writes(self) -> None:
        """Last step of LEADING: producers are told to come only once we take writes."""
        epoch = self.epochs.serving
        self.host.on_leading(epoch)  # the transaction service reconciles (now or once writable)
        # Last: the topic and checksum nodes tell producers to come, so we take
        # writes before they appear.
        await self.host.registry.set_role("master")
        log.info("leading broker group %d in epoch %d", self.view.broker_id, epoch)
        takeover, self._takeover = self._takeover, None
        if takeover is not None:
            # Leading and serving already: the record is history, never on the takeover's path.
            self._won_from = None  # recorded once: a lead entered again in this epoch writes none
            self.view.record_later(f"the takeover record of epoch {epoch}", write_takeover, takeover)
        # What we inherited as a slave may not be fsynced yet; the committed offset of a
        # master alone is its flushed end, so flush now: every acked message we hold is
        # readable at once, not after the next periodic flush.
        self._tasks.spawn(self._flush_all())

    def _takeover_record(self, handover: Handover | None) -> dict[str, Any] | None:
        """What this broker says of the takeover that made it master of the epoch won (None when
        this epoch's lead is entered again, e.g. back from FENCED: it was recorded the first time)."""
        seen = self._won_from
        if seen is None:
            return None
        registry = self.host.registry
        if self._reseeding:
            reason = "reseed"
        elif seen.epoch_version < 0:
            reason = "first_master"
        elif handover is not None and handover.epoch == seen.epoch and handover.slave_id == registry.slave_id:
            reason = "unclean" if handover.unclean else "planned"
        elif self.deposing is not None:
            reason = "fast_takeover"
        else:
            reason = "session_expiry"
        return {
            "epoch": self.epochs.seen, "at_ms": now_ms(), "broker_id": self.view.broker_id, "url": self.view.my_url,
            "slave_id": registry.slave_id, "identity": self.identity, "reason": reason,
            "why": REASONS[reason], "previous_epoch": seen.epoch if seen.epoch_version >= 0 else None,
            "previous_master": seen.leader_url,
            "lag_bytes": self.followership.lag_bytes() if reason != "first_master" else None,
        }

    async def _reseed_topic_config(self) -> None:
        """ZooKeeper lost the group's topic configuration with the rest: write back the topics we serve.

        Every member still serves the version it last applied; without the node, a member
        restarted later would serve its server.ini alone, and a `metaq topics create` would
        write a configuration naming one topic. Seeding (never overwriting) keeps whatever
        another writer put there meanwhile.
        """
        try:
            group = await self.view.seed_topic_config(self.config.topics, self.config.topic_defaults)
        except (*ZK_ERRORS, RuntimeError) as exc:
            log.warning("could not write the group's topic configuration back to ZooKeeper (%s); a broker started"
                        " without --slave seeds it from its server.ini", exc)
            return
        log.info("wrote the group's topic configuration back to ZooKeeper: %s", ", ".join(sorted(group.topics)))

    async def _flush_all(self) -> None:
        store = self.host.store
        # Every flusher looked up before any coroutine exists: a lookup that raises must not
        # leave coroutines created and never awaited.
        flushers = [store.flusher(t, p) for t, p in store.logs()]
        await asyncio.gather(*(flusher.flush_now() for flusher in flushers), return_exceptions=True)

    async def _start_sync_set(self) -> None:
        """On becoming master in sync mode: start the sync set (published before any ack)."""
        config = self.config
        if config.replication_mode != "sync":
            return
        store = self.host.store

        def log_of(topic: str, partition: int) -> Any:
            # Asked several times per put: the open log first, without get_log's checks
            # of the topic's configuration (the sync set only asks about logs it serves).
            found = store.open_log(topic, partition)
            return found if found is not None else store.get_log(topic, partition)

        def log_end(topic: str, partition: int) -> int:
            found = store.open_log(topic, partition)  # ``log_of``, inline: per put, several times
            return (found if found is not None else log_of(topic, partition)).log_end

        self.sync_set = SyncReplication(
            config.min_sync_slaves,
            config.sync_slave_timeout_ms,
            config.on_sync_slave_loss,
            self._publish_sync_set,
            log_end=log_end,
            flushed_end=lambda t, p: log_of(t, p).flushed_end,
            partitions=lambda: list(store.logs()),
            # Only positions reported in this term count (progress outlives terms).
            position=lambda slave_id, t, p: self.progress.position(slave_id, t, p, epoch=self.epochs.serving),
            on_committed=self.host.notify_committed,  # a slave's parked fetch waits for appends only
            # Committed never stops inside a batch (idempotent/transactional put).
            batch_boundary=self.host.partitions.batch_boundary,
            # Each partition's sync state lives in its replication record (ha/record.py).
            records=self.host.partitions,
        )
        # Back from FENCED with the same session, so the same epoch: the term goes on with the
        # members this master published in it (SyncTerm says why that is safe).
        last, self._last_sync_term = self._last_sync_term, None
        serving = self.epochs.serving
        await self.sync_set.start(resume=last if last is not None and last.epoch == serving else None)
        log.info(
            "sync replication: acks wait for the sync set (minSyncSlaves=%d, syncSlaveTimeoutMs=%d, onSyncSlaveLoss=%s)",
            config.min_sync_slaves,
            config.sync_slave_timeout_ms,
            config.on_sync_slave_loss,
        )

    async def _publish_sync_set(self, members: frozenset[int]) -> None:
        """Write the sync set to ZooKeeper (persistent: failover reads it after we are gone)."""
        config = self.config
        await asyncio.wait_for(
            self.view.publish_sync_set(self.epochs.serving, members, config.min_sync_slaves),
            config.sync_slave_timeout_ms / 1000 + 5,
        )

    # --- HANDING_OVER and RESIGNED --------------------------------------------------------

    def hand_over(self, handover: Handover) -> None:
        """HANDING_OVER (``metaq promote``): writes are paused; watch the target catch up.

        Writes are refused (503, nothing stored) from now on (node.write_refusal), so the
        log ends stop moving; once the target's reported position reaches every log end it
        holds every acked message: CAUGHT_UP, and RESIGNED releases the master node. Only
        the target may elect (election.eligibility reads the hand-over node), and it wins
        the next epoch.
        """
        self.handover_target = handover.slave_id
        log.warning("handing broker group %d over to slave %d (metaq promote): writes paused",
                    self.view.broker_id, handover.slave_id)
        self._tasks.spawn(self._watch_catch_up(handover.slave_id))

    async def _watch_catch_up(self, slave_id: int) -> None:
        """Post CAUGHT_UP once ``slave_id`` holds every log end; ABANDONED (the hand-over node
        cleared, writes resume) after HANDOVER_TIMEOUT_S or once we left HANDING_OVER."""
        paused_at = time.monotonic()
        store = self.host.store
        while True:
            behind = [
                (t, p) for (t, p), l in store.logs().items()
                if (self.progress.position(slave_id, t, p, epoch=self.epochs.serving) or 0) < l.log_end
            ]
            event = catch_up_event(self._role(), bool(behind), time.monotonic() - paused_at, HANDOVER_TIMEOUT_S)
            if event is Event.CAUGHT_UP:
                log.warning("slave %d holds our whole log after %.0f ms; releasing the master lock",
                            slave_id, (time.monotonic() - paused_at) * 1000)
                self._post(event)
                return
            if event is Event.ABANDONED:
                log.error("hand-over to slave %d abandoned: it did not catch up on %s within %.0fs; writes resume",
                          slave_id, behind[:3], HANDOVER_TIMEOUT_S)
                try:
                    await self.view.clear_handover()
                except ZK_ERRORS as exc:
                    log.warning("could not clear the hand-over node (%s)", exc)
                self._post(event)
                return
            await asyncio.sleep(0.002)

    async def release_master(self) -> None:
        """Stop acking, withdraw our master registration and give the lock back."""
        await self.stop()
        try:
            await self.host.registry.set_role(None)
            await self.view.release_lock()
        except ZK_ERRORS as exc:
            log.error("could not release the master lock (%s); it goes when our session ends", exc)

    async def give_back_unused_lock(self) -> bool:
        """Delete the master node if this session holds it while this broker does not lead.

        Invariant: a master node held by our live session is acted on by this broker (it
        leads, is fenced or hands over) or deleted. Such a node never expires by itself, so
        waiting for it to go left a group without a master for good (chaos campaign, seed
        3002): a session expiry seen late (SESSION_LOST, queued while the election ran on the
        new session) moved ELECTING to ORPHANED after the election had taken the lock, and
        the WON behind it is ignored there. Not in ELECTING itself: its WON may be queued.
        A lock given back (RESIGNED) whose delete failed is retried here too.
        """
        try:
            released = await self.view.release_lock()
        except ZK_ERRORS as exc:
            log.warning("could not give back the master node this session holds (%s); trying again", exc)
            return False
        if released:
            log.warning("gave back the master lock this session held while %s (a session event seen late); "
                        "a new election follows", self._role().value)
        return released

    # --- the end of a term ----------------------------------------------------------------

    async def stop(self) -> None:
        """Ack nothing more: drop the lease, fail waiting sync acks, publish no sync set again."""
        self.host.on_resigned()
        if self.lease is not None:
            await self.lease.stop()
        sync_set, self.sync_set = self.sync_set, None
        if sync_set is not None:
            self._last_sync_term = sync_set.term(self.epochs.serving)
            await sync_set.stop()

    async def close(self) -> None:
        """Broker stop: the term is over (``stop`` ran); await the tasks it left (the catch-up
        watch ends at once outside HANDING_OVER, the flush when its fsyncs return), cancelling
        any still running after ZK_CALL_TIMEOUT_S."""
        await self._tasks.stop(ZK_CALL_TIMEOUT_S)

    def forget_partitions(self, keys: list[tuple[str, int]]) -> None:
        if self.sync_set is not None:
            self.sync_set.forget_partitions(keys)
