"""After ZooKeeper lost its data (metaq/ha/coordinator.py, group_view.py): a broker never follows a master
whose epoch is older than its own history (it was down while the group was re-seeded
without it, and following would cut messages only it may hold)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from metaq.ha import group_view as group_view_module
from metaq.ha.coordinator import HaCoordinator
from metaq.ha.epochs import EpochCache
from metaq.ha.progress import ReplicationProgress
from metaq.ha.role import Event

from .ha_support import fake_registry

MY_URL, MASTER = "meta://127.0.0.1:9001", "meta://127.0.0.1:9002"


def member_with_history(tmp_path: Path, newest_epoch: int) -> HaCoordinator:
    config = SimpleNamespace(broker_id=0, zk=SimpleNamespace(root="/meta"))
    store = SimpleNamespace(logs=lambda: {("t", 0): object()})
    history = SimpleNamespace(epochs=EpochCache(tmp_path, [(1, 0), (newest_epoch, 500)]))  # the partition's owner
    partitions = SimpleNamespace(get=lambda topic, partition: history)
    host = SimpleNamespace(config=config, store=store, partitions=partitions,
                           registry=fake_registry(MY_URL))
    coordinator = HaCoordinator(host, None, ReplicationProgress())  # type: ignore[arg-type]
    return coordinator


def zookeeper_says(monkeypatch: pytest.MonkeyPatch, epoch: int) -> None:
    state = SimpleNamespace(epoch=epoch, master_url=MASTER, leader_url=MASTER, leader_identity="the-master")
    monkeypatch.setattr(group_view_module, "read_group_state", lambda *_, **__: state)


async def decide_master(coordinator: HaCoordinator) -> Event:
    coordinator._post_master(MASTER)
    pending, _ = coordinator._events.get_nowait()
    return await pending()  # type: ignore[operator]


def test_a_master_below_our_history_is_not_followed_and_said_once(tmp_path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    coordinator = member_with_history(tmp_path, newest_epoch=5)
    zookeeper_says(monkeypatch, epoch=3)
    with caplog.at_level(logging.ERROR):
        assert asyncio.run(decide_master(coordinator)) is Event.MASTER_SEEN  # ignored in every state
        assert asyncio.run(decide_master(coordinator)) is Event.MASTER_SEEN
    refusals = [r.getMessage() for r in caplog.records if "not following the master" in r.getMessage()]
    assert len(refusals) == 1 and "epoch 3, older than epoch 5" in refusals[0], refusals


def test_a_master_at_or_above_our_history_is_followed(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    coordinator = member_with_history(tmp_path, newest_epoch=5)
    for epoch in (5, 6):
        zookeeper_says(monkeypatch, epoch=epoch)
        assert asyncio.run(decide_master(coordinator)) is Event.MASTER_CHANGED
