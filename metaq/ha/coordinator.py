"""Drives the role state machine (role.py) from ZooKeeper and carries out each role.

One task processes events one at a time (``_events``), so the entry actions of
a state (truncation, election, registration changes) never interleave. Events
come from ZooKeeper watches (master znode, epoch znode), from the registry's
session listener, and from the coordinator itself (after an election, or when
an orphaned slave finds it may take over). Every decision about them is a row
of role.py's table; an observation whose event depends on the state at the
time it is processed (which master we follow, whether ZooKeeper still names us
after a reconnect) is classified then, in order, by role.py's pure functions.

Entry actions:

* FOLLOWING(url): register as ``slave{k}``; per partition, ask the master where
  our last epoch ends in its log and truncate there (the removed tail is kept
  in a ``truncated-*`` file); copy the master's epoch history; follow.
* ORPHANED: stop following (reads stay up); check the election rules; if
  eligible, send ELIGIBLE.
* ELECTING: the ZooKeeper transaction (lock + next epoch); WON or LOST.
* LEADING: add ``(epoch, log end)`` to every partition's epoch checkpoint,
  register as master, start the lease and (sync mode) the sync set, then take
  writes.
* HANDING_OVER (``metaq promote``): writes are refused from the first moment
  (node.write_refusal); a watch of the target's position posts CAUGHT_UP once it
  holds every log end, or ABANDONED (the hand-over node cleared) after
  HANDOVER_TIMEOUT_S or when we leave the state. It only observes and posts: the
  lock is given back by RESIGNED's entry action, on the event worker.
* RESIGNED: stop acking, withdraw the master registration and delete the lock
  (the hand-over's target, or anyone eligible, takes the next epoch).
* FENCED: stop acking at once (the lease is dropped; waiting sync acks fail
  with "unknown outcome").

Ownership: the coordinator alone creates, starts and stops the lease, the sync
set (sync_set.py) and the follower (follower.py), and it alone moves the epoch
this broker serves in (``serving_epoch``). Each is started in one entry action
and stopped in one method (``_stop_leading``, ``_stop_following``); the broker
sees them only through the HA facade (node.py). The registry registers
whatever role the coordinator's entry actions give it (``set_role``): the
coordinator is its one writer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable, Union

from ..client.connection import BrokerConnection, ConnectionClosed
from ..config import BrokerConfig, SlaveConfig
from ..protocol.messages import EpochsRequest
from ..store.datadirs import broker_identity
from ..zk.group import ZK_CALL_TIMEOUT_S, GroupState, read_group_state
from ..zk.paths import ZkPaths, decode_epoch, slave_node_id
from ..zk.topic_config import seed_with, update_group_topics
from .candidacy import Candidacy
from .election import (
    HANDOVER_TIMEOUT_S,
    ZK_ERRORS,
    Deposal,
    Handover,
    clear_handover,
    decode_handover,
    eligibility,
    publish_sync_set,
    read_handover,
    try_take_master,
)
from .epochs import EpochCache, read_led_epoch, record_led_epoch, save_all
from .failover_record import REASONS, now_ms, write_takeover, write_truncation
from .follower import MasterFollower
from .host import BrokerHost
from .lease import ZkLease
from .peers import open_peer
from .progress import ReplicationProgress
from .role import (
    HOLDS_LOCK,
    Event,
    Role,
    RoleMachine,
    catch_up_event,
    entry_failed_event,
    handover_event,
    master_event,
    reconnected_event,
)
from .sync_set import SyncReplication, SyncTerm
from .takeover import DeadMaster, DeathWatch, answer_challenges
from .truncation import divergence_point

log = logging.getLogger(__name__)

#: A broker that failed to take up leading may try again this long after (``_step_down``).
CANNOT_LEAD_RETRY_S = 30.0

#: A queued event, or how to decide it when its turn comes.
Pending = Union[Event, Callable[[], Awaitable[Event]]]

__all__ = ["HaCoordinator", "ZK_ERRORS"]


class HaCoordinator:
    @property
    def config(self) -> BrokerConfig:
        """The broker's configuration now (never a copy: a reload replaces it, metaq/server/live_config.py)."""
        return self.host.config

    def __init__(self, host: BrokerHost, slave: SlaveConfig | None, progress: ReplicationProgress) -> None:
        self.host = host
        self.progress = progress
        self.prefers_master = slave is None
        self.slave_template = slave
        self.machine = RoleMachine()
        self.paths = ZkPaths(self.config.zk.root)
        self.broker_id = self.config.broker_id
        #: The newest epoch seen in ZooKeeper (or won).
        self.epoch = 0
        #: The last election verdict logged, (may take over, why): each is logged once.
        self._last_verdict: tuple[bool, str | None] | None = None
        #: The epoch this broker leads or follows in: put replies and replica fetches carry it.
        self.serving_epoch = 0
        self.followed_epoch = 0
        #: The newest epoch this broker led (its led-epoch file; 0: none). A partition whose
        #: newest epoch is this one may end in writes of ours no slave has (HaNode.committed).
        self.led_epoch = 0
        self.master_url: str | None = None
        self.last_transition_at = time.time()
        self.truncations: list[dict[str, Any]] = []
        self._events: asyncio.Queue[tuple[Pending, Any]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self.lease: ZkLease | None = None
        #: The sync set while leading in sync mode (None otherwise).
        self.sync_set: SyncReplication | None = None
        #: The sync set's term when leading last stopped (``_start_sync_set`` resumes it in the same epoch).
        self._last_sync_term: SyncTerm | None = None
        #: The replication follower, created the first time this broker follows.
        self.follower: MasterFollower | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flushing: asyncio.Future[None] | None = None
        #: Why this broker may not lead (it failed to take up leading), or None.
        self.cannot_lead: str | None = None
        self._cannot_lead_at = 0.0
        #: This broker's stable identity (datadirs.broker_identity), recorded with each epoch it takes.
        self.identity: str | None = None
        #: Our standing among the slaves (or members) that may take over, while orphaned.
        self.candidacy = Candidacy(host, self.paths, self._look_again_in)
        #: The slave the last `metaq promote` hand-over went to (read while HANDING_OVER).
        self.handover_target: int | None = None
        #: Watches the hand-over's target catch up (posts CAUGHT_UP or ABANDONED).
        self._catch_up: asyncio.Future[None] | None = None
        #: The last "not following a master below our history" line logged (each is logged once).
        self._refused_master: str | None = None
        #: The epoch we won re-seeds a group whose ZooKeeper lost its data.
        self._reseeding = False
        #: Set by stop(): entry actions waiting on a peer give up instead of holding STOP back.
        self._stopping = False
        #: Watches the master we follow for the death of its process (takeover.py): on complete
        #: evidence, an orphan may depose the dead session's lock instead of waiting for its expiry.
        self.death_watch = DeathWatch(host, self.paths, on_dead=lambda: self.post(Event.MASTER_GONE))
        #: The evidence the election in progress (or the epoch just won) deposes a dead master on.
        self._deposing: DeadMaster | None = None
        #: What ZooKeeper said when we won the epoch we are about to lead: its takeover record's
        #: previous epoch and master (failover_record.py). Taken by the first _lead of the epoch.
        self._won_from: GroupState | None = None
        #: The hand-over request the election in progress acts on (its record says "planned").
        self._electing_on: Handover | None = None
        #: Takeover and truncation records are written one at a time, in order, off the critical path.
        self._records = asyncio.Lock()
        self._record_tasks: set[asyncio.Task[None]] = set()

    # --- wiring -----------------------------------------------------------------------

    @property
    def registry(self) -> Any:
        return self.host.registry

    @property
    def zk(self) -> Any:
        return self.registry.client

    @property
    def my_url(self) -> str:
        return self.registry.url

    @property
    def state(self) -> Role:
        return self.machine.state

    def may_ack(self) -> bool:
        return self.machine.may_ack_writes and self.lease is not None and self.lease.valid()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.identity = await asyncio.to_thread(broker_identity, self.config.data_path)
        self.led_epoch = await asyncio.to_thread(read_led_epoch, self.config.data_path)
        self.candidacy.identity = self.identity
        self.lease = ZkLease(self.zk, self.config.zk.session_timeout_ms)
        registry = self.registry
        registry.on_session_suspended = lambda: self.post(Event.SUSPENDED)
        registry.on_session_lost = lambda: self.post(Event.SESSION_LOST)
        registry.on_connected = self._on_connected
        self._worker = asyncio.ensure_future(self._run())
        await asyncio.to_thread(self.zk.DataWatch, self.paths.master(self.broker_id), self._zk_watch(self._master_changed))
        await asyncio.to_thread(self.zk.DataWatch, self.paths.epoch(self.broker_id), self._zk_watch(self._epoch_changed))
        await asyncio.to_thread(self.zk.DataWatch, self.paths.handover(self.broker_id), self._zk_watch(self._handover_changed))
        # While our session may hold the lock (fenced too), we answer a slave's challenge
        # (takeover.py): a live master is never deposed on the evidence of a dead one.
        answers_in = HOLDS_LOCK | {Role.FENCED}
        await asyncio.to_thread(answer_challenges, self.zk, self.paths, self.broker_id, lambda: self.machine.state in answers_in)

    async def stop(self) -> None:
        # Seen by entry actions that wait on a peer (_truncate_against): they give up at
        # once, so STOP is handled next instead of after their own deadline.
        self._stopping = True
        self.post(Event.STOP)
        if self._worker is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._worker), 10)
            except asyncio.TimeoutError:
                self._worker.cancel()
        await self._stop_leading()  # the STOPPED entry action did this unless the worker hung
        await self._stop_following()

    def refollow(self) -> None:
        """The master and we disagree on the epoch: look at ZooKeeper again and re-sync."""
        self.post(Event.STALE_MASTER)

    def post(self, event: Pending, detail: Any = None) -> None:
        self._events.put_nowait((event, detail))

    def _post_master(self, url: str) -> None:
        """The master znode names ``url`` (another broker): SEEN or CHANGED, decided in turn."""

        async def decide() -> Event:
            if await self.death_watch.names_dead_session(url) is not None:
                return Event.MASTER_SEEN  # ignored in every state: its process died (takeover.py)
            event = master_event(url, self.master_url)
            if event is Event.MASTER_CHANGED and await self._names_previous_life(url):
                return Event.REEVALUATE  # not a master to follow: wait for its node to expire
            if event is Event.MASTER_CHANGED and await self._master_below_history(url):
                self._look_again_in(1.0)
                return Event.MASTER_SEEN  # ignored in every state: not a master to follow
            return event

        self.post(decide, url)

    async def _reconnected(self) -> Event:
        try:
            state = await asyncio.to_thread(read_group_state, self.zk, self.paths, self.broker_id)
        except ZK_ERRORS as exc:
            # Unanswered is not "lost": a server losing its quorum accepts our session and
            # drops it again before the read. Giving up the epoch here made a master whose
            # session lived through a quorum loss re-register as a slave (reads stopped,
            # then a new epoch). Stay as we are and look again: FENCED acks nothing, and an
            # expired session still ends our epoch through SESSION_LOST.
            log.warning("reconnected, but ZooKeeper did not answer (%s); looking again", str(exc) or type(exc).__name__)
            return Event.REEVALUATE
        return reconnected_event(state.epoch, state.master_url, self.epoch, self.my_url)

    def _zk_watch(self, handler: Any) -> Any:
        def watcher(data: bytes | None, _stat: Any, *_: Any) -> bool:
            loop = self._loop
            if loop is None or loop.is_closed() or self.machine.state is Role.STOPPED:
                return False
            loop.call_soon_threadsafe(handler, data)
            return True

        return watcher

    def _master_changed(self, data: bytes | None) -> None:
        url = data.decode("utf-8") if data else None
        if url is None:
            self.post(Event.MASTER_GONE)
        elif url != self.my_url:
            self._post_master(url)

    def _handover_changed(self, data: bytes | None) -> None:
        handover = decode_handover(data) if data else None
        if handover is not None:
            self.post(handover_event(handover.epoch, handover.unclean, self.serving_epoch), handover)

    def _epoch_changed(self, data: bytes | None) -> None:
        if not data:
            return
        epoch, leader = decode_epoch(data)
        if epoch > self.epoch:
            # Only LEADING reacts (it fences, and says so); elsewhere the row ignores it.
            log.debug("epoch %d (leader %s) is newer than ours (%d)", epoch, leader, self.epoch)
            self.post(Event.HIGHER_EPOCH)

    def _on_connected(self, new_session: bool) -> None:
        if new_session:
            # Our lock (if we held it) died with the old session.
            self.post(Event.SESSION_LOST)
            self.post(Event.MASTER_GONE)
        else:
            self.post(self._reconnected)
        self.post(Event.REEVALUATE)

    # --- the event loop ------------------------------------------------------------------

    async def _run(self) -> None:
        await self._evaluate()
        while True:
            pending, detail = await self._events.get()
            event = pending if isinstance(pending, Event) else await pending()
            before = self.machine.state
            step = self.machine.handle(event)
            if step is None:
                continue  # ignored: not a row of the table
            if step.look_again:
                if event is Event.STALE_MASTER:
                    self.master_url = None  # so the master we see next counts as changed: re-sync
                await self._evaluate()
                continue
            new = step.state
            self.last_transition_at = time.time()
            # Re-entries (an orphan looking again while waiting its turn) would flood the log.
            log.log(logging.DEBUG if new is before else logging.INFO, "role: %s --%s--> %s", before.value, event.value, new.value)
            if not step.enter:
                continue  # back to a state whose work is still in place (an abandoned hand-over)
            try:
                await self._enter(new, detail)
            except Exception as exc:
                await self._entry_failed(new, exc)
                self.post(Event.REEVALUATE)
            if new is Role.STOPPED:
                return

    async def _entry_failed(self, role: Role, exc: Exception) -> None:
        """An entry action raised: tell a blip of ZooKeeper from a broker that cannot serve
        (role.entry_failed_event decides; stepping down for a ZooKeeper blip once left a
        group with no master at all)."""
        event = entry_failed_event(role, isinstance(exc, ZK_ERRORS))
        if event is Event.SUSPENDED:
            log.warning("ZooKeeper went away while taking up leading (%s); fenced until it answers",
                        str(exc) or type(exc).__name__)
            self.post(event)
        elif event is Event.CANNOT_LEAD:
            self._step_down(exc)
        else:
            log.exception("entering %s failed; re-evaluating", role.value)
            if role is Role.FOLLOWING:
                # Forget the master, so that the next look sees it as changed and follows it
                # again: otherwise it counts as the one we already follow, and the broker
                # stays a slave that replicates nothing (seen after a failed truncation check).
                self.master_url = None
            await asyncio.sleep(0.2)

    async def _read_state(self) -> GroupState | None:
        """The group's state in ZooKeeper; None (and a re-evaluation queued) if it cannot be read."""
        try:
            return await asyncio.to_thread(read_group_state, self.zk, self.paths, self.broker_id)
        except ZK_ERRORS as exc:
            log.warning("cannot read the group's state from ZooKeeper (%s); retrying", exc)
            await asyncio.sleep(0.2)
            self.post(Event.REEVALUATE)
            return None

    async def _evaluate(self) -> None:
        """Look at ZooKeeper afresh and post what we see."""
        state = await self._read_state()
        if state is None:
            return
        self.epoch = max(self.epoch, state.epoch)
        if state.master_url is None:
            self.post(Event.MASTER_GONE)
        elif state.master_url == self.my_url or self._previous_life(state):
            if self.machine.state is Role.FENCED:
                # Fenced while our lock still stands (a claimed epoch, a blip): ZooKeeper
                # decides whether we still lead our epoch, as after a reconnect.
                self.post(self._reconnected)
            elif self.machine.state not in HOLDS_LOCK:
                if self.machine.state is not Role.ELECTING and await self._give_back_unused_lock():
                    return  # its deletion shows as MASTER_GONE: an election follows
                # Our own node from a previous life (kill -9, quick restart) goes with that
                # session: wait it out.
                log.info("the master node still names this broker (a previous run, or a lock given back); waiting for it to go")
                await asyncio.sleep(0.5)
                self.post(Event.REEVALUATE)
        else:
            self._post_master(state.master_url)

    async def _master_below_history(self, url: str) -> bool:
        """Whether the master at ``url`` leads an epoch older than our own history.

        Invariant: a broker never truncates against a master whose epoch is below its own
        newest epoch. Such a master took the lock from a ZooKeeper that lost its data, without
        this broker's claim (it was down): its log may lack messages acked in our newer
        epochs, and following would cut them from ours. We stay as we are (reads served) and
        say so once; the operator decides (docs/operations.md, "Losing ZooKeeper's data").
        """
        state = await self._read_state()
        history = self.history
        if state is None or state.master_url != url or history <= state.epoch:
            self._refused_master = None
            return False
        if self._refused_master != url:
            self._refused_master = url
            log.error(
                "not following the master at %s: it leads epoch %d, older than epoch %d in this broker's history"
                " (ZooKeeper lost its data and the group was re-seeded without this broker): following would cut"
                " messages only this broker may hold; see docs/operations.md, \"Losing ZooKeeper's data\"",
                url, state.epoch, history,
            )
        return True

    async def _names_previous_life(self, url: str) -> bool:
        state = await self._read_state()
        return state is not None and state.master_url == url and self._previous_life(state)

    def _previous_life(self, state: GroupState) -> bool:
        """The registered master is this broker's previous run on another address (its
        session has not expired yet): recognised by the identity recorded with its epoch."""
        return (
            self.machine.state not in HOLDS_LOCK
            and state.master_url == state.leader_url
            and state.leader_identity is not None
            and state.leader_identity == self.identity
        )

    # --- entry actions --------------------------------------------------------------------

    async def _enter(self, role: Role, detail: Any) -> None:
        if role is Role.FOLLOWING:
            await self._become_follower(detail)
        elif role is Role.ORPHANED:
            await self._become_orphan()
        elif role is Role.ELECTING:
            await self._elect(detail)
        elif role is Role.LEADING:
            await self._lead()
        elif role is Role.HANDING_OVER:
            self._hand_over(detail)
        elif role is Role.RESIGNED:
            await self._resign()
        elif role is Role.FENCED:
            await self._fence()
        elif role is Role.STOPPED:
            await self._shutdown()

    def _step_down(self, exc: Exception) -> None:
        """We won the lock but cannot serve (a log that cannot open, say): give the lock back.

        Invariant: the master lock is held only by a broker that serves its group. A
        broker that failed to take up leading does not try again for CANNOT_LEAD_RETRY_S,
        so the group is left to an eligible slave instead of a master that serves nothing.
        Then it may try once more: a cause that passed (seen: kazoo's "xids do not match"
        from a connection reset mid-call, a checkpoint race) must not leave a group whose
        only eligible broker is this one without a master for good.
        CANNOT_LEAD moves us to RESIGNED, whose entry action releases the lock.
        """
        self.cannot_lead = f"{type(exc).__name__}: {exc}"
        self._cannot_lead_at = time.monotonic()
        log.error(
            "cannot lead broker group %d: %s; releasing the master lock (this broker will not take over"
            " again for %.0f s)", self.broker_id, self.cannot_lead, CANNOT_LEAD_RETRY_S,
        )
        self._look_again_in(CANNOT_LEAD_RETRY_S)
        self.post(Event.CANNOT_LEAD)

    def _cannot_lead_now(self) -> str | None:
        """Why this broker may not lead now (``_step_down``), or None once the wait is over."""
        if self.cannot_lead is not None and time.monotonic() - self._cannot_lead_at >= CANNOT_LEAD_RETRY_S:
            log.warning("this broker may try to lead again: it failed %.0f s ago (%s)",
                        time.monotonic() - self._cannot_lead_at, self.cannot_lead)
            self.cannot_lead = None
        return self.cannot_lead

    def _hand_over(self, handover: Handover) -> None:
        """HANDING_OVER (``metaq promote``): writes are paused; watch the target catch up.

        Writes are refused (503, nothing stored) from now on (node.write_refusal), so the
        log ends stop moving; once the target's reported position reaches every log end it
        holds every acked message: CAUGHT_UP, and RESIGNED releases the master node. Only
        the target may elect (election.eligibility reads the hand-over node), and it wins
        the next epoch.
        """
        self.handover_target = handover.slave_id
        log.warning("handing broker group %d over to slave %d (metaq promote): writes paused", self.broker_id, handover.slave_id)
        self._catch_up = asyncio.ensure_future(self._watch_catch_up(handover.slave_id))

    async def _watch_catch_up(self, slave_id: int) -> None:
        """Post CAUGHT_UP once ``slave_id`` holds every log end; ABANDONED (the hand-over node
        cleared, writes resume) after HANDOVER_TIMEOUT_S or once we left HANDING_OVER."""
        paused_at = time.monotonic()
        store = self.host.store
        while True:
            behind = [
                (t, p) for (t, p), l in store.logs().items()
                if (self.progress.position(slave_id, t, p, epoch=self.serving_epoch) or 0) < l.log_end
            ]
            event = catch_up_event(self.machine.state, bool(behind), time.monotonic() - paused_at, HANDOVER_TIMEOUT_S)
            if event is Event.CAUGHT_UP:
                log.warning("slave %d holds our whole log after %.0f ms; releasing the master lock",
                            slave_id, (time.monotonic() - paused_at) * 1000)
                self.post(event)
                return
            if event is Event.ABANDONED:
                log.error("hand-over to slave %d abandoned: it did not catch up on %s within %.0fs; writes resume",
                          slave_id, behind[:3], HANDOVER_TIMEOUT_S)
                try:
                    await asyncio.to_thread(clear_handover, self.zk, self.paths, self.broker_id)
                except ZK_ERRORS as exc:
                    log.warning("could not clear the hand-over node (%s)", exc)
                self.post(event)
                return
            await asyncio.sleep(0.002)

    async def _resign(self) -> None:
        """RESIGNED: give the lock back; ZooKeeper shows next who leads."""
        await self._release_master()
        self.post(Event.REEVALUATE)

    async def _release_master(self) -> None:
        """Stop acking, withdraw our master registration and give the lock back."""
        await self._stop_leading()
        try:
            await self.registry.set_role(None)
            await asyncio.to_thread(self._release_lock)
        except ZK_ERRORS as exc:
            log.error("could not release the master lock (%s); it goes when our session ends", exc)

    def _release_lock(self) -> bool:
        """Delete the master node if our session holds it (never another broker's); whether it did."""
        path = self.paths.master(self.broker_id)
        stat = self.zk.exists_async(path).get(timeout=ZK_CALL_TIMEOUT_S)
        if stat is not None and stat.ephemeralOwner == self.registry.session_id:
            self.zk.delete_async(path, version=stat.version).get(timeout=ZK_CALL_TIMEOUT_S)
            return True
        return False

    async def _give_back_unused_lock(self) -> bool:
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
            released = await asyncio.to_thread(self._release_lock)
        except ZK_ERRORS as exc:
            log.warning("could not give back the master node this session holds (%s); trying again", exc)
            return False
        if released:
            log.warning("gave back the master lock this session held while %s (a session event seen late); "
                        "a new election follows", self.machine.state.value)
        return released

    async def _fence(self) -> None:
        await self._stop_leading()
        log.warning("fenced: this broker acks no writes until ZooKeeper confirms it still leads epoch %d", self.epoch)
        # The same session may come back with our epoch (RECONNECTED_SAME_EPOCH) or not.
        self.post(Event.REEVALUATE)

    async def _shutdown(self) -> None:
        await self._stop_leading()
        await self._stop_following()

    async def _stop_leading(self) -> None:
        """Ack nothing more: drop the lease, fail waiting sync acks, publish no sync set again."""
        self.host.on_resigned()
        if self.lease is not None:
            await self.lease.stop()
        sync_set, self.sync_set = self.sync_set, None
        if sync_set is not None:
            self._last_sync_term = sync_set.term(self.serving_epoch)
            await sync_set.stop()

    async def _stop_following(self) -> None:
        self.death_watch.unwatch()
        if self.follower is not None:
            await self.follower.stop()

    async def _unfollow(self) -> None:
        """Stop replicating (reads stay up): nothing may append while we truncate or lead."""
        self.death_watch.unwatch()
        if self.follower is not None:
            await self.follower.unfollow()

    async def _become_orphan(self) -> None:
        await self._unfollow()
        self.master_url = None
        if not await self._consider_election():
            # Not taking over: be visible as a slave, so consumers can read what we have.
            await self._ensure_slave_registration()

    async def _consider_election(self) -> bool:
        """Post ELIGIBLE (and return True) if the election rules let us try to take over."""
        state = await self._read_state()
        if state is None:
            return False
        dead = None if state.master_url is None else await self.death_watch.names_dead_session(state.master_url)
        if dead is not None:
            # Its process died (takeover.py): the election rules apply as if its session had expired.
            state = replace(state, master_url=None)
        elif state.master_url is not None:
            if state.master_url != self.my_url:
                self._post_master(state.master_url)
            return False
        follower = self.follower
        healthy = follower is None or not any(r.stopped for r in follower.replicas.values())
        try:
            handover = await asyncio.to_thread(read_handover, self.zk, self.paths, self.broker_id)
        except ZK_ERRORS:
            handover = None
        if handover is not None and handover.epoch != state.epoch:
            handover = None  # a stale request, for an earlier master
        history = self.history
        led_history = history > 0 and await asyncio.to_thread(read_led_epoch, self.config.data_path) == history
        candidacy = self.candidacy
        claims = await candidacy.post_reseed_claim(state, history, led_history)
        if claims is None:
            return False  # ZooKeeper did not answer; a re-evaluation is scheduled
        ok, why = eligibility(
            mode=self.config.replication_mode,
            auto_failover=self.config.auto_failover,
            my_url=self.my_url,
            my_identity=self.identity,
            my_slave_id=self.registry.slave_id,
            prefers_master=self.prefers_master,
            followed_epoch=self.followed_epoch,
            replicas_healthy=healthy,
            state=state,
            cannot_lead=self._cannot_lead_now(),
            handover=handover,
            history=history,
            led_history=led_history,
        )
        if handover is None and ok and history > state.epoch:
            ok, why = candidacy.reseed_turn(history, led_history, claims, why)
            if why is None:
                return False  # waiting for the other members' claims; a re-evaluation is scheduled
        elif handover is None and candidacy.ranks_candidates(state, self.config.replication_mode):
            ok, why = await candidacy.candidate(state, ok, why)
            if why is None:
                return False  # waiting for our turn; a re-evaluation is scheduled
        # Each decision is logged once: an orphan re-evaluates on every ZooKeeper event, and
        # the same verdict again tells the operator nothing new.
        repeated = (ok, why) == self._last_verdict
        self._last_verdict = (ok, why)
        self._deposing = dead if ok else None
        self._electing_on = handover if ok else None
        if ok and dead is not None:
            why = f"{why}; the master's process at {dead.url} died (fast takeover)"
        if ok:
            log.log(logging.DEBUG if repeated else logging.INFO, "may take over: %s", why)
            self.post(Event.ELIGIBLE, state)
        else:
            log.log(logging.DEBUG if repeated else logging.WARNING, "not taking over: %s; %s", why, self._recovery_hint(state, history))
            if dead is not None:
                # Evidence we may not act on is dropped: kept, it made every event naming that
                # session "its process died" (ignored), so a master that was alive after all (a
                # challenge answered late on a busy machine) was never followed again and this
                # slave stayed an orphan for good. Its session's expiry, if it did die, comes as
                # the master node's deletion like any other.
                self.death_watch.forget()
                log.log(logging.DEBUG if repeated else logging.INFO,
                        "the master at %s is followed again until ZooKeeper says otherwise", dead.url)
                self._post_master(dead.url)
        return ok

    def _recovery_hint(self, state: GroupState, history: int) -> str:
        """How an operator gets a group without an eligible broker going again."""
        slave_id = self.registry.slave_id
        who = f"--slave {slave_id}" if slave_id is not None else "--slave K"
        if history > state.epoch:
            return (
                f"start every member of the group; if the broker that led epoch {history} is gone for good, elect the"
                f" member with the newest history with `metaq promote --zk ZK --broker-id {self.broker_id} {who} --unclean`"
                " (docs/operations.md, \"Losing ZooKeeper's data\")"
            )
        if state.epoch_version < 0:
            return "start a broker of this group without --slave to found it"
        return (
            f"to recover, start the last master ({state.leader_url}, with its data dir) again, or elect this broker"
            f" with `metaq promote --zk ZK --broker-id {self.broker_id} {who} --unclean` (it may lose acked messages)"
        )

    def _look_again_in(self, seconds: float) -> None:
        asyncio.get_running_loop().call_later(seconds, self.post, Event.REEVALUATE)

    async def _elect(self, seen: GroupState) -> None:
        try:
            # Above every epoch a member's history holds (ZooKeeper may have lost them): the
            # epoch checkpoints of the new term must grow past every member's.
            floor = max(self.history, self.candidacy.newest_claimed)
            epoch = await asyncio.to_thread(
                try_take_master, self.zk, self.paths, self.broker_id, self.my_url, seen, self.identity, floor,
                self._deposal(),
            )
        except ZK_ERRORS as exc:
            log.warning("election transaction failed: %s", exc)
            epoch = None
        self.death_watch.forget()  # used: won, lost or stale, it is never acted on twice
        if epoch is None:
            self._deposing = None
            self.post(Event.LOST)
            self.post(Event.REEVALUATE)
            return
        self.epoch = epoch
        self._reseeding = floor > seen.epoch
        self._won_from = seen
        self.post(Event.WON)

    def _deposal(self) -> Deposal | None:
        """The deletion of a dead master's lock the election transaction carries (takeover.py), if any."""
        dead = self._deposing
        if dead is None:
            return None
        sync_member = self.registry.slave_id if self.config.replication_mode == "sync" else None
        if sync_member is None and self.config.replication_mode == "sync":
            return None
        return Deposal(dead.session_id, sync_member)

    async def _wait_out_deposed_lease(self) -> None:
        """Async mode, after deposing a dead master's session: ack nothing until its lease would
        have run out (takeover.py: a master that had not yet seen its ZooKeeper connection go
        acks alone in async mode until then). Sync mode needs no wait: its acks need us."""
        dead, self._deposing = self._deposing, None
        if dead is None:
            return
        self.death_watch.fast_takeovers += 1
        log.warning("took over from the dead master at %s without waiting for its session to expire", dead.url)
        if self.config.replication_mode == "sync":
            return
        lease_s = self.config.zk.session_timeout_ms / 2000
        remaining = dead.observed_at + lease_s - time.monotonic()
        if remaining > 0:
            await asyncio.sleep(remaining)

    async def _lead(self) -> None:
        host = self.host
        await self.candidacy.withdraw()
        handover = None
        try:
            handover = await asyncio.to_thread(read_handover, self.zk, self.paths, self.broker_id)
            if handover is not None and handover.epoch < self.epoch:
                await asyncio.to_thread(clear_handover, self.zk, self.paths, self.broker_id)  # done: it was for us
        except ZK_ERRORS as exc:
            log.warning("could not clear the hand-over node (%s)", exc)
        # Before _unfollow (the lag we last knew) and the deposed-lease wait (which forgets the dead master).
        takeover = self._takeover_record(handover or self._electing_on)
        await self._unfollow()
        self.serving_epoch = self.epoch
        # The epoch's start offset is saved durably below: fsync the log it points into
        # first, so that a power loss never leaves an epoch starting past the log we keep.
        await self._flush_all()
        await assign_epoch(host.store, host.partitions, host.config.topics, self.epoch)
        # Durably, before any ack in this epoch: what re-seeds the group if ZooKeeper loses its data.
        await asyncio.to_thread(record_led_epoch, self.config.data_path, self.epoch)
        self.led_epoch = self.epoch
        if self._reseeding:
            # Before any producer id is handed out (a reused one would share an old producer's
            # sequence state: its batches taken for duplicates, acked, not stored). A failure
            # fails this entry (ZooKeeper away: fenced, and this runs again on the way back).
            await self._reseed_topic_config()
            await self.host.restore_after_zookeeper_loss()
            self._reseeding = False
        assert self.lease is not None
        await self._wait_out_deposed_lease()
        await self.lease.start()
        await self._start_sync_set()
        self.master_url = self.my_url
        self.host.on_leading(self.epoch)  # the transaction service reconciles (now or once writable)
        # Last: the topic and checksum nodes tell producers to come, so we take
        # writes before they appear.
        await self.registry.set_role("master")
        log.info("leading broker group %d in epoch %d", self.broker_id, self.epoch)
        if takeover is not None:
            # Leading and serving already: the record is history, never on the takeover's path.
            self._won_from = None  # recorded once: a lead entered again in this epoch writes none
            self._record_later(f"the takeover record of epoch {self.epoch}", write_takeover, takeover)
        # What we inherited as a slave may not be fsynced yet; the committed offset of a
        # master alone is its flushed end, so flush now: every acked message we hold is
        # readable at once, not after the next periodic flush.
        self._flushing = asyncio.ensure_future(self._flush_all())

    def _takeover_record(self, handover: Handover | None) -> dict[str, Any] | None:
        """What this broker says of the takeover that made it master of ``self.epoch`` (None when
        this epoch's lead is entered again, e.g. back from FENCED: it was recorded the first time)."""
        seen = self._won_from
        if seen is None:
            return None
        if self._reseeding:
            reason = "reseed"
        elif seen.epoch_version < 0:
            reason = "first_master"
        elif handover is not None and handover.epoch == seen.epoch and handover.slave_id == self.registry.slave_id:
            reason = "unclean" if handover.unclean else "planned"
        elif self._deposing is not None:
            reason = "fast_takeover"
        else:
            reason = "session_expiry"
        follower = self.follower
        return {
            "epoch": self.epoch, "at_ms": now_ms(), "broker_id": self.broker_id, "url": self.my_url,
            "slave_id": self.registry.slave_id, "identity": self.identity, "reason": reason, "why": REASONS[reason],
            "previous_epoch": seen.epoch if seen.epoch_version >= 0 else None, "previous_master": seen.leader_url,
            "lag_bytes": follower.lag_bytes() if follower is not None and reason != "first_master" else None,
        }

    def _record_later(self, what: str, write: Callable[..., None], *args: Any) -> None:
        """Write a failover record in the background, in order after the ones before it;
        a failure is logged, never raised (failover_record.py: best-effort history)."""
        async def run() -> None:
            async with self._records:
                try:
                    await asyncio.to_thread(write, self.zk, self.paths, self.broker_id, *args)
                except Exception as exc:  # noqa: BLE001 - history only: nothing may fail a takeover
                    log.warning("could not write %s (%s)", what, exc)

        task = asyncio.ensure_future(run())
        self._record_tasks.add(task)
        task.add_done_callback(self._record_tasks.discard)

    async def _reseed_topic_config(self) -> None:
        """ZooKeeper lost the group's topic configuration with the rest: write back the topics we serve.

        Every member still serves the version it last applied; without the node, a member
        restarted later would serve its server.ini alone, and a `metaq topics create` would
        write a configuration naming one topic. Seeding (never overwriting) keeps whatever
        another writer put there meanwhile.
        """
        try:
            group = await asyncio.to_thread(
                update_group_topics, self.zk, self.paths, self.broker_id,
                seed_with(self.config.topics, self.config.topic_defaults),
                security=self.registry.security,
            )
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
            position=lambda slave_id, t, p: self.progress.position(slave_id, t, p, epoch=self.serving_epoch),
            on_committed=self.host.notify_committed,  # a slave's parked fetch waits for appends only
            # Committed never stops inside a batch (idempotent/transactional put).
            batch_boundary=self.host.partitions.batch_boundary,
        )
        # Back from FENCED with the same session, so the same epoch: the term goes on with the
        # members this master published in it (SyncTerm says why that is safe).
        last, self._last_sync_term = self._last_sync_term, None
        await self.sync_set.start(resume=last if last is not None and last.epoch == self.serving_epoch else None)
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
            asyncio.to_thread(
                publish_sync_set, self.zk, self.paths, self.broker_id,
                self.serving_epoch, self.my_url, members, config.min_sync_slaves,
            ),
            config.sync_slave_timeout_ms / 1000 + 5,
        )

    async def _become_follower(self, url: str) -> None:
        await self.candidacy.withdraw()
        await self._stop_leading()
        await self._unfollow()
        self.master_url = url
        await self._ensure_slave_registration()
        state = await asyncio.to_thread(read_group_state, self.zk, self.paths, self.broker_id)
        self.epoch = max(self.epoch, state.epoch)
        self.serving_epoch = self.epoch
        cut_before = len(self.truncations)
        await self._truncate_against(url)
        self._record_truncation(self.truncations[cut_before:])
        self.followed_epoch = self.epoch
        follower = await self._ensure_follower(self._slave_config())
        await follower.follow(url)
        self.death_watch.watch(url)

    async def _ensure_follower(self, slave: SlaveConfig) -> MasterFollower:
        """The replication follower (created on first use, and again if our slave id changed)."""
        if self.follower is None or self.follower.slave.slave_id != slave.slave_id:
            if self.follower is not None:
                # Stopped, not dropped: its heartbeats and checksum watch would otherwise go on
                # under the old slave id beside the new follower's.
                await self.follower.stop()
            self.follower = MasterFollower(
                self.host, slave, self.zk, self.paths,
                epoch=lambda: self.serving_epoch,
                adopt_epochs=self.adopt_master_epochs,
                on_stale_master=self.refollow,
            )
            asyncio.ensure_future(self.follower.start())
        return self.follower

    # --- slave identity ------------------------------------------------------------------

    def _slave_config(self) -> SlaveConfig:
        slave_id = self.registry.slave_id
        assert slave_id is not None
        if self.slave_template is not None:
            return replace(self.slave_template, slave_id=slave_id)
        return SlaveConfig(slave_id=slave_id, slave_group=f"meta-slave-group_{slave_id}")

    async def _ensure_slave_registration(self) -> None:
        if self.registry.slave_id is not None:
            return
        if self.slave_template is not None:
            slave_id = self.slave_template.slave_id
        else:
            slave_id = await asyncio.to_thread(self._free_slave_id)
        await self.registry.set_role(slave_id)

    def _free_slave_id(self) -> int:
        """A master without --slave that must follow takes the smallest free slave id."""
        try:
            children = self.zk.get_children_async(self.paths.broker(self.broker_id)).get(timeout=ZK_CALL_TIMEOUT_S)
        except ZK_ERRORS:
            children = []
        taken = {slave_id for child in children if (slave_id := slave_node_id(child)) is not None}
        slave_id = 0
        while slave_id in taken:
            slave_id += 1
        return slave_id

    # --- epochs and truncation ------------------------------------------------------------

    def cache(self, topic: str, partition: int) -> EpochCache:
        return self.host.partitions.get(topic, partition).epochs

    def forget_partitions(self, keys: list[tuple[str, int]]) -> None:
        """Partitions no longer served: their replicas and sync-set state go (their epoch
        histories go with their owners: ``Partitions.drop``)."""
        if self.follower is not None:
            self.follower.forget_partitions(keys)
        if self.sync_set is not None:
            self.sync_set.forget_partitions(keys)

    @property
    def history(self) -> int:
        """The newest epoch in this broker's epoch checkpoints (0 for a broker that never served)."""
        return max((self.cache(t, p).latest_epoch for t, p in self.host.store.logs()), default=0)

    def epoch_end(self, topic: str, partition: int, epoch: int) -> tuple[int, int]:
        log_ = self.host.store.get_log(topic, partition)
        return self.cache(topic, partition).end_offset_for(epoch, log_.log_end)

    def epoch_entries(self, topic: str, partition: int) -> list[tuple[int, int]]:
        return list(self.cache(topic, partition).entries)

    async def _truncate_against(self, url: str) -> None:
        """Cut every local log back to where it stops agreeing with the master's."""
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = await open_peer(self.host, url, self.registry.slave_id, timeout=3)
                break
            except ConnectionClosed as exc:
                if time.monotonic() > deadline or self._stopping:
                    raise
                log.info("waiting for the master at %s: %s", url, exc)
                await asyncio.sleep(0.2)
        try:
            for (topic, partition), log_ in sorted(self.host.store.logs().items()):
                await self._truncate_partition(conn, topic, partition, log_)
        finally:
            conn.close()

    async def _truncate_partition(self, conn: BrokerConnection, topic: str, partition: int, log_: Any) -> None:
        cache = self.cache(topic, partition)
        floor = self.follower.committed_seen(topic, partition) if self.follower is not None else 0
        self.host.partitions.get(topic, partition).truncate_corrupt()  # corrupt bytes (scrub, recovery) cannot be compared: fetched again
        end = await divergence_point(conn, topic, partition, log_, cache, floor)
        if end < log_.log_end:
            removed = log_.log_end - end
            aside = self.host.partitions.get(topic, partition).truncate_to(end)  # the epoch history follows
            record = {"topic": topic, "partition": partition, "offset": end, "bytes": removed, "file": str(aside)}
            self.truncations.append(record)
            log.warning("truncated %s-%d at %d: %d divergent bytes moved aside to %s", topic, partition, end, removed, aside)
        await self.adopt_master_epochs(conn, topic, partition)

    def _record_truncation(self, cut: list[dict[str, Any]]) -> None:
        """Record what following this epoch cut: always for a broker that led since it last
        followed (an old master rejoining; 0 bytes is worth saying), else only if bytes went."""
        slave_id = self.registry.slave_id
        if slave_id is None or not (cut or self.led_epoch > self.followed_epoch):
            return
        partitions = {f"{t['topic']}-{self.broker_id}-{t['partition']}": t["bytes"] for t in cut}
        record = {"at_ms": now_ms(), "url": self.my_url, "slave_id": slave_id, "led_epoch": self.led_epoch, "partitions": partitions}
        self._record_later(f"the truncation record of epoch {self.epoch}", write_truncation, self.epoch, slave_id, record)

    async def adopt_master_epochs(self, conn: BrokerConnection, topic: str, partition: int) -> None:
        """Copy the master's epoch history of a partition we follow (our bytes are its bytes)."""
        reply = await conn.request(EpochsRequest(topic=topic, partition=partition).to_header(), timeout=10)
        if not reply.ok:
            raise ConnectionError(f"epochs {topic}-{partition}: {reply.code} {reply.message}")
        cache = self.cache(topic, partition)
        if cache.replace_all([(int(e), int(s)) for e, s in reply["entries"]]):
            # Two fsyncs, off the event loop: a new slave starts many partitions at once
            # (ha/follower.py), and their saves overlap instead of queueing on the loop.
            await asyncio.to_thread(cache.save)

    def status_pairs(self) -> list[tuple[str, object]]:
        pairs: list[tuple[str, object]] = [
            ("ha_state", self.machine.state.value),
            ("ha_epoch", self.epoch),
            ("ha_lease_ms", int(self.lease.remaining() * 1000) if self.lease else 0),
            ("ha_truncations", len(self.truncations)),
            *self.death_watch.status_pairs(),
        ]
        for record in self.truncations[-5:]:
            pairs.append(
                (f"truncated {record['topic']}-{self.broker_id}-{record['partition']}", f"at={record['offset']} bytes={record['bytes']} file={record['file']}")
            )
        return pairs


async def assign_epoch(store: Any, partitions: Any, topics: dict[str, Any], epoch: int) -> int:
    """A new master's first step on its logs: every served partition gets ``(epoch, log end)``
    in its epoch history, durably, in batches (a takeover of 10,000 partitions must not cost
    10,000 event-loop stalls). Returns how many histories changed."""
    served = [(name, partition) for name, topic in topics.items() for partition in range(topic.num_partitions)]
    # Partitions without files yet are created as one batch off the event loop.
    await store.create_logs([(name, partition, 0) for name, partition in served])
    assigned = []
    for name, partition in served:
        owner = partitions.get(name, partition)
        # Before the epoch's start offset is recorded and before any put: a batch the
        # old master had only partly replicated to us was never acked; cut it, so no
        # batch is ever half in the log we now serve and extend.
        owner.cut_incomplete_tail("at promotion")
        # Invariant, epochs only grow: ``assign`` refuses an epoch older than the latest.
        if owner.epochs.assign(epoch, owner.log.log_end):
            assigned.append(owner.epochs)
    # Invariant: every partition's epoch file is durable before the broker acks as master in
    # this epoch. ``save_all`` returns once every file and directory is fsynced (one thread hop
    # for all partitions); ``HaCoordinator._lead`` awaits this before the lease, the sync set
    # and the "master" role, which let puts in.
    await asyncio.to_thread(save_all, assigned)
    return len(assigned)
