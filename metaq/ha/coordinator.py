"""Drives the role state machine (role.py) from ZooKeeper and carries out each role.

One task processes events one at a time (``_events``), so the entry actions of
a state (truncation, election, registration changes) never interleave. Events
come from ZooKeeper watches (master znode, epoch znode), from the registry's
session listener, and from the coordinator itself (after an election, or when
an orphaned slave finds it may take over).

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
* FENCED: stop acking at once (the lease is dropped; waiting sync acks fail
  with "unknown outcome").
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from ..addresses import parse_broker_url
from ..client.connection import BrokerConnection, ConnectionClosed
from ..config import SlaveConfig
from ..protocol.messages import EpochsRequest
from ..zk.paths import ZkPaths, decode_epoch, parse_broker_node_name, slave_node_id
from ..zk.group import ZK_CALL_TIMEOUT_S, GroupState, read_group_state
from .election import eligibility, try_take_master
from .epochs import EpochCache
from .lease import ZkLease
from .truncation import divergence_point
from .role import Event, Role, RoleMachine

if TYPE_CHECKING:
    from ..server.broker import Broker

log = logging.getLogger(__name__)

# What a ZooKeeper call may raise when ZooKeeper is slow or away.
ZK_ERRORS = (KazooException, KazooTimeoutError)


class HaCoordinator:
    def __init__(self, broker: "Broker", slave: SlaveConfig | None) -> None:
        self.broker = broker
        self.config = broker.config
        self.prefers_master = slave is None
        self.slave_template = slave
        self.machine = RoleMachine()
        self.paths = ZkPaths(self.config.zk.root)
        self.broker_id = self.config.broker_id
        self.epoch = 0
        self.followed_epoch = 0
        self.master_url: str | None = None
        self.last_transition_at = time.time()
        self.truncations: list[dict[str, Any]] = []
        self._events: asyncio.Queue[tuple[Event, Any]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._caches: dict[tuple[str, int], EpochCache] = {}
        self.lease: ZkLease | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- wiring -----------------------------------------------------------------------

    @property
    def registry(self) -> Any:
        return self.broker.registry

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
        self.lease = ZkLease(self.zk, self.config.zk.session_timeout_ms)
        registry = self.registry
        registry.on_session_suspended = lambda: self.post(Event.SUSPENDED)
        registry.on_session_lost = lambda: self.post(Event.SESSION_LOST)
        registry.on_connected = self._on_connected
        self._worker = asyncio.ensure_future(self._run())
        await asyncio.to_thread(self.zk.DataWatch, self.paths.master(self.broker_id), self._zk_watch(self._master_changed))
        await asyncio.to_thread(self.zk.DataWatch, self.paths.epoch(self.broker_id), self._zk_watch(self._epoch_changed))

    async def stop(self) -> None:
        self.post(Event.STOP)
        if self._worker is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._worker), 10)
            except asyncio.TimeoutError:
                self._worker.cancel()
        if self.lease is not None:
            await self.lease.stop()

    def refollow(self) -> None:
        """The master and we disagree on the epoch: look at ZooKeeper again and re-sync."""
        if self.machine.state is Role.FOLLOWING:
            self.master_url = None
            self.post(Event.MASTER_GONE, "re-evaluate")

    def post(self, event: Event, detail: Any = None) -> None:
        self._events.put_nowait((event, detail))

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
            self.post(Event.MASTER_SEEN, url)

    def _epoch_changed(self, data: bytes | None) -> None:
        if not data:
            return
        epoch, leader = decode_epoch(data)
        if epoch > self.epoch and self.machine.state is Role.LEADING:
            log.warning("epoch %d (leader %s) is newer than ours (%d): fencing", epoch, leader, self.epoch)
            self.post(Event.HIGHER_EPOCH)

    def _on_connected(self, new_session: bool) -> None:
        if new_session:
            # Our lock (if we held it) died with the old session.
            self.post(Event.SESSION_LOST)
            self.post(Event.MASTER_GONE)
        else:
            self.post(Event.RECONNECTED)
        self.post(Event.MASTER_GONE, "re-evaluate")

    # --- the event loop ------------------------------------------------------------------

    async def _run(self) -> None:
        await self._evaluate()
        while True:
            event, detail = await self._events.get()
            if event is Event.RECONNECTED and not await self._still_our_epoch():
                event = Event.SESSION_LOST
            if event is Event.MASTER_GONE and detail == "re-evaluate":
                await self._evaluate()
                continue
            if event is Event.MASTER_SEEN and self.machine.state is Role.FOLLOWING and detail == self.master_url:
                continue  # same master
            before = self.machine.state
            new = self.machine.handle(event)
            if new is None:
                if event is Event.MASTER_GONE and before is Role.ORPHANED:
                    await self._consider_election()
                continue
            self.last_transition_at = time.time()
            log.info("role: %s --%s--> %s", before.value, event.value, new.value)
            try:
                await self._enter(new, detail)
            except Exception:
                log.exception("entering %s failed; re-evaluating", new.value)
                await asyncio.sleep(0.2)
                await self._evaluate()
            if new is Role.STOPPED:
                return

    async def _read_state(self) -> GroupState | None:
        """The group's state in ZooKeeper; None (and a re-evaluation queued) if it cannot be read."""
        try:
            return await asyncio.to_thread(read_group_state, self.zk, self.paths, self.broker_id)
        except ZK_ERRORS as exc:
            log.warning("cannot read the group's state from ZooKeeper (%s); retrying", exc)
            await asyncio.sleep(0.2)
            self.post(Event.MASTER_GONE, "re-evaluate")
            return None

    async def _evaluate(self) -> None:
        """Look at ZooKeeper afresh and post what we see."""
        state = await self._read_state()
        if state is None:
            return
        self.epoch = max(self.epoch, state.epoch)
        if state.master_url is None:
            self.post(Event.MASTER_GONE)
        elif state.master_url == self.my_url:
            if self.machine.state is not Role.LEADING:
                # Our own node from a previous life (kill -9, quick restart): wait it out.
                log.info("the master node still names this broker (a previous run); waiting for it to expire")
                await asyncio.sleep(0.5)
                self.post(Event.MASTER_GONE, "re-evaluate")
        else:
            self.post(Event.MASTER_SEEN, state.master_url)

    async def _still_our_epoch(self) -> bool:
        try:
            state = await asyncio.to_thread(read_group_state, self.zk, self.paths, self.broker_id)
        except ZK_ERRORS:
            return False
        return state.epoch == self.epoch and state.master_url == self.my_url

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
        elif role is Role.FENCED:
            await self._fence()
        elif role is Role.STOPPED:
            await self._shutdown()

    async def _fence(self) -> None:
        assert self.lease is not None
        await self.lease.stop()
        sync = self.broker.sync
        if sync is not None:
            self.broker.sync = None
            await sync.stop()
        log.warning("fenced: this broker acks no writes until ZooKeeper confirms it still leads epoch %d", self.epoch)
        # The session may come back (RECONNECTED) or not (SESSION_LOST / a new master).
        self.post(Event.MASTER_GONE, "re-evaluate")

    async def _shutdown(self) -> None:
        if self.lease is not None:
            await self.lease.stop()
        if self.broker.sync is not None:
            await self.broker.sync.stop()
            self.broker.sync = None
        if self.broker.follower is not None:
            await self.broker.follower.stop()

    async def _become_orphan(self) -> None:
        follower = self.broker.follower
        if follower is not None:
            await follower.unfollow()
        self.master_url = None
        if not await self._consider_election():
            # Not taking over: be visible as a slave, so consumers can read what we have.
            await self._ensure_slave_registration()

    async def _consider_election(self) -> bool:
        """Post ELIGIBLE (and return True) if the election rules let us try to take over."""
        state = await self._read_state()
        if state is None:
            return False
        if state.master_url is not None:
            if state.master_url != self.my_url:
                self.post(Event.MASTER_SEEN, state.master_url)
            return False
        follower = self.broker.follower
        healthy = follower is None or not any(r.stopped for r in follower.replicas.values())
        ok, why = eligibility(
            mode=self.config.replication_mode,
            auto_failover=self.config.auto_failover,
            my_url=self.my_url,
            my_slave_id=self.registry.slave_id,
            prefers_master=self.prefers_master,
            followed_epoch=self.followed_epoch,
            replicas_healthy=healthy,
            state=state,
        )
        if ok:
            log.info("may take over: %s", why)
            self.post(Event.ELIGIBLE, state)
        else:
            log.info("not taking over: %s", why)
        return ok

    async def _elect(self, seen: GroupState) -> None:
        try:
            epoch = await asyncio.to_thread(try_take_master, self.zk, self.paths, self.broker_id, self.my_url, seen)
        except ZK_ERRORS as exc:
            log.warning("election transaction failed: %s", exc)
            epoch = None
        if epoch is None:
            self.post(Event.LOST)
            self.post(Event.MASTER_GONE, "re-evaluate")
            return
        self.epoch = epoch
        self.post(Event.WON)

    async def _lead(self) -> None:
        broker = self.broker
        follower = broker.follower
        if follower is not None:
            await follower.unfollow()
        broker.epoch = self.epoch
        for name, topic in broker.config.topics.items():
            for partition in range(topic.num_partitions):
                log_ = broker.store.get_log(name, partition)
                cache = self.cache(name, partition)
                if cache.assign(self.epoch, log_.log_end):
                    cache.save()
        assert self.lease is not None
        await self.lease.start()
        await broker.start_sync_replication()
        self.master_url = self.my_url
        # Last: the topic and checksum nodes tell producers to come, so we take
        # writes before they appear.
        await self.registry.set_role("master")
        log.info("leading broker group %d in epoch %d", self.broker_id, self.epoch)

    async def _become_follower(self, url: str) -> None:
        broker = self.broker
        if broker.sync is not None:
            await broker.sync.stop()
            broker.sync = None
        if self.lease is not None:
            await self.lease.stop()
        if broker.follower is not None:
            # Nothing may append while we truncate.
            await broker.follower.unfollow()
        self.master_url = url
        await self._ensure_slave_registration()
        state = await asyncio.to_thread(read_group_state, self.zk, self.paths, self.broker_id)
        self.epoch = max(self.epoch, state.epoch)
        broker.epoch = self.epoch
        await self._truncate_against(url)
        self.followed_epoch = self.epoch
        follower = broker.ensure_follower(self._slave_config())
        await follower.follow(url)

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
        key = (topic, partition)
        cache = self._caches.get(key)
        if cache is None:
            log_ = self.broker.store.get_log(topic, partition)
            cache = EpochCache.load(log_.directory)
            self._caches[key] = cache
        return cache

    def epoch_end(self, topic: str, partition: int, epoch: int) -> tuple[int, int]:
        log_ = self.broker.store.get_log(topic, partition)
        return self.cache(topic, partition).end_offset_for(epoch, log_.log_end)

    def epoch_entries(self, topic: str, partition: int) -> list[tuple[int, int]]:
        return list(self.cache(topic, partition).entries)

    async def _truncate_against(self, url: str) -> None:
        """Cut every local log back to where it stops agreeing with the master's."""
        host, port = parse_broker_url(url)
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = await BrokerConnection.open(host, port, timeout=3)
                break
            except ConnectionClosed as exc:
                if time.monotonic() > deadline:
                    raise
                log.info("waiting for the master at %s: %s", url, exc)
                await asyncio.sleep(0.2)
        try:
            for (topic, partition), log_ in sorted(self.broker.store.logs().items()):
                await self._truncate_partition(conn, topic, partition, log_)
        finally:
            conn.close()

    async def _truncate_partition(self, conn: BrokerConnection, topic: str, partition: int, log_: Any) -> None:
        cache = self.cache(topic, partition)
        end = await divergence_point(conn, topic, partition, log_, cache)
        if end < log_.log_end:
            removed = log_.log_end - end
            aside = log_.truncate_to(end)
            cache.truncate_from_end(end)
            cache.save()
            record = {"topic": topic, "partition": partition, "offset": end, "bytes": removed, "file": str(aside)}
            self.truncations.append(record)
            log.warning("truncated %s-%d at %d: %d divergent bytes moved aside to %s", topic, partition, end, removed, aside)
        await self.adopt_master_epochs(conn, topic, partition)

    async def adopt_master_epochs(self, conn: BrokerConnection, topic: str, partition: int) -> None:
        """Copy the master's epoch history of a partition we follow (our bytes are its bytes)."""
        reply = await conn.request(EpochsRequest(topic=topic, partition=partition).to_header(), timeout=10)
        if not reply.ok:
            raise ConnectionError(f"epochs {topic}-{partition}: {reply.code} {reply.message}")
        cache = self.cache(topic, partition)
        if cache.replace_all([(int(e), int(s)) for e, s in reply["entries"]]):
            cache.save()

    def status_pairs(self) -> list[tuple[str, object]]:
        pairs: list[tuple[str, object]] = [
            ("ha_state", self.machine.state.value),
            ("ha_epoch", self.epoch),
            ("ha_lease_ms", int(self.lease.remaining() * 1000) if self.lease else 0),
            ("ha_truncations", len(self.truncations)),
        ]
        for record in self.truncations[-5:]:
            pairs.append(
                (f"truncated {record['topic']}-{self.broker_id}-{record['partition']}", f"at={record['offset']} bytes={record['bytes']} file={record['file']}")
            )
        return pairs


def slave_id_from_node(name: str) -> int | None:
    try:
        return parse_broker_node_name(name)[1]
    except ValueError:
        return None
