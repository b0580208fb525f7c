"""Drives the role state machine (role.py) from ZooKeeper and dispatches each role's entry action.

Theory of operation
-------------------
One task processes events one at a time (``_events``), so the entry actions of a
state (truncation, election, registration changes) never interleave. Events come
from ZooKeeper watches and the registry's session listener (group_view.py), and
from the entry actions themselves (after an election, or when an orphaned slave
finds it may take over). Every decision about them is a row of role.py's table; an
observation whose event depends on the state at the time it is processed (which
master we follow, whether ZooKeeper still names us after a reconnect) is classified
then, in order, by role.py's pure functions.

The coordinator keeps the event loop, the table's dispatch and the epochs (terms.py:
``Epochs``, moved by named transitions). The entry actions are carried out by three
parts, each owning its state:

* ``GroupView`` (group_view.py): every ZooKeeper read, watch and write, on the
  registry's one ordered worker thread;
* ``Followership`` (followership.py), FOLLOWING(url): register as ``slave{k}``;
  truncate every partition where it stops agreeing with the master (the removed tail
  is kept in a ``truncated-*`` file); copy the master's epoch history; follow;
* ``Leadership`` (leadership.py), ELECTING / LEADING / HANDING_OVER / RESIGNED: the
  election transaction; the epoch's start in every partition's history, durable
  before the lease, the sync set and the master registration let puts in; the
  hand-over (``metaq promote``) watch; giving the lock back.

ORPHANED stays here: stop following (reads stay up), ask the election rules, and if
eligible post ELIGIBLE. FENCED stops acking at once (the lease is dropped; waiting
sync acks fail with "unknown outcome").

Ownership: the coordinator alone creates the three parts and moves the epochs; the
parts alone create, start and stop the lease and sync set (Leadership) and the
follower (Followership); the broker sees them only through the HA facade (node.py).
The registry registers whatever role the entry actions give it (``set_role``): the
coordinator's parts are its one writer. Every task a part starts is kept and awaited
when the coordinator stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable, Union

from ..config import BrokerConfig, SlaveConfig
from ..store.datadirs import broker_identity
from ..zk.group import GroupState
from .candidacy import Candidacy
from .election import ZK_ERRORS, eligibility
from .epochs import EpochCache, read_led_epoch
from .followership import Followership, MasterSuperseded
from .group_view import GroupView
from .host import BrokerHost
from .leadership import Leadership
from .progress import ReplicationProgress
from .role import HOLDS_LOCK, Event, Role, RoleMachine, entry_failed_event, master_event
from .terms import Epochs

log = logging.getLogger(__name__)

#: A broker that failed to take up leading may try again this long after (``_entry_failed``).
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
        self.prefers_master = slave is None
        self.broker_id = self.config.broker_id
        self.machine = RoleMachine()
        self.epochs = Epochs()
        self.view = GroupView(host, self.epochs, self.post, lambda: self.machine.state)
        self.followership = Followership(host, self.view, self.epochs, slave, self.post)
        self.followership.superseded = lambda: not self._events.empty()
        self.leadership = Leadership(host, self.view, self.epochs, progress, self.followership, self.post,
                                     lambda: self.machine.state)
        #: The master we follow (or our own url while leading); None: none yet, or forgotten so
        #: that the master seen next counts as changed.
        self.master_url: str | None = None
        self.last_transition_at = time.time()
        self._events: asyncio.Queue[tuple[Pending, Any]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        #: The last election verdict logged, (may take over, why): each is logged once.
        self._last_verdict: tuple[bool, str | None] | None = None
        #: Why this broker may not lead (it failed to take up leading), or None; and when it failed.
        self.cannot_lead: str | None = None
        self._cannot_lead_at = 0.0
        #: This broker's stable identity (datadirs.broker_identity), recorded with each epoch it takes.
        self.identity: str | None = None
        #: Our standing among the slaves (or members) that may take over, while orphaned.
        self.candidacy = Candidacy(host, self.view.paths, self._look_again_in)

    @property
    def state(self) -> Role:
        return self.machine.state

    def may_ack(self) -> bool:
        return self.machine.may_ack_writes and self.leadership.may_ack()

    async def start(self) -> None:
        self.identity = await asyncio.to_thread(broker_identity, self.config.data_path)
        self.epochs.led = await asyncio.to_thread(read_led_epoch, self.config.data_path)
        self.candidacy.identity = self.leadership.identity = self.identity
        self.leadership.start()
        registry = self.host.registry
        registry.on_session_suspended = lambda: self.post(Event.SUSPENDED)
        registry.on_session_lost = lambda: self.post(Event.SESSION_LOST)
        registry.on_connected = self.view.on_connected
        self._worker = asyncio.ensure_future(self._run())
        # While our session may hold the lock (fenced too), we answer a slave's challenge
        # (takeover.py): a live master is never deposed on the evidence of a dead one.
        answers_in = HOLDS_LOCK | {Role.FENCED}
        await self.view.start(self._post_master, lambda: self.machine.state in answers_in)

    async def stop(self) -> None:
        # Seen by the entry actions' walks over every partition (truncate_against, take_up)
        # and their waits on a peer: they give up at once, so STOP is handled next instead of
        # after their own deadline.
        self.followership.give_up()
        self.post(Event.STOP)
        if self._worker is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._worker), 10)
            except asyncio.TimeoutError:
                self._worker.cancel()
        await self._shutdown()  # the STOPPED entry action did this unless the worker hung
        # Every task the parts started ends before the broker goes on stopping.
        await self.leadership.close()
        await self.view.stop()

    def post(self, event: Pending, detail: Any = None) -> None:
        self._events.put_nowait((event, detail))

    def _post_master(self, url: str) -> None:
        """The master znode names ``url`` (another broker): SEEN or CHANGED, decided in turn."""

        async def decide() -> Event:
            if await self.followership.death_watch.names_dead_session(url) is not None:
                # Its process died (takeover.py): for an orphan there is no master, so it asks
                # the election rules again (MASTER_GONE re-enters ORPHANED), as it does when the
                # node is gone. A candidate waiting for the other slaves' log ends polls through
                # here: ignored, its wait stopped at the first look, and it stayed an orphan until
                # some ZooKeeper event came (seen for 2 minutes beside a master that lived).
                return Event.MASTER_GONE if self.machine.state is Role.ORPHANED else Event.MASTER_SEEN
            event = master_event(url, self.master_url)
            if event is not Event.MASTER_CHANGED:
                return event
            # One read of the group's state, at the moment of deciding, for every check below.
            state = await self.view.state_or_look_again()
            if state is None:
                return Event.MASTER_SEEN  # ignored: ZooKeeper did not answer, a look again is queued
            if state.master_url != url:
                # Posted from an earlier read: an orphan's election look read the dead master's
                # node just before a slave's takeover replaced it, and was decided only after we
                # followed the new master. Followed, it left the new master for a dead address,
                # then truncated against (and fetched from) that broker restarted as a slave,
                # out of the sync set for 60 s (campaign seed 7209). Invariant: we follow only a
                # master the master node names when we decide; a fresh look posts what it names.
                return Event.REEVALUATE
            if self.view.previous_life(state, self.identity):
                return Event.REEVALUATE  # not a master to follow: wait for its node to expire
            if self.view.below_history(state, url, self.history):  # history read after the state
                self._look_again_in(1.0)
                return Event.MASTER_SEEN  # ignored in every state: not a master to follow
            return event

        self.post(decide, url)

    def _look_again_in(self, seconds: float) -> None:
        asyncio.get_running_loop().call_later(seconds, self.post, Event.REEVALUATE)

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

    async def _enter(self, role: Role, detail: Any) -> None:
        """The entry action of ``role`` (the module's docstring lists them)."""
        if role is Role.FOLLOWING:
            await self._become_follower(detail)
        elif role is Role.ORPHANED:
            await self._become_orphan()
        elif role is Role.ELECTING:
            await self._elect(detail)
        elif role is Role.LEADING:
            await self._lead()
        elif role is Role.HANDING_OVER:
            self.leadership.hand_over(detail)
        elif role is Role.RESIGNED:
            # Give the lock back; ZooKeeper shows next who leads.
            await self.leadership.release_master()
            self.post(Event.REEVALUATE)
        elif role is Role.FENCED:
            await self.leadership.stop()
            log.warning("fenced: this broker acks no writes until ZooKeeper confirms it still leads epoch %d", self.epochs.seen)
            # The same session may come back with our epoch (RECONNECTED_SAME_EPOCH) or not.
            self.post(Event.REEVALUATE)
        elif role is Role.STOPPED:
            await self._shutdown()

    async def _entry_failed(self, role: Role, exc: Exception) -> None:
        """An entry action raised: tell a blip of ZooKeeper from a broker that cannot serve
        (role.entry_failed_event decides; stepping down for a ZooKeeper blip once left a
        group with no master at all)."""
        if self.followership.stopping:
            log.info("entering %s given up: %s", role.value, exc)  # STOP is next in the queue
            return
        event = entry_failed_event(role, isinstance(exc, ZK_ERRORS))
        if event is Event.SUSPENDED:
            log.warning("ZooKeeper went away while taking up leading (%s); fenced until it answers",
                        str(exc) or type(exc).__name__)
            self.post(event)
        elif event is Event.CANNOT_LEAD:
            # We won the lock but cannot serve (a log that cannot open, say): give the lock back.
            # Invariant: the master lock is held only by a broker that serves its group. A
            # broker that failed to take up leading does not try again for CANNOT_LEAD_RETRY_S,
            # so the group is left to an eligible slave instead of a master that serves nothing.
            # Then it may try once more: a cause that passed (seen: kazoo's "xids do not match"
            # from a connection reset mid-call, a checkpoint race) must not leave a group whose
            # only eligible broker is this one without a master for good.
            # CANNOT_LEAD moves us to RESIGNED, whose entry action releases the lock.
            self.cannot_lead = f"{type(exc).__name__}: {exc}"
            self._cannot_lead_at = time.monotonic()
            log.error(
                "cannot lead broker group %d: %s; releasing the master lock (this broker will not take over"
                " again for %.0f s)", self.broker_id, self.cannot_lead, CANNOT_LEAD_RETRY_S,
            )
            self._look_again_in(CANNOT_LEAD_RETRY_S)
            self.post(Event.CANNOT_LEAD)
        else:
            if isinstance(exc, MasterSuperseded):
                log.info("%s; re-evaluating", exc)
            else:
                log.exception("entering %s failed; re-evaluating", role.value)
            if role is Role.FOLLOWING:
                # Forget the master, so that the next look sees it as changed and follows it
                # again: otherwise it counts as the one we already follow, and the broker
                # stays a slave that replicates nothing (seen after a failed truncation check).
                self.master_url = None
            await asyncio.sleep(0.2)

    async def _evaluate(self) -> None:
        """Look at ZooKeeper afresh and post what we see."""
        view = self.view
        state = await view.state_or_look_again()
        if state is None:
            return
        self.epochs.saw(state.epoch)
        if state.master_url is None:
            self.post(Event.MASTER_GONE)
        elif state.master_url == view.my_url or view.previous_life(state, self.identity):
            if self.machine.state is Role.FENCED:
                # Fenced while our lock still stands (a claimed epoch, a blip): ZooKeeper
                # decides whether we still lead our epoch, as after a reconnect.
                self.post(view.reconnected)
            elif self.machine.state not in HOLDS_LOCK:
                if self.machine.state is not Role.ELECTING and await self.leadership.give_back_unused_lock():
                    return  # its deletion shows as MASTER_GONE: an election follows
                # Our own node from a previous life (kill -9, quick restart) goes with that
                # session: wait it out.
                log.info("the master node still names this broker (a previous run, or a lock given back); waiting for it to go")
                await asyncio.sleep(0.5)
                self.post(Event.REEVALUATE)
        else:
            self._post_master(state.master_url)

    # --- entry actions --------------------------------------------------------------------

    async def _become_follower(self, url: str) -> None:
        await self.candidacy.withdraw()
        await self.leadership.stop()
        await self.followership.unfollow()
        self.master_url = url
        await self.followership.follow(url)

    async def _become_orphan(self) -> None:
        await self.followership.unfollow()
        self.master_url = None
        if not await self._consider_election():
            # Not taking over: be visible as a slave, so consumers can read what we have.
            await self.followership.ensure_slave_registration()

    async def _elect(self, seen: GroupState) -> None:
        # Above every epoch a member's history holds (ZooKeeper may have lost them): the
        # epoch checkpoints of the new term must grow past every member's.
        await self.leadership.elect(seen, max(self.history, self.candidacy.newest_claimed))

    async def _lead(self) -> None:
        await self.candidacy.withdraw()
        await self.leadership.take_up()
        self.master_url = self.view.my_url
        await self.leadership.open_for_writes()

    async def _shutdown(self) -> None:
        await self.leadership.stop()
        await self.followership.stop()

    async def _consider_election(self) -> bool:
        """Post ELIGIBLE (and return True) if the election rules let us try to take over."""
        view, leadership = self.view, self.leadership
        state = await view.state_or_look_again()
        if state is None:
            return False
        dead = None if state.master_url is None else await self.followership.death_watch.names_dead_session(state.master_url)
        if dead is not None:
            # Its process died (takeover.py): the election rules apply as if its session had expired.
            state = replace(state, master_url=None)
        elif state.master_url is not None:
            if state.master_url != view.my_url:
                self._post_master(state.master_url)
            return False
        healthy = self.followership.replicas_healthy()
        try:
            handover = await view.read_handover()
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
        slave_id = self.host.registry.slave_id
        ok, why = eligibility(
            mode=self.config.replication_mode,
            auto_failover=self.config.auto_failover,
            my_url=view.my_url,
            my_identity=self.identity,
            my_slave_id=slave_id,
            prefers_master=self.prefers_master,
            followed_epoch=self.epochs.followed,
            replicas_healthy=healthy,
            state=state,
            never_caught_up=self.followership.never_caught_up(),
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
        leadership.deposing = dead if ok else None
        leadership.electing_on = handover if ok else None
        if ok and dead is not None:
            why = f"{why}; the master's process at {dead.url} died (fast takeover)"
        if ok:
            log.log(logging.DEBUG if repeated else logging.INFO, "may take over: %s", why)
            self.post(Event.ELIGIBLE, state)
        else:
            log.log(logging.DEBUG if repeated else logging.WARNING, "not taking over: %s; %s", why,
                    recovery_hint(state, history, self.broker_id, slave_id))
            if dead is not None:
                # Evidence we may not act on must not outlive the session it names: kept, it
                # made every event naming that session "its process died" (ignored), so a master
                # that was alive after all (a challenge answered late on a busy machine) was never
                # followed again and this slave stayed an orphan for good. A dead session expires
                # within its timeout (the master node's deletion comes like any other); one that
                # still holds the lock then lives, and the look at that moment finds the evidence
                # stale (names_dead_session) and follows it again.
                self._look_again_in(max(0.0, dead.observed_at + self.config.zk.session_timeout_ms / 1000
                                        - time.monotonic()) + 0.1)
        return ok

    def _cannot_lead_now(self) -> str | None:
        """Why this broker may not lead now (``_entry_failed``), or None once the wait is over."""
        if self.cannot_lead is not None and time.monotonic() - self._cannot_lead_at >= CANNOT_LEAD_RETRY_S:
            log.warning("this broker may try to lead again: it failed %.0f s ago (%s)",
                        time.monotonic() - self._cannot_lead_at, self.cannot_lead)
            self.cannot_lead = None
        return self.cannot_lead

    # --- the epoch histories (read by the HA facade) ----------------------------------------

    def cache(self, topic: str, partition: int) -> EpochCache:
        return self.host.partitions.get(topic, partition).epochs

    @property
    def history(self) -> int:
        """The newest epoch in this broker's epoch checkpoints (0 for a broker that never served)."""
        return max((self.cache(t, p).latest_epoch for t, p in self.host.store.logs()), default=0)

    def epoch_end(self, topic: str, partition: int, epoch: int) -> tuple[int, int]:
        log_ = self.host.store.get_log(topic, partition)
        return self.cache(topic, partition).end_offset_for(epoch, log_.log_end)

    def epoch_entries(self, topic: str, partition: int) -> list[tuple[int, int]]:
        return list(self.cache(topic, partition).entries)

    def forget_partitions(self, keys: list[tuple[str, int]]) -> None:
        """Partitions no longer served: their replicas and sync-set state go (their epoch
        histories go with their owners: ``Partitions.drop``)."""
        self.followership.forget_partitions(keys)
        self.leadership.forget_partitions(keys)

    def status_pairs(self) -> list[tuple[str, object]]:
        lease = self.leadership.lease
        truncations = self.followership.truncations
        pairs: list[tuple[str, object]] = [
            ("ha_state", self.machine.state.value),
            ("ha_epoch", self.epochs.seen),
            ("ha_lease_ms", int(lease.remaining() * 1000) if lease else 0),
            ("ha_truncations", len(truncations)),
            *self.followership.death_watch.status_pairs(),
        ]
        for record in truncations[-5:]:
            pairs.append(
                (f"truncated {record['topic']}-{self.broker_id}-{record['partition']}", f"at={record['offset']} bytes={record['bytes']} file={record['file']}")
            )
        for (topic, partition), reason in sorted(self.followership.held_back.items()):
            pairs.append((f"held back {topic}-{self.broker_id}-{partition}", reason))
        return pairs


def recovery_hint(state: GroupState, history: int, broker_id: int, slave_id: int | None) -> str:
    """How an operator gets a group without an eligible broker going again."""
    who = f"--slave {slave_id}" if slave_id is not None else "--slave K"
    if history > state.epoch:
        return (
            f"start every member of the group; if the broker that led epoch {history} is gone for good, elect the"
            f" member with the newest history with `metaq promote --zk ZK --broker-id {broker_id} {who} --unclean`"
            " (docs/operations.md, \"Losing ZooKeeper's data\")"
        )
    if state.epoch_version < 0:
        return "start a broker of this group without --slave to found it"
    return (
        f"to recover, start the last master ({state.leader_url}, with its data dir) again, or elect this broker"
        f" with `metaq promote --zk ZK --broker-id {broker_id} {who} --unclean` (it may lose acked messages)"
    )
