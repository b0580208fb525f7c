"""What this broker reads of its group in ZooKeeper, and the watches that turn it into events.

Theory of operation
-------------------
The HA coordinator (coordinator.py) decides nothing from ZooKeeper directly: every
read, watch and write of the group's nodes goes through this view, and every one of
them runs on the registry's worker thread (``BrokerRegistry.call``), in order with the
registration steps. One thread makes all of the broker's ZooKeeper calls, so an
election, a lock given back and a registration change never race each other.

Three watches (armed by ``start``) and the registry's session listener
(``on_connected``) turn changes into the role machine's events (role.py), posted to
the coordinator's queue:

* the master node: MASTER_GONE when it goes; when it names another broker, the
  coordinator decides SEEN or CHANGED in turn (``post_master``), because that depends
  on the state at the time the event is processed;
* the epoch node: HIGHER_EPOCH when it shows an epoch newer than any we saw;
* the hand-over node: ``role.handover_event`` of what it asks;
* a reconnection: a new session lost our lock (SESSION_LOST, MASTER_GONE); the same
  session asks ZooKeeper in turn whether we still lead our epoch (``reconnected``).

While our session may hold the lock (fenced too) it also answers other members'
challenges (takeover.py): a live master is never deposed on the evidence of a dead one.

The checks that classify a master (``below_history``, ``previous_life``) live here and
answer from one read of the group's state, made by the coordinator at the moment of
deciding; each returns a plain answer and the coordinator posts the event.

The failover history (takeover and truncation records, failover_record.py) is written
here too, in the background, one record at a time in order; ``stop`` awaits the ones
still being written.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, TypeVar

from ..config import TopicConfig
from ..owned_tasks import OwnedTasks
from ..zk.group import ZK_CALL_TIMEOUT_S, GroupState, read_group_state
from ..zk.paths import ZkPaths, decode_epoch, slave_node_id
from ..zk.topic_config import seed_with, update_group_topics
from .election import (
    ZK_ERRORS,
    Deposal,
    Handover,
    clear_handover,
    decode_handover,
    publish_sync_set,
    read_handover,
    try_take_master,
)
from .host import BrokerHost
from .role import HOLDS_LOCK, Event, Role, handover_event, reconnected_event
from .takeover import answer_challenges
from .terms import Epochs

log = logging.getLogger(__name__)

T = TypeVar("T")


class GroupView:
    def __init__(self, host: BrokerHost, epochs: Epochs, post: Callable[..., None], role: Callable[[], Role]) -> None:
        self.host = host
        self.paths = ZkPaths(host.config.zk.root)
        self.broker_id = host.config.broker_id
        self._epochs = epochs
        self._post = post
        self._role = role
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The last "not following a master below our history" line logged (each is logged once).
        self._refused_master: str | None = None
        #: Takeover and truncation records are written one at a time, in order, off the critical path.
        self._records = asyncio.Lock()
        self._record_tasks = OwnedTasks("failover records")
        #: Decides SEEN or CHANGED for a master node naming another broker (set by ``start``).
        self._post_master: Callable[[str], None] = lambda url: None

    @property
    def registry(self) -> Any:
        return self.host.registry

    @property
    def zk(self) -> Any:
        return self.registry.client

    @property
    def my_url(self) -> str:
        return self.registry.url

    async def call(self, func: Callable[..., T], *args: Any) -> T:
        """``func(zk, paths, broker_id, *args)`` on the registry's ordered ZooKeeper worker."""
        return await self.registry.call(func, self.zk, self.paths, self.broker_id, *args)

    # --- watches --------------------------------------------------------------------------

    async def start(self, post_master: Callable[[str], None], answers: Callable[[], bool]) -> None:
        """Arm the three watches, and answer challenges while ``answers()``."""
        self._loop = asyncio.get_running_loop()
        self._post_master = post_master
        for path, handler in (
            (self.paths.master(self.broker_id), self._master_changed),
            (self.paths.epoch(self.broker_id), self._epoch_changed),
            (self.paths.handover(self.broker_id), self._handover_changed),
        ):
            await self.registry.call(self.zk.DataWatch, path, self._watch(handler))
        await self.call(answer_challenges, answers)

    def _watch(self, handler: Callable[[bytes | None], None]) -> Any:
        """A kazoo watch (run on kazoo's thread) that hands the data to the event loop."""
        def watcher(data: bytes | None, _stat: Any, *_: Any) -> bool:
            loop = self._loop
            if loop is None or loop.is_closed() or self._role() is Role.STOPPED:
                return False
            loop.call_soon_threadsafe(handler, data)
            return True

        return watcher

    def _master_changed(self, data: bytes | None) -> None:
        url = data.decode("utf-8") if data else None
        if url is None:
            self._post(Event.MASTER_GONE)
        elif url != self.my_url:
            self._post_master(url)

    def _handover_changed(self, data: bytes | None) -> None:
        handover = decode_handover(data) if data else None
        if handover is not None:
            self._post(handover_event(handover.epoch, handover.unclean, self._epochs.serving), handover)

    def _epoch_changed(self, data: bytes | None) -> None:
        if not data:
            return
        epoch, leader = decode_epoch(data)
        if epoch > self._epochs.seen:
            # Only LEADING reacts (it fences, and says so); elsewhere the row ignores it.
            log.debug("epoch %d (leader %s) is newer than ours (%d)", epoch, leader, self._epochs.seen)
            self._post(Event.HIGHER_EPOCH)

    def on_connected(self, new_session: bool) -> None:
        """The registry's session listener: the connection is back (same session or a new one)."""
        if new_session:
            # Our lock (if we held it) died with the old session.
            self._post(Event.SESSION_LOST)
            self._post(Event.MASTER_GONE)
        else:
            self._post(self.reconnected)
        self._post(Event.REEVALUATE)

    async def reconnected(self) -> Event:
        """The same session is back: does ZooKeeper still name us master of our epoch?"""
        try:
            state = await self.read_state()
        except ZK_ERRORS as exc:
            # Unanswered is not "lost": a server losing its quorum accepts our session and
            # drops it again before the read. Giving up the epoch here made a master whose
            # session lived through a quorum loss re-register as a slave (reads stopped,
            # then a new epoch). Stay as we are and look again: FENCED acks nothing, and an
            # expired session still ends our epoch through SESSION_LOST.
            log.warning("reconnected, but ZooKeeper did not answer (%s); looking again", str(exc) or type(exc).__name__)
            return Event.REEVALUATE
        return reconnected_event(state.epoch, state.master_url, self._epochs.seen, self.my_url)

    # --- reads ----------------------------------------------------------------------------

    async def read_state(self) -> GroupState:
        """The group's state (raises one of ZK_ERRORS if ZooKeeper does not answer)."""
        return await self.call(read_group_state)

    async def state_or_look_again(self) -> GroupState | None:
        """The group's state; None (and a re-evaluation queued) if it cannot be read."""
        try:
            return await self.read_state()
        except ZK_ERRORS as exc:
            log.warning("cannot read the group's state from ZooKeeper (%s); retrying", exc)
            await asyncio.sleep(0.2)
            self._post(Event.REEVALUATE)
            return None

    def below_history(self, state: GroupState, url: str, history: int) -> bool:
        """Whether the master at ``url`` (``state`` names it) leads an epoch older than our
        own ``history``.

        Invariant: a broker never truncates against a master whose epoch is below its own
        newest epoch. Such a master took the lock from a ZooKeeper that lost its data, without
        this broker's claim (it was down): its log may lack messages acked in our newer
        epochs, and following would cut them from ours. We stay as we are (reads served) and
        say so once; the operator decides (docs/operations.md, "Losing ZooKeeper's data").
        """
        if state.master_url != url or history <= state.epoch:
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

    def previous_life(self, state: GroupState, identity: str | None) -> bool:
        """The registered master is this broker's previous run on another address (its
        session has not expired yet): recognised by the identity recorded with its epoch."""
        return (
            self._role() not in HOLDS_LOCK
            and state.master_url == state.leader_url
            and state.leader_identity is not None
            and state.leader_identity == identity
        )

    async def read_handover(self) -> Handover | None:
        return await self.call(read_handover)

    async def clear_handover(self) -> None:
        await self.call(clear_handover)

    async def free_slave_id(self) -> int:
        """The smallest slave id no member of the group is registered with."""
        return await self.call(_free_slave_id)

    # --- writes ---------------------------------------------------------------------------

    async def take_master(self, seen: GroupState, identity: str | None, floor: int, deposal: Deposal | None) -> int | None:
        """The election transaction (election.try_take_master): the epoch won, or None."""
        return await self.call(try_take_master, self.my_url, seen, identity, floor, deposal)

    async def release_lock(self) -> bool:
        """Delete the master node if our session holds it (never another broker's); whether it did."""
        return await self.call(_release_lock)

    async def publish_sync_set(self, epoch: int, members: frozenset[int], min_sync_slaves: int) -> None:
        await self.call(publish_sync_set, epoch, self.my_url, members, min_sync_slaves)

    async def seed_topic_config(self, topics: dict[str, TopicConfig], defaults: Any) -> Any:
        """Write the topics we serve as the group's configuration, unless one is there already."""
        seed, security = seed_with(topics, defaults), self.registry.security
        return await self.registry.call(
            lambda: update_group_topics(self.zk, self.paths, self.broker_id, seed, security=security)
        )

    def record_later(self, what: str, write: Callable[..., None], *args: Any) -> None:
        """Write a failover record in the background, in order after the ones before it;
        a failure is logged, never raised (failover_record.py: best-effort history)."""
        async def run() -> None:
            async with self._records:
                try:
                    await self.call(write, *args)
                except Exception as exc:  # noqa: BLE001 - history only: nothing may fail a takeover
                    log.warning("could not write %s (%s)", what, exc)

        self._record_tasks.spawn(run())

    async def stop(self) -> None:
        """Let the records being written finish; past ZK_CALL_TIMEOUT_S, give them up."""
        await self._record_tasks.stop(ZK_CALL_TIMEOUT_S)


def _release_lock(client: Any, paths: ZkPaths, broker_id: int) -> bool:
    path = paths.master(broker_id)
    session_id = client.client_id[0] if client.client_id else None  # the session now, as the call runs
    stat = client.exists_async(path).get(timeout=ZK_CALL_TIMEOUT_S)
    if stat is not None and stat.ephemeralOwner == session_id:
        client.delete_async(path, version=stat.version).get(timeout=ZK_CALL_TIMEOUT_S)
        return True
    return False


def _free_slave_id(client: Any, paths: ZkPaths, broker_id: int) -> int:
    try:
        children = client.get_children_async(paths.broker(broker_id)).get(timeout=ZK_CALL_TIMEOUT_S)
    except ZK_ERRORS:
        children = []
    taken = {slave_id for child in children if (slave_id := slave_node_id(child)) is not None}
    slave_id = 0
    while slave_id in taken:
        slave_id += 1
    return slave_id
