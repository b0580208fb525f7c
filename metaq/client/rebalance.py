"""Consumer-group balancing over ZooKeeper, as in MetaQ and Kafka's old high-level consumer.

Every member registers ``/consumers/{g}/ids/{g}_{cid}`` (ephemeral) and watches the ids
and the topic's partitions. On any change each member computes, from the same sorted
lists, the same contiguous split (``assign_range``), so no coordinator is needed. A member
then stops the fetchers it gives up, commits their offsets and deletes their owner
znodes, and claims its new partitions by creating ``/consumers/{g}/owners/{topic}/{part}``
(ephemeral). A claim waits while the previous owner still holds the node: that owner is
either releasing it in its own rebalance, or dead, and then ZooKeeper deletes its
ephemeral nodes when its session expires. So a partition never has two owners, and the
new owner starts from the offset the old one committed last.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Protocol, Sequence

from kazoo.exceptions import NodeExistsError, NoNodeError

from .cluster import Cluster
from .message import Partition

log = logging.getLogger(__name__)


def assign_range(partitions: Sequence[Partition], consumers: Sequence[str], me: str) -> list[Partition]:
    """The contiguous share of ``me``: sorted partitions cut into ``len(consumers)`` ranges.

    The first ``len(partitions) % len(consumers)`` consumers (in sorted order) get one
    extra partition. A consumer not in the list gets nothing.
    """
    ordered = sorted(set(partitions))
    members = sorted(set(consumers))
    if me not in members or not ordered:
        return []
    index = members.index(me)
    per, extra = divmod(len(ordered), len(members))
    start = index * per + min(index, extra)
    return ordered[start : start + per + (1 if index < extra else 0)]


class Assignment(Protocol):
    """How a consumer learns which partitions of a topic are its own."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def compute(self, topic: str, partitions: list[Partition]) -> list[Partition]: ...

    async def claim(self, topic: str, partition: Partition) -> bool: ...

    async def release(self, topic: str, partition: Partition) -> None: ...


class BroadcastAssignment:
    """Broadcast mode: every member reads every partition; no ids, no owners."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.on_change = on_change

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def compute(self, topic: str, partitions: list[Partition]) -> list[Partition]:
        return sorted(partitions)

    async def claim(self, topic: str, partition: Partition) -> bool:
        return True

    async def release(self, topic: str, partition: Partition) -> None:
        pass


class GroupAssignment:
    """Clustering mode: ids and owners znodes, range assignment."""

    def __init__(self, cluster: Cluster, group: str, consumer_id: str, topics: Callable[[], list[str]], on_change: Callable[[], None]) -> None:
        self.cluster = cluster
        self.group = group
        self.consumer_id = consumer_id
        self.node_name = f"{group}_{consumer_id}"
        self._topics = topics
        self._on_change = on_change
        self._changed = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._register()
        self.cluster.add_session_listener(self._on_new_session)
        self._watch_task = asyncio.create_task(self._watch_ids(), name=f"metaq-group-{self.group}")

    async def stop(self) -> None:
        self.cluster.remove_session_listener(self._on_new_session)
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.gather(self._watch_task, return_exceptions=True)
        path = self.cluster.paths.consumer_id(self.group, self.consumer_id)
        try:
            await self.cluster.call(self.cluster.zk.delete, path)
        except NoNodeError:
            pass

    async def _register(self) -> None:
        path = self.cluster.paths.consumer_id(self.group, self.consumer_id)
        value = ",".join(sorted(self._topics())).encode("utf-8")
        zk = self.cluster.zk

        def create() -> None:
            try:
                zk.create(path, value, ephemeral=True, makepath=True)
            except NodeExistsError:
                zk.set(path, value)

        await self.cluster.call(create)

    def _on_new_session(self) -> None:
        # Our ids and owner nodes died with the old session: register again, then rebalance.
        async def again() -> None:
            await self._register()
            self._on_change()

        asyncio.ensure_future(again())

    async def _watch_ids(self) -> None:
        path = self.cluster.paths.consumer_ids(self.group)
        watch = self.cluster.threadsafe_trigger(self._changed)
        while True:
            try:
                await self.cluster.call(self.cluster.zk.get_children, path, watch=watch)
            except Exception as exc:
                log.warning("cannot watch %s: %s", path, exc)
                await asyncio.sleep(0.5)
                continue
            await self._changed.wait()
            self._changed.clear()
            self._on_change()

    async def compute(self, topic: str, partitions: list[Partition]) -> list[Partition]:
        path = self.cluster.paths.consumer_ids(self.group)
        children = await self.cluster.call(self.cluster.zk.get_children, path)
        members = []
        for child in children:
            # Only members that subscribed to this topic share its partitions.
            try:
                data, _ = await self.cluster.call(self.cluster.zk.get, f"{path}/{child}")
            except NoNodeError:
                continue
            if topic in data.decode("utf-8").split(","):
                members.append(child)
        if self.node_name not in members:
            members.append(self.node_name)  # our node may not be visible yet after a new session
        mine = assign_range(partitions, members, self.node_name)
        log.info(
            "group %s topic %s: %d partition(s), %d member(s); %s takes %s",
            self.group, topic, len(partitions), len(members), self.consumer_id, [str(p) for p in mine],
        )
        return mine

    async def claim(self, topic: str, partition: Partition) -> bool:
        """Create the owner node; False while someone else owns the partition."""
        path = self.cluster.paths.owner(self.group, topic, str(partition))
        zk = self.cluster.zk
        me = self.node_name.encode("utf-8")

        def create() -> bool:
            try:
                zk.create(path, me, ephemeral=True, makepath=True)
                return True
            except NodeExistsError:
                try:
                    data, stat = zk.get(path)
                except NoNodeError:
                    return False
                # Ours already (e.g. a rebalance repeated): only if it is of our live session.
                return data == me and stat.ephemeralOwner == zk.client_id[0]

        return await self.cluster.call(create)

    async def release(self, topic: str, partition: Partition) -> None:
        path = self.cluster.paths.owner(self.group, topic, str(partition))
        zk = self.cluster.zk
        me = self.node_name.encode("utf-8")

        def delete() -> None:
            try:
                data, _ = zk.get(path)
                if data == me:
                    zk.delete(path)
            except NoNodeError:
                pass

        await self.cluster.call(delete)


ClaimCallback = Callable[[str, Partition], Awaitable[None]]


async def claim_all(
    assignment: Assignment,
    topic: str,
    partitions: list[Partition],
    on_claimed: ClaimCallback,
    timeout: float,
    interrupted: Callable[[], bool],
) -> list[Partition]:
    """Claim each partition, waiting for previous owners; returns the ones still not claimed.

    Gives up early when ``interrupted()`` says a newer rebalance is due (the caller
    restarts with fresh lists), or after ``timeout`` seconds.
    """
    left = list(partitions)
    deadline = time.monotonic() + timeout
    delay = 0.05
    while left:
        still = []
        for partition in left:
            if await assignment.claim(topic, partition):
                await on_claimed(topic, partition)
            else:
                still.append(partition)
        left = still
        if not left or interrupted() or time.monotonic() > deadline:
            break
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)
    return left
