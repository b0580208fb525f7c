"""Cluster metadata from ZooKeeper: brokers, and the partitions of the topics in use.

One KazooClient per session factory, shared by its producers and consumers (MetaQ
shares one ZkClient the same way). Kazoo runs its own thread: its blocking calls go
through ``Cluster.call`` (an executor thread), and its watches only set a flag in the
event loop. A refresh task then re-reads everything watched and publishes an immutable
ClusterSnapshot; listeners get the new snapshot when it differs from the previous one.
Re-reading everything on any change is simpler than patching the view watch by watch,
and cheap at this scale (a few znodes per broker and topic).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoNodeError

from ..zk.data_loss import reconnect_after_data_loss
from ..zk.group import GroupMembers, read_members
from ..zk.paths import ZkPaths, parse_broker_node_name, parse_topic_node_data
from .config import MetaClientConfig
from .message import Partition
from .routing import BrokerAddresses

log = logging.getLogger(__name__)

#: kazoo's log for the client's session: under "kazoo" (so settings for kazoo apply), with
#: a NullHandler so that an application without logging set up does not get kazoo's
#: reconnect warnings on stderr (a failed start is reported as one MetaqError instead).
ZK_LOG = logging.getLogger("kazoo.client.metaq")
ZK_LOG.addHandler(logging.NullHandler())

SnapshotListener = Callable[["ClusterSnapshot"], Awaitable[None] | None]


@dataclass(frozen=True)
class ClusterSnapshot:
    brokers: dict[int, BrokerAddresses] = field(default_factory=dict)
    #: topic -> partitions of masters that accept publishing (topics-pub "{id}-m").
    pub: dict[str, tuple[Partition, ...]] = field(default_factory=dict)
    #: topic -> partitions readable on any replica (topics-sub "{id}-m" and "{id}-s{k}",
    #: de-duplicated: losing a master does not change this set).
    sub: dict[str, tuple[Partition, ...]] = field(default_factory=dict)

    def writable_partitions(self, topic: str) -> list[Partition]:
        """Published partitions whose master is registered right now, sorted."""
        return [p for p in self.pub.get(topic, ()) if (b := self.brokers.get(p.broker_id)) and b.master]

    def readable_partitions(self, topic: str) -> list[Partition]:
        return list(self.sub.get(topic, ()))


class Cluster:
    def __init__(self, config: MetaClientConfig) -> None:
        self.config = config
        self.paths = ZkPaths(config.zk_root)
        self.zk = KazooClient(
            hosts=config.zk_connect,
            timeout=config.zk_session_timeout_ms / 1000,
            connection_retry={"max_tries": -1, "max_delay": 1.0},
            command_retry={"max_tries": 3, "max_delay": 1.0},
            logger=ZK_LOG,
        )
        self.snapshot = ClusterSnapshot()
        self._pub_topics: set[str] = set()
        self._sub_topics: set[str] = set()
        self._listeners: list[SnapshotListener] = []
        self._session_listeners: list[Callable[[], Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dirty = asyncio.Event()
        self._refreshed = asyncio.Condition()
        self._generation = 0
        self._task: asyncio.Task[None] | None = None
        self._session_lost = False

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.zk.add_listener(self._on_state)
        # A ZooKeeper restarted empty refuses a client that saw newer transactions, for good.
        reconnect_after_data_loss(self.zk, self.config.zk_session_timeout_ms)
        try:
            await self.call(self.zk.start, self.config.zk_connection_timeout_ms / 1000)
        except Exception as exc:
            await self.call(self.zk.close)
            from ..errors import MetaqError

            raise MetaqError(f"cannot connect to ZooKeeper at {self.config.zk_connect}: {exc or 'timed out'}") from None
        self._task = asyncio.create_task(self._refresh_loop(), name="metaq-cluster-refresh")
        await self.refresh()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            await self.call(self.zk.stop)
        finally:
            await self.call(self.zk.close)

    # --- kazoo plumbing --------------------------------------------------------------------

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a blocking kazoo call off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: fn(*args, **kwargs))

    def threadsafe_trigger(self, event: asyncio.Event) -> Callable[..., None]:
        """A kazoo watch function that sets ``event`` in the event loop."""
        loop = self._loop

        def fire(*_: Any) -> None:
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

        return fire

    def _on_state(self, state: str) -> None:
        # Called in kazoo's thread. After a lost session every ephemeral node of ours is
        # gone and every watch forgotten: re-read, and let consumers re-register.
        if state == KazooState.LOST:
            self._session_lost = True
        elif state == KazooState.CONNECTED and self._loop is not None and not self._loop.is_closed():
            new_session, self._session_lost = self._session_lost, False
            self._loop.call_soon_threadsafe(self._reconnected, new_session)

    def _reconnected(self, new_session: bool) -> None:
        self._dirty.set()
        if new_session:
            log.warning("ZooKeeper session was lost and re-established; re-registering")
            for callback in list(self._session_listeners):
                callback()

    # --- what to watch, who to tell -----------------------------------------------------------

    def add_listener(self, listener: SnapshotListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: SnapshotListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def add_session_listener(self, callback: Callable[[], Any]) -> None:
        self._session_listeners.append(callback)

    def remove_session_listener(self, callback: Callable[[], Any]) -> None:
        if callback in self._session_listeners:
            self._session_listeners.remove(callback)

    async def watch_topic(self, topic: str, *, publish: bool = False, subscribe: bool = False) -> None:
        """Track a topic's partitions from now on; returns after they were read once."""
        added = (publish and topic not in self._pub_topics) or (subscribe and topic not in self._sub_topics)
        if publish:
            self._pub_topics.add(topic)
        if subscribe:
            self._sub_topics.add(topic)
        if added:
            await self.refresh()

    def request_refresh(self) -> None:
        """Re-read ZooKeeper soon (e.g. after a broker refused us: its znodes may be gone)."""
        self._dirty.set()

    async def refresh(self) -> ClusterSnapshot:
        """Ask for a re-read and wait until one that started after this call has finished."""
        async with self._refreshed:
            target = self._generation + 1
            # A refresh already running may have read ZK before our caller's change: wait for the next one.
            if self._reading:
                target += 1
            self._dirty.set()
            await self._refreshed.wait_for(lambda: self._generation >= target)
        return self.snapshot

    _reading = False

    async def _refresh_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            self._reading = True
            try:
                snapshot = await self.call(self._read_snapshot, sorted(self._pub_topics), sorted(self._sub_topics))
            except Exception as exc:  # ZK unreachable for now: retry, keep the last view
                log.warning("cannot read the cluster from ZooKeeper (%s); retrying", exc or type(exc).__name__)
                self._reading = False
                await asyncio.sleep(0.5)
                self._dirty.set()
                continue
            self._reading = False
            changed = snapshot != self.snapshot
            self.snapshot = snapshot
            if changed:
                log.debug("cluster changed: %s", snapshot)
                for listener in list(self._listeners):
                    try:
                        result = listener(snapshot)
                        if asyncio.iscoroutine(result):
                            await result
                    except Exception:
                        log.exception("cluster listener %r failed", listener)
            async with self._refreshed:
                self._generation += 1
                self._refreshed.notify_all()

    # --- reading ZooKeeper (runs in an executor thread) -------------------------------------

    def _children(self, path: str) -> list[str]:
        watch = self.threadsafe_trigger(self._dirty)
        try:
            return self.zk.get_children(path, watch=watch)
        except NoNodeError:
            # Watch for its creation instead; if it appeared meanwhile, read it now.
            if self.zk.exists(path, watch=watch):
                return self.zk.get_children(path, watch=watch)
            return []

    def _data(self, path: str) -> str | None:
        try:
            data, _ = self.zk.get(path)
        except NoNodeError:
            return None
        return data.decode("utf-8")

    def _read_snapshot(self, pub_topics: list[str], sub_topics: list[str]) -> ClusterSnapshot:
        paths = self.paths
        brokers: dict[int, BrokerAddresses] = {}
        for name in self._children(paths.broker_ids()):
            if not name.isdigit():
                continue
            broker_id = int(name)
            try:
                group = read_members(self.zk, paths, broker_id, watch=self.threadsafe_trigger(self._dirty))
            except NoNodeError:  # removed meanwhile; the watch on the broker ids sees it
                group = GroupMembers(None)
            brokers[broker_id] = BrokerAddresses(broker_id, group.master_url, tuple(group.slaves.items()))
        pub = {topic: self._topic_partitions(paths.topics_pub(topic), masters_only=True) for topic in pub_topics}
        sub = {topic: self._topic_partitions(paths.topics_sub(topic), masters_only=False) for topic in sub_topics}
        return ClusterSnapshot(brokers, pub, sub)

    def _topic_partitions(self, path: str, masters_only: bool) -> tuple[Partition, ...]:
        partitions: set[Partition] = set()
        for child in self._children(path):
            try:
                broker_id, slave_id = parse_broker_node_name(child)
            except ValueError:
                continue
            if masters_only and slave_id is not None:
                continue
            data = self._data(f"{path}/{child}")
            if data is None:
                continue
            try:
                num_parts = parse_topic_node_data(data).num_parts
            except ValueError as exc:
                log.warning("ignoring %s/%s: %s", path, child, exc)
                continue
            partitions.update(Partition(broker_id, n) for n in range(num_parts))
        return tuple(sorted(partitions))
