"""Keeps a running broker serving its group's topic configuration from ZooKeeper.

Masters and slaves alike watch ``{root}/brokers/topic-config/{id}``
(metaq/zk/topic_config.py, where the precedence rule is written) and apply each new
version without a restart: new topics and partitions are served, changed flush,
segment and retention settings take effect, deleted topics stop being served and every
record of them is dropped, files included (``forget_partitions``); a topic re-created
under the same name is a new incarnation and starts empty, and the master deletes the
consumer groups' stored offsets of a topic that ended. A slave starts replicating new
partitions once its master serves them: after applying a version it asks the master's
``topics`` until they are there, then has its follower re-read them (metaq/ha/follower.py).

Whatever else offers the broker a topic map (a slave adopting its master's
server.ini sections) goes through ``overlay``, so the group's configuration wins
there too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from ..config import BrokerConfig, ConfigError, TopicConfig, topic_settings
from ..ha.peers import peer_topics
from ..store import incarnation
from ..zk.paths import ZkPaths
from .open_files import TopicsDoNotFit
from .registry import BrokerRegistry, RegistryError
from ..zk.topic_config import GroupTopics, decode_group_topics, delete_group_offsets, publish_with, read_group_topics, seed_with, serve_group_topics, update_group_topics

if TYPE_CHECKING:
    from ..ha.node import HaNode
    from ..security.settings import BrokerSecurity
    from ..store.manager import MessageStoreManager
    from .partitions import Partitions
    from .transactions import TransactionService


log = logging.getLogger(__name__)

#: How long a slave waits for its master to serve a new topic configuration.
CATCH_UP_S = 30
#: After a failed apply of a watched version: the first wait before applying it again, and the
#: longest (the wait doubles).
APPLY_RETRY_FIRST_S = 0.5
APPLY_RETRY_MAX_S = 30.0


class TopicsBroker(Protocol):
    """What applying the group's topic configuration uses of the broker (metaq.server.broker.Broker),
    and nothing more (tests/unit/test_broker_protocols.py holds the applier to it)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def local_topics(self) -> dict[str, TopicConfig]: ...

    @property
    def registry(self) -> BrokerRegistry | None:
        """Its ZooKeeper session (``client``) and the group's ACL (``security``); set once registered."""

    @property
    def store(self) -> MessageStoreManager:
        """Files of topics no longer served (``remove_unserved``)."""

    @property
    def ha(self) -> HaNode:
        """Whether it acts as master (``acting_master``), and a slave's ``follower``."""

    @property
    def security(self) -> BrokerSecurity:
        """Credentials for asking the master's topics as the group's slave (metaq/ha/peers.py)."""

    async def update_topics(self, topics: dict[str, TopicConfig]) -> None:
        """Serve this topic map (the one writer of the topics served)."""


class GroupTopicsApplier:
    def __init__(self, broker: TopicsBroker, seeds: bool) -> None:
        self.broker = broker
        #: A broker started without --slave adds its server.ini topics the group lacks.
        self.seeds = seeds
        self.paths = ZkPaths(broker.config.zk.root)
        self.node = self.paths.topic_config(broker.config.broker_id)
        self.group = GroupTopics()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        self._stopped = False
        self._catch_up: asyncio.Task[None] | None = None
        #: The newest version the watch delivered (a failed apply is retried until a newer one came).
        self._newest_seen = -1

    @property
    def client(self) -> Any:
        return self.broker.registry.client  # type: ignore[union-attr]

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        broker_id = self.broker.config.broker_id
        try:
            if self.seeds:
                group = await asyncio.to_thread(self._update, seed_with(self.broker.local_topics, self.broker.config.topic_defaults))
            else:
                group = await asyncio.to_thread(read_group_topics, self.client, self.paths, broker_id)
            await asyncio.to_thread(self.client.DataWatch, self.node, self._watch)
        except (KazooException, KazooTimeoutError, RuntimeError, ValueError) as exc:
            # Serving server.ini's topics instead could contradict the rest of the group.
            raise RegistryError(f"cannot read the group's topic configuration {self.node}: {exc!r}") from None
        await self.apply(group, at_start=True)

    def stop(self) -> None:
        self._stopped = True
        if self._catch_up is not None:
            self._catch_up.cancel()

    def _watch(self, data: bytes | None, stat: Any, *_: Any) -> bool:
        # kazoo's thread: hand the new value to the event loop, nothing else.
        loop = self._loop
        if self._stopped or loop is None or loop.is_closed():
            return False
        if data is not None and stat is not None:
            try:
                group = decode_group_topics(data, stat.version)
            except ValueError as exc:
                log.error("ignoring %s: %s", self.node, exc)
                return True
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._apply_watched(group)))
        return True

    async def _apply_watched(self, group: GroupTopics) -> None:
        """``apply`` for the watch: a failure is said (one line per attempt), not left in a task
        nobody awaits, and the version is applied again, backing off from APPLY_RETRY_FIRST_S to
        APPLY_RETRY_MAX_S, until it is served or a newer version is seen (whose own watch applies
        it: every version is the whole map). The watch never fires again for a version it delivered."""
        self._newest_seen = max(self._newest_seen, group.version)
        delay = APPLY_RETRY_FIRST_S
        while True:
            try:
                await self.apply(group)
                return
            except Exception as exc:
                log.error("applying version %d of the group's topic configuration failed: %r; trying again in %.1f s",
                          group.version, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, APPLY_RETRY_MAX_S)
            if self._stopped or self._newest_seen > group.version:
                return

    # --- applying ------------------------------------------------------------------------

    def overlay(self, topics: dict[str, TopicConfig]) -> dict[str, TopicConfig]:
        """The topic map to serve when something offers ``topics``: the group's, once it has one."""
        if not self.group.exists:
            return topics
        return self.served(self.group)

    def served(self, group: GroupTopics) -> dict[str, TopicConfig]:
        broker = self.broker
        return serve_group_topics(broker.config, broker.local_topics, group, self.node)

    async def apply(self, group: GroupTopics, at_start: bool = False) -> None:
        """Serve ``group``; one whose partitions cannot fit the open-file limit is refused: at start
        the broker does not start, later the partitions served stay as they are (one error line)."""
        async with self._lock:
            if not group.exists or group.version < self.group.version:
                return  # no node yet, or an older value overtaken by a newer one
            try:
                topics = self.served(group)
            except ConfigError as exc:
                log.error("not applying version %d of the group's topic configuration: %s", group.version, exc)
                return
            before = self.broker.config.topics
            # Stored offsets of a topic that ended, or of one created just now (an earlier
            # incarnation's, committed again by a consumer that ran on after the delete),
            # belong to no log this group serves; gone before the change is served, so a
            # consumer of the new topic never finds them.
            stale = ended_topics(before, topics) + sorted(set(topics) - set(before))
            if stale and self.broker.ha.acting_master:
                await self._delete_consumer_offsets(stale)
            # ``group`` names the version being served: set for the update (the broker's
            # ``overlay`` and its rule for deleting dropped files read it while it runs) and put
            # back if the update does not complete, so a version counts as applied only once
            # ``update_topics`` succeeded; a failed one is applied again (``_apply_watched``).
            previous, self.group = self.group, group
            try:
                await self.broker.update_topics(topics)
            except TopicsDoNotFit as exc:
                self.group = previous
                if at_start:
                    raise
                log.error("not applying version %d of the group's topic configuration: %s", group.version, exc)
                return
            except BaseException:
                self.group = previous
                raise
            self._remove_deleted_files(group)
            if self._catch_up is not None:
                self._catch_up.cancel()
            self._catch_up = asyncio.ensure_future(self._follow_new_partitions(topics))
            change = describe_change(before, topics)
            if change:
                log.info("topics: %s (broker group %d's topic configuration in ZooKeeper, version %d)",
                         change, self.broker.config.broker_id, group.version)

    async def _delete_consumer_offsets(self, topics: list[str]) -> None:
        """The master deletes the stored consumer offsets of its partitions of these topics."""
        broker_id = self.broker.config.broker_id
        for topic in topics:
            try:
                paths = await asyncio.to_thread(delete_group_offsets, self.client, self.paths, broker_id, topic)
            except (KazooException, KazooTimeoutError) as exc:
                log.warning("could not delete the stored consumer offsets of topic %s: %r", topic, exc)
                continue
            if paths:
                log.info("deleted %d stored consumer offset(s) of topic %s's earlier incarnation", len(paths), topic)

    def _remove_deleted_files(self, group: GroupTopics) -> None:
        """Files of deleted topics this broker kept (it was down, or ran a version that kept them),
        and of the partitions a topic re-created with fewer partitions no longer has."""
        broker = self.broker
        for name in sorted(group.deleted | set(group.topics)):
            local = broker.local_topics.get(name)
            broker.store.remove_unserved(name, local.data_path if local is not None else broker.config.topic_defaults.data_path)

    async def _follow_new_partitions(self, topics: dict[str, TopicConfig]) -> None:
        """On a slave: once the master serves these partitions too, replicate the new ones.

        The master applies the same version at about the same moment; until it has,
        its topics reply lacks them and the follower would skip them.
        """
        wanted = {name: topic.num_partitions for name, topic in topics.items()}
        deadline = time.monotonic() + CATCH_UP_S
        while not self._stopped and time.monotonic() < deadline:
            follower = self.broker.ha.follower
            master_url = follower.master_url if follower is not None and not self.broker.ha.acting_master else None
            if master_url is None:
                return  # a master, or a slave between masters: following (re)reads the topics itself
            # As the group's slave{k} (ha/peers.py): with security on an anonymous ask is refused.
            served = await peer_topics(self.broker, master_url, follower.slave.slave_id)
            if served is not None and all(served.get(name, 0) >= n for name, n in wanted.items()):
                follower.resync_topics()
                return
            await asyncio.sleep(0.1)
        if not self._stopped:
            log.warning("the master did not serve version %d of the topic configuration within %d s", self.group.version, CATCH_UP_S)

    async def publish(self, edits: dict[str, tuple[TopicConfig | None, TopicConfig]]) -> GroupTopics:
        """Write what a SIGHUP'd server.ini edit changed (topic -> its section before and after)."""
        return await asyncio.to_thread(self._update, publish_with(edits, self.broker.config.topic_defaults))

    def _update(self, change: Any) -> GroupTopics:
        """A compare-and-set write of the group's node, with the group's ZooKeeper ACL when security is on."""
        security = self.broker.registry.security  # type: ignore[union-attr]
        return update_group_topics(self.client, self.paths, self.broker.config.broker_id, change, security=security)


class PartitionHolders(Protocol):
    """What forgetting dropped partitions uses of the broker (metaq.server.broker.Broker): the
    partitions' owner and the two holders of per-partition state kept outside it, and nothing
    more (tests/unit/test_broker_protocols.py holds ``forget_partitions`` to it)."""

    @property
    def partitions(self) -> Partitions:
        """Each partition's owner (``drop``)."""

    @property
    def transactions(self) -> TransactionService:
        """Queued transaction markers (``forget_partitions``)."""

    @property
    def ha(self) -> HaNode:
        """The HA layer's per-partition tasks (``forget_partitions``)."""


def forget_partitions(broker: PartitionHolders, keys: list[tuple[str, int]]) -> None:
    """Every owner of per-partition state (docs/architecture.md) forgets partitions no longer served.

    Called by ``Broker._apply_topic_change`` right after the store dropped them (a topic deleted,
    or re-created as a new incarnation). ``Partitions.drop`` pops each partition's owner, and
    with it everything it holds: producer and transaction state, epoch history, its stats
    counters, its parked fetches (woken: they find the log gone and are answered "unknown
    topic"), and its replication record (slaves' positions, append history, a slave's replica,
    the slaves streaming it, told and fetching, and the sync set's offsets and waiting puts,
    which end with 404). What is left is held elsewhere: queued transaction markers (by
    transaction), and the HA layer's per-partition tasks (follower fetch tasks, the sync
    set's index of waiting partitions).
    """
    broker.partitions.drop(keys)
    broker.transactions.forget_partitions(keys)
    broker.ha.forget_partitions(keys)
    log.info("dropped %d partition(s) no longer served: %s", len(keys),
             ", ".join(f"{topic}-{partition}" for topic, partition in keys))


def ended_topics(before: dict[str, TopicConfig], after: dict[str, TopicConfig]) -> list[str]:
    """Topics whose incarnation ended: deleted, or re-created as a new one in between."""
    return sorted(name for name, topic in before.items() if incarnation.ended(topic, after.get(name)))


def describe_change(before: dict[str, TopicConfig], after: dict[str, TopicConfig]) -> str:
    """``added a; changed b (unflushThreshold 0 -> 5); removed c``, or "" when nothing changed."""
    parts = []
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = []
    for name in sorted(set(before) & set(after)):
        old, new = topic_settings(before[name]), topic_settings(after[name])
        diffs = [f"{key} {old[key]} -> {new[key]}" for key in old if old[key] != new[key]]
        if diffs:
            changed.append(f"{name} ({', '.join(diffs)})")
    if added:
        parts.append("now serving " + ", ".join(added))
    if changed:
        parts.append("changed " + "; ".join(changed))
    if removed:
        parts.append("no longer serving " + ", ".join(removed) + " (its files are deleted)")
    return "; ".join(parts)
