"""Every ZooKeeper call of the role machine runs on the registry's one ordered worker
(metaq/ha/group_view.py : GroupView.call, metaq/server/registry.py : BrokerRegistry.call),
and what the coordinator's parts start is awaited when it stops."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from metaq.config import SlaveConfig
from metaq.ha import followership as followership_module
from metaq.ha.coordinator import HaCoordinator
from metaq.ha.progress import ReplicationProgress
from metaq.zk.group import GroupState

ROOT = Path(__file__).resolve().parents[2]
#: The role machine's modules: none of them may call ZooKeeper from a thread of its own.
ROLE_MACHINE = ["coordinator.py", "group_view.py", "leadership.py", "followership.py", "candidacy.py", "node.py"]


def test_no_module_of_the_role_machine_calls_zookeeper_off_the_registrys_worker() -> None:
    offenders = []
    for name in ROLE_MACHINE:
        for number, line in enumerate((ROOT / "metaq" / "ha" / name).read_text().splitlines(), 1):
            if re.search(r"to_thread\(|run_in_executor\(", line) and re.search(r"\bzk\b|client|paths", line):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, offenders


def recording_coordinator(answers: dict[str, Any] | None = None) -> tuple[HaCoordinator, list[str]]:
    """A coordinator whose registry's ``call`` records what it runs and answers for ZooKeeper."""
    calls: list[str] = []

    async def call(func: Callable[..., Any], *args: Any) -> Any:
        calls.append(func.__name__)
        return (answers or {})[func.__name__]

    config = SimpleNamespace(broker_id=0, zk=SimpleNamespace(root="/meta"))
    registry = SimpleNamespace(client=object(), url="meta://127.0.0.1:9001", call=call, slave_id=None, session_id=7)
    coordinator = HaCoordinator(SimpleNamespace(config=config, registry=registry), None, ReplicationProgress())  # type: ignore[arg-type]
    return coordinator, calls


def test_the_group_views_reads_and_writes_go_through_the_registrys_call() -> None:
    state = GroupState(master_url=None, epoch=3, epoch_version=2, leader_url=None, sync_set=None, sync_set_epoch=None)
    answers = {"read_group_state": state, "_release_lock": True, "try_take_master": 4, "read_handover": None,
               "_free_slave_id": 2}
    coordinator, calls = recording_coordinator(answers)
    view = coordinator.view

    async def scenario() -> None:
        assert await view.read_state() is state
        assert await view.release_lock() is True
        assert await view.take_master(state, None, 0, None) == 4
        assert await view.read_handover() is None
        assert await view.free_slave_id() == 2

    asyncio.run(scenario())
    assert calls == ["read_group_state", "_release_lock", "try_take_master", "read_handover", "_free_slave_id"], calls


class SlowStart:
    def __init__(self, _host: object, slave: SlaveConfig, *_: object, **__: object) -> None:
        self.slave = slave
        self.started = False

    async def start(self) -> None:
        await asyncio.sleep(0.05)
        self.started = True

    async def stop(self) -> None:
        pass


def test_stopping_the_followership_awaits_the_followers_start(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(followership_module, "MasterFollower", SlowStart)
    coordinator, _ = recording_coordinator()
    followership = coordinator.followership

    async def scenario() -> SlowStart:
        follower = await followership._ensure_follower(SlaveConfig(slave_id=1, slave_group="g"))
        await followership.stop()
        return follower  # type: ignore[return-value]

    assert asyncio.run(scenario()).started, "the start task was left running past stop"
