"""Where a consumer group keeps its place: ZooKeeper (MetaQ's default) or a local JSON file.

A position is ``(msg_id, offset)``: the byte offset to fetch next and the id of the last
message consumed before it (-1 when unknown). ZooKeeper stores it as MetaQ does, the
string ``"{msgId}-{offset}"`` in ``/consumers/{group}/offsets/{topic}/{partition}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import NamedTuple, Protocol

from kazoo.exceptions import NoNodeError, NodeExistsError

from ..zk.paths import NO_MSG_ID, format_offset, parse_offset
from .cluster import Cluster
from .message import Partition


class Position(NamedTuple):
    msg_id: int
    offset: int


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


class LocalOffsetStore:
    """One JSON file ``{"group": {"topic": {"0-1": "msgId-offset"}}}``, rewritten atomically.

    Used for broadcast consumers (each member keeps its own place) and wherever offsets
    should not live in ZooKeeper. One file per consumer: two processes must not share it.
    """

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

    async def load(self, group: str, topic: str, partition: Partition) -> Position | None:
        value = self._read().get(group, {}).get(topic, {}).get(str(partition))
        return Position(*parse_offset(value)) if value is not None else None

    async def commit(self, group: str, topic: str, positions: dict[Partition, Position]) -> None:
        if not positions:
            return
        async with self._lock:
            data = self._read()
            stored = data.setdefault(group, {}).setdefault(topic, {})
            for partition, position in positions.items():
                stored[str(partition)] = format_offset(position.msg_id, position.offset)
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
