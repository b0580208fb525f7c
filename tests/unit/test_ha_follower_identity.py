"""The coordinator's follower (metaq/ha/followership.py : _ensure_follower): one per slave id.

A broker started without --slave that must follow takes the smallest free slave id; after a
term as master it may come back under another one. The follower of the old id was dropped
while still running: its heartbeat task and its ZooKeeper watch of the master's config
checksum went on beside the new follower's. It is stopped now before the new one starts.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from metaq.config import SlaveConfig
from metaq.ha import followership as followership_module
from metaq.ha.coordinator import HaCoordinator
from metaq.ha.progress import ReplicationProgress


class FakeFollower:
    made: list["FakeFollower"] = []

    def __init__(self, host: object, slave: SlaveConfig, *_: object, **__: object) -> None:
        self.slave = slave
        self.started = self.stopped = False
        FakeFollower.made.append(self)

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


def test_a_new_slave_id_stops_the_old_follower_before_the_new_one_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(followership_module, "MasterFollower", FakeFollower)
    FakeFollower.made = []
    config = SimpleNamespace(broker_id=0, zk=SimpleNamespace(root="/meta"))
    host = SimpleNamespace(config=config, registry=SimpleNamespace(client=object(), url="meta://127.0.0.1:9001"))
    coordinator = HaCoordinator(host, None, ReplicationProgress())  # type: ignore[arg-type]

    async def follow_as(*slave_ids: int) -> None:
        for slave_id in slave_ids:
            await coordinator.followership._ensure_follower(SlaveConfig(slave_id=slave_id, slave_group=f"g{slave_id}"))
        await asyncio.sleep(0)  # let the last follower's start run

    asyncio.run(follow_as(0, 0, 1))
    first, second = FakeFollower.made
    assert coordinator.followership.follower is second and second.slave.slave_id == 1, "the same id reuses its follower"
    assert first.stopped, "the follower of the old slave id is stopped, not left running"
    assert second.started and not second.stopped
