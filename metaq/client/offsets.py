"""Where a consumer group keeps its place: ZooKeeper (MetaQ's default) or a local JSON file.

A position is ``(msg_id, offset)``: the byte offset to fetch next and the id of the last
message consumed before it (-1 when unknown). ZooKeeper stores it as MetaQ does, the
string ``"{msgId}-{offset}"`` in ``/consumers/{group}/offsets/{topic}/{partition}``.

Topic incarnations (a topic deleted and re-created is a new one, with a new id in its
group's topic configuration, metaq/zk/topic_config.py): an offset of one incarnation must
never be applied to another. The ZooKeeper offsets are deleted by the brokers when the topic
is deleted or created. A store the brokers cannot reach (a local file, a SQL database)
keeps beside each offset the incarnation it was committed in (``keeps_incarnations``), and
``applies`` is the rule on loading one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import NamedTuple, Protocol

from kazoo.exceptions import NoNodeError, NodeExistsError

from ..zk.paths import NO_MSG_ID, format_offset, parse_offset
from .cluster import Cluster
from .message import Partition

log = logging.getLogger(__name__)


class Position(NamedTuple):
    msg_id: int
    offset: int


def applies(stored: str | None, current: str | None) -> bool:
    """Whether an offset committed in incarnation ``stored`` applies to the topic's ``current`` one.

    Invariant: an offset of another incarnation of the topic is never applied (the consumer
    starts from its start position instead, as for a group that never committed). Only a
    ``metaq topics create`` gives a topic an id, so an offset committed while the topic had
    none ("") does not apply once it has one. Kept, because nothing is dropped on a guess: an
    offset stored without an incarnation (``None``: by a version that did not record them),
    and any offset while the current incarnation is unknown (``None``: the group's
    configuration unreadable) or the topic has no id ("": a server.ini topic).
    """
    return stored is None or not current or stored == current


def stored_applies(where: str, stored: str | None, current: str | None) -> bool:
    """``applies``, saying once in the log why a stored offset is not used."""
    if applies(stored, current):
        return True
    log.warning("%s: the stored offset belongs to another incarnation of the topic (%s, now %s): not applied; "
                "starting from the consumer's start position", where, stored or "none", current)
    return False


class OffsetStore(Protocol):
    async def load(self, group: str, topic: str, partition: Partition) -> Position | None: ...

    async def commit(self, group: str, topic: str, positions: dict[Partition, Position]) -> None: ...


class ZkOffsetStore:
    """Persistent znodes, one per partition, shared by the whole group."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def load(self, group: str, topic: str, partition: Partition) -> Position | None:
        path = self.cluster.paths.offset(group, topic, str(partition))
        try:
            data, _ = await self.cluster.call(self.cluster.zk.get, path)
        except NoNodeError:
            return None
        return Position(*parse_offset(data))

    async def commit(self, group: str, topic: str, positions: dict[Partition, Position]) -> None:
        if positions:
            await self.cluster.call(self._write_all, group, topic, dict(positions))

    def _write_all(self, group: str, topic: str, positions: dict[Partition, Position]) -> None:
        zk = self.cluster.zk
        for partition, position in positions.items():
            path = self.cluster.paths.offset(group, topic, str(partition))
            value = format_offset(position.msg_id, position.offset).encode("utf-8")
            try:
                zk.set(path, value)
            except NoNodeError:
                try:
                    zk.create(path, value, makepath=True)
                except NodeExistsError:
                    zk.set(path, value)


#: The key of a topic's incarnations in the local file (no partition name ``{id}-{n}`` can be it).
INCARNATIONS_KEY = "incarnations"


class LocalOffsetStore:
    """One JSON file ``{"group": {"topic": {"0-1": "msgId-offset", "incarnations": {"0-1": "5f0c…"}}}}``,
    rewritten atomically; ``incarnations`` holds the topic incarnation each offset was committed
    in (absent for an offset whose incarnation was unknown; a file of an older version has none).

    Used for broadcast consumers (each member keeps its own place) and wherever offsets
    should not live in ZooKeeper. One file per consumer: two processes must not share it.
    """

    #: Loads and commits take the topic's incarnation (``applies`` decides on load).
    keeps_incarnations = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = asyncio.Lock()

    def _read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ValueError(f"offset file {self.path} is unreadable: {exc}") from None

    async def load(self, group: str, topic: str, partition: Partition, incarnation: str | None = None) -> Position | None:
        """The stored position, or None: never committed, or committed in another incarnation than ``incarnation``."""
        stored = self._read().get(group, {}).get(topic, {})
        value = stored.get(str(partition))
        where = f"{self.path}: group {group} {topic}-{partition}"
        if value is None or not stored_applies(where, stored.get(INCARNATIONS_KEY, {}).get(str(partition)), incarnation):
            return None
        return Position(*parse_offset(value))

    async def commit(self, group: str, topic: str, positions: dict[Partition, Position],
                     incarnations: dict[Partition, str | None] | None = None) -> None:
        """Store ``positions``, each with the incarnation it belongs to (``incarnations``; None: unknown)."""
        if not positions:
            return
        incarnations = incarnations or {}
        async with self._lock:
            data = self._read()
            stored = data.setdefault(group, {}).setdefault(topic, {})
            for partition, position in positions.items():
                stored[str(partition)] = format_offset(position.msg_id, position.offset)
                known = stored.setdefault(INCARNATIONS_KEY, {})
                if incarnations.get(partition) is None:
                    known.pop(str(partition), None)
                else:
                    known[str(partition)] = incarnations[partition]
                if not known:
                    del stored[INCARNATIONS_KEY]
            self._write(data)

    def _write(self, data: dict) -> None:
        # Write-then-rename: a crash leaves either the old file or the new one, never half of one.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name, dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(data, handle, indent=1, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def initial_position(offset: int) -> Position:
    return Position(NO_MSG_ID, offset)
