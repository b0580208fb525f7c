"""Regression found by the chaos suite (python -m chaos run --scenario random --seconds 300
--seed 21 --zk-nodes 3): reads stopped for 4.75 s while ZooKeeper had no quorum.

Two of three ZooKeeper nodes were killed. The master's connection dropped (FENCED), kazoo
reconnected at once to the surviving node, which had not yet noticed it had lost its
quorum and took the session back, and then closed the connection before answering the
master's read of the group's state. The coordinator took that unanswered read for "our
epoch is gone": FENCED -> ORPHANED. An orphaned former master serves no reads (it never
followed anyone, so it knows of nothing committed), and once the quorum was back it
re-registered as a slave and took a new epoch: reads stopped for the whole quorum loss.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from kazoo.exceptions import ConnectionLoss

from metaq.ha import coordinator as coordinator_module
from metaq.ha.coordinator import HaCoordinator
from metaq.ha.progress import ReplicationProgress
from metaq.ha.role import Event, Role
from metaq.zk.group import GroupState

MY_URL = "meta://127.0.0.1:9001"


def fenced_master() -> HaCoordinator:
    config = SimpleNamespace(broker_id=0, zk=SimpleNamespace(root="/meta"))
    host = SimpleNamespace(config=config, registry=SimpleNamespace(client=object(), url=MY_URL))
    coordinator = HaCoordinator(host, None, ReplicationProgress())  # type: ignore[arg-type]
    coordinator.machine.state = Role.FENCED
    coordinator.epoch = 1
    return coordinator


def test_regression_an_unanswered_read_after_a_reconnect_does_not_end_the_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[object] = [ConnectionLoss(), SimpleNamespace(epoch=1, master_url=MY_URL)]

    def read_group_state(*_: object) -> GroupState:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    monkeypatch.setattr(coordinator_module, "read_group_state", read_group_state)
    coordinator = fenced_master()

    unanswered = asyncio.run(coordinator._reconnected())
    assert unanswered is not Event.RECONNECTED_EPOCH_LOST, "an unanswered read must not end our epoch"
    coordinator.machine.handle(unanswered)
    assert coordinator.machine.state is Role.FENCED, "fenced (acking nothing) until ZooKeeper answers"

    answered = asyncio.run(coordinator._reconnected())
    assert answered is Event.RECONNECTED_SAME_EPOCH
    coordinator.machine.handle(answered)
    assert coordinator.machine.state is Role.LEADING


def test_a_reconnect_that_finds_another_master_still_ends_the_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module, "read_group_state",
                        lambda *_: SimpleNamespace(epoch=2, master_url="meta://127.0.0.1:9002"))
    coordinator = fenced_master()
    event = asyncio.run(coordinator._reconnected())
    assert event is Event.RECONNECTED_EPOCH_LOST
    coordinator.machine.handle(event)
    assert coordinator.machine.state is Role.ORPHANED
