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
from kazoo.security import ACL, Permissions

from ..zk.acl import digest_user
from ..zk.data_loss import reconnect_after_data_loss
from ..zk.group import GroupMembers, read_members
from ..zk.paths import ZkPaths, parse_broker_node_name, parse_topic_node_data
from ..zk.tls import describe_connect_failure, make_kazoo_client
from .config import MetaClientConfig
from .message import Partition
from .routing import BrokerAddresses, departures

log = logging.getLogger(__name__)

#: kazoo's log for the client's session: under "kazoo" (so settings for kazoo apply), with
#: a NullHandler so that an application without logging set up does not get kazoo's
#: reconnect warnings on stderr (a failed start is reported as one MetaqError instead).
ZK_LOG = logging.getLogger("kazoo.client.metaq")
ZK_LOG.addHandler(logging.NullHandler())

#: Partitions one group may announce for a topic, at most: a ``numParts`` from ZooKeeper
#: above it is refused (a forged registration must not make the client loop over millions).
MAX_PARTITIONS = 10_000

SnapshotListener = Callable[["ClusterSnapshot"], Awaitable[None] | None]
#: Told ``(broker url, why)`` when a broker's registration leaves ZooKeeper (its session is gone:
#: ``routing.departures``), before the snapshot listeners run.
DepartureListener = Callable[[str, str], None]


@dataclass(frozen=True)
class ClusterSnapshot:
    brokers: dict[int, BrokerAddresses] = field(default_factory=dict)
    #: topic -> partitions of masters that accept publishing (topics-pub "{id}-m").
    pub: dict[str, tuple[Partition, ...]] = field(default_factory=dict)
    #: topic -> partitions readable on any replica (topics-sub "{id}-m" and "{id}-s{k}",
    #: de-duplicated: losing a master does not change this set).
    sub: dict[str, tuple[Partition, ...]] = field(default_factory=dict)
    #: topic -> the groups carrying it when every one of them registers it for subscribing
    #: only (``acceptPublish=false``): publishing it is refused, not merely waiting for a master.
    publish_closed: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def publish_refusal(self, topic: str) -> str | None:
        """Why no send to ``topic`` can succeed while the brokers keep their settings, or None."""
        groups = self.publish_closed.get(topic)
        if not groups:
            return None
        return (f"topic {topic!r} does not accept publishing: broker group(s) {', '.join(map(str, groups))} "
                "register it for subscribing only (acceptPublish=false)")

    def writable_partitions(self, topic: str) -> list[Partition]:
        """Published partitions whose master is registered right now, sorted."""
        return [p for p in self.pub.get(topic, ()) if (b := self.brokers.get(p.broker_id)) and b.master]

    def readable_partitions(self, topic: str) -> list[Partition]:
        return list(self.sub.get(topic, ()))


class Cluster:
    def __init__(self, config: MetaClientConfig) -> None:
        self.config = config
        self.paths = ZkPaths(config.zk_root)
        self.zk = make_kazoo_client(
            config.zk_connect,
            tls=config.zk_tls,
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
        self._departure_listeners: list[DepartureListener] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dirty = asyncio.Event()
        self._refreshed = asyncio.Condition()
        self._generation = 0
        self._task: asyncio.Task[None] | None = None
        self._session_lost = False
        #: With a login (security on) only groups whose ZooKeeper node only they can change are used.
        self._check_group_acls = config.credentials.user is not None
        self._warned: set[str] = set()  # what was reported once already (untrusted groups, bad nodes)

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

            reason = await self.call(describe_connect_failure, self.config.zk_connect, exc, self.config.zk_tls,
                                     "cannot connect to ZooKeeper")
            raise MetaqError(reason) from None
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

    def add_departure_listener(self, listener: DepartureListener) -> None:
        self._departure_listeners.append(listener)

    def remove_departure_listener(self, listener: DepartureListener) -> None:
        if listener in self._departure_listeners:
            self._departure_listeners.remove(listener)

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
            previous, self.snapshot = self.snapshot, snapshot
            if changed:
                log.debug("cluster changed: %s", snapshot)
                self._tell_departures(previous, snapshot)
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

    def _tell_departures(self, previous: ClusterSnapshot, snapshot: ClusterSnapshot) -> None:
        """Requests in flight to a broker that left ZooKeeper are abandoned now, not
        after ``request_timeout_s``: a silent host (no RST) would hold them that long."""
        for url, reason in departures(previous.brokers, snapshot.brokers).items():
            log.info("abandoning requests in flight to %s: %s", url, reason)
            for listener in list(self._departure_listeners):
                try:
                    listener(url, reason)
                except Exception:
                    log.exception("departure listener %r failed", listener)

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
        untrusted: set[int] = set()
        for name in self._children(paths.broker_ids()):
            if not name.isdigit():
                continue
            broker_id = int(name)
            if self._check_group_acls and not self._trusted_group(broker_id):
                untrusted.add(broker_id)
                continue
            try:
                group = read_members(self.zk, paths, broker_id, watch=self.threadsafe_trigger(self._dirty))
            except NoNodeError:  # removed meanwhile; the watch on the broker ids sees it
                group = GroupMembers(None)
            brokers[broker_id] = BrokerAddresses(broker_id, group.master_url, tuple(group.slaves.items()))
        pub = {topic: self._topic_partitions(paths.topics_pub(topic), True, untrusted) for topic in pub_topics}
        sub = {topic: self._topic_partitions(paths.topics_sub(topic), False, untrusted) for topic in sub_topics}
        closed = {topic: groups for topic in pub_topics
                  if not pub[topic] and (groups := self._subscribe_only(topic, untrusted))}
        return ClusterSnapshot(brokers, pub, sub, closed)

    def _subscribe_only(self, topic: str, untrusted: set[int]) -> tuple[int, ...]:
        """The groups carrying ``topic`` when each one's master registers it for subscribing only, else ().

        A master registers its config checksum node last and withdraws it first
        (``server/registry.py : _desired_nodes``): while that node stays the same one
        (same czxid) before and after reading a topic's nodes, the master's registration
        was complete, so a missing publish node is missing on purpose, not on its way.
        A group with no master (a failover) makes the answer (): its next master may publish.
        """
        paths = self.paths
        groups: set[int] = set()
        for child in self._children(paths.topics_sub(topic)):
            try:
                groups.add(parse_broker_node_name(child)[0])
            except ValueError:
                continue
        groups -= untrusted
        for broker_id in groups:
            checksum = paths.master_config_checksum(broker_id)
            before = self.zk.exists(checksum)
            if before is None or self.zk.exists(paths.topic_sub_node(topic, broker_id)) is None \
                    or self.zk.exists(paths.topic_pub_node(topic, broker_id)) is not None:
                return ()
            after = self.zk.exists(checksum)
            if after is None or after.czxid != before.czxid:
                return ()
        return tuple(sorted(groups))

    def _trusted_group(self, broker_id: int) -> bool:
        """Does ``/brokers/ids/{id}`` carry group ``id``'s digest ACL, and let nobody else change it?

        A broker with security on creates its group node with that ACL (``zk/acl.py :
        ZkSecurity.group_acl``), so nobody without the group's ZooKeeper password can
        register a master, slave or topic of that group. A node anybody may write (the
        default ACL of a ZooKeeper client without credentials) is a forgery: the client
        would hand it a user name and a SCRAM proof, or (security off) messages.
        A forger who sets a digest ACL of its own making passes this check (docs/security.md).
        """
        path = self.paths.broker(broker_id)
        try:
            acl, _ = self.zk.get_acls(path)
        except NoNodeError:
            return False
        if group_node_locked(acl, broker_id):
            return True
        self._warn_once(path, "ignoring broker group %d: its ZooKeeper node %s may be changed by others than "
                              "group %d's brokers (ACL %s); not a group to log in to", broker_id, path, broker_id, acl)
        return False

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def _topic_partitions(self, path: str, masters_only: bool, untrusted: set[int]) -> tuple[Partition, ...]:
        partitions: set[Partition] = set()
        for child in self._children(path):
            try:
                broker_id, slave_id = parse_broker_node_name(child)
            except ValueError:
                continue
            if (masters_only and slave_id is not None) or broker_id in untrusted:
                continue
            data = self._data(f"{path}/{child}")
            if data is None:
                continue
            try:
                num_parts = parse_topic_node_data(data).num_parts
            except ValueError as exc:
                log.warning("ignoring %s/%s: %s", path, child, exc)
                continue
            if num_parts > MAX_PARTITIONS:
                self._warn_once(f"{path}/{child}", "ignoring %s/%s: numParts=%d is above the client's limit of %d",
                                path, child, num_parts, MAX_PARTITIONS)
                continue
            partitions.update(Partition(broker_id, n) for n in range(num_parts))
        return tuple(sorted(partitions))


def group_node_locked(acl: list[ACL], broker_id: int) -> bool:
    """Group ``broker_id``'s digest may do everything and nobody else more than read."""
    owner = f"{digest_user(broker_id)}:"
    owned = any(e.id.scheme == "digest" and e.id.id.startswith(owner) and e.perms == Permissions.ALL for e in acl)
    others_read_only = all(e.perms & ~Permissions.READ == 0 for e in acl
                           if not (e.id.scheme == "digest" and e.id.id.startswith(owner)))
    return owned and others_read_only
