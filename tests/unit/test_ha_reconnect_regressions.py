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
from metaq.ha import group_view as group_view_module
from metaq.ha.coordinator import HaCoordinator
from metaq.ha.progress import ReplicationProgress
from metaq.ha.role import Event, Role
from metaq.zk.group import GroupState

from .ha_support import fake_registry

MY_URL = "meta://127.0.0.1:9001"


def fenced_master() -> HaCoordinator:
    config = SimpleNamespace(broker_id=0, zk=SimpleNamespace(root="/meta"))
    host = SimpleNamespace(config=config, registry=fake_registry(MY_URL))
    coordinator = HaCoordinator(host, None, ReplicationProgress())  # type: ignore[arg-type]
    coordinator.machine.state = Role.FENCED
    coordinator.epochs.saw(1)
    return coordinator


def test_regression_an_unanswered_read_after_a_reconnect_does_not_end_the_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[object] = [ConnectionLoss(), SimpleNamespace(epoch=1, master_url=MY_URL)]

    def read_group_state(*_: object) -> GroupState:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    monkeypatch.setattr(group_view_module, "read_group_state", read_group_state)
    coordinator = fenced_master()

    unanswered = asyncio.run(coordinator.view.reconnected())
    assert unanswered is not Event.RECONNECTED_EPOCH_LOST, "an unanswered read must not end our epoch"
    coordinator.machine.handle(unanswered)
    assert coordinator.machine.state is Role.FENCED, "fenced (acking nothing) until ZooKeeper answers"

    answered = asyncio.run(coordinator.view.reconnected())
    assert answered is Event.RECONNECTED_SAME_EPOCH
    coordinator.machine.handle(answered)
    assert coordinator.machine.state is Role.LEADING


def test_a_reconnect_that_finds_another_master_still_ends_the_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_view_module, "read_group_state",
                        lambda *_: SimpleNamespace(epoch=2, master_url="meta://127.0.0.1:9002"))
    coordinator = fenced_master()
    event = asyncio.run(coordinator.view.reconnected())
    assert event is Event.RECONNECTED_EPOCH_LOST
    coordinator.machine.handle(event)
    assert coordinator.machine.state is Role.ORPHANED


def queued_events(coordinator: HaCoordinator) -> list[object]:
    events = []
    while not coordinator._events.empty():
        events.append(coordinator._events.get_nowait()[0])
    return events


def test_regression_zookeeper_dropping_a_new_leader_fences_it_instead_of_retiring_it() -> None:
    """The same 300 s run after the fix above: the reconnect read was answered, the master
    led again, and then publishing its sync set met the dropped connection (ConnectionLoss).
    Any failure to take up leading counted as "this broker cannot serve": it released the
    lock and refused to lead until restarted, while the slave was not eligible (an empty
    sync set): the group had no master for the rest of the run."""
    coordinator = fenced_master()
    coordinator.machine.state = Role.LEADING

    async def fail() -> list[object]:
        await coordinator._entry_failed(Role.LEADING, ConnectionLoss())
        return queued_events(coordinator)

    assert asyncio.run(fail()) == [Event.SUSPENDED]
    assert coordinator.cannot_lead is None, "a ZooKeeper blip is no reason to never lead again"
    coordinator.machine.handle(Event.SUSPENDED)
    assert coordinator.machine.state is Role.FENCED


def test_regression_a_failed_start_of_following_follows_the_same_master_again() -> None:
    """Found by python -m chaos run --scenario kill-master --secure: the returning old
    master's truncation check failed (its new master refused the offset query); the
    coordinator had already noted the master as followed, so the next look at ZooKeeper saw
    "the master we follow" and did nothing: a slave that replicated nothing, for good."""
    coordinator = fenced_master()
    coordinator.machine.state = Role.FOLLOWING
    coordinator.master_url = "meta://127.0.0.1:9002"
    asyncio.run(coordinator._entry_failed(Role.FOLLOWING, ConnectionError("offset chaos-0: 403")))
    assert coordinator.master_url is None, "the master seen next must count as changed, to be followed again"


def test_a_new_leader_that_cannot_serve_resigns_through_the_table() -> None:
    """The other side of the fix above: a failure of this broker's own (a log that cannot
    open) gives the lock back, as a row of the table (CANNOT_LEAD -> RESIGNED, whose entry
    action releases the lock on the event worker), and keeps it from leading again."""
    coordinator = fenced_master()
    coordinator.machine.state = Role.LEADING

    async def fail() -> list[object]:
        await coordinator._entry_failed(Role.LEADING, OSError("no space left on device"))
        return queued_events(coordinator)

    assert asyncio.run(fail()) == [Event.CANNOT_LEAD]
    assert coordinator.cannot_lead == "OSError: no space left on device"
    coordinator.machine.handle(Event.CANNOT_LEAD)
    assert coordinator.machine.state is Role.RESIGNED


def test_a_broker_that_failed_to_lead_may_try_again_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Campaign seed 5103: kazoo raised "xids do not match" (a connection reset mid-call, not a
    ZooKeeper error type) while a new master registered itself; it stepped down for good, and
    its group, whose sync set named no other member, had no master for the rest of the run.
    The failure keeps it from leading for CANNOT_LEAD_RETRY_S, not forever."""
    coordinator = fenced_master()
    coordinator.machine.state = Role.LEADING

    async def fail() -> None:
        await coordinator._entry_failed(Role.LEADING, RuntimeError("xids do not match"))

    asyncio.run(fail())
    assert coordinator._cannot_lead_now() == "RuntimeError: xids do not match", "not at once"
    monkeypatch.setattr(coordinator_module, "CANNOT_LEAD_RETRY_S", 0.0)
    assert coordinator._cannot_lead_now() is None, "after the wait it may lead again"
    assert coordinator.cannot_lead is None


def test_waiting_for_a_dead_master_gives_up_once_an_event_is_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    """Campaign seed 6201 (hosts mode): a slave set out to follow a master that had just died
    and waited up to 30 s for its port, refused; the new master's election waited in the
    queue meanwhile, and the slave stayed out of its sync set for 63 s. The wait now ends as
    soon as an event is pending, and the event is handled next."""
    import time

    from metaq.client.connection import ConnectionClosed
    from metaq.ha import followership as followership_module
    from metaq.ha.followership import MasterSuperseded

    coordinator = fenced_master()
    coordinator.machine.state = Role.FOLLOWING
    coordinator.host.registry.slave_id = 0
    attempts = []

    async def refused(*_args: object, **_kw: object) -> object:
        attempts.append(time.monotonic())
        if len(attempts) == 2:
            coordinator.post(Event.MASTER_GONE)  # the dead master's lock expired meanwhile
        raise ConnectionClosed("cannot connect to 127.0.0.1:9002: [Errno 111] Connection refused")

    monkeypatch.setattr(followership_module, "open_peer", refused)
    started = time.monotonic()

    async def follow() -> None:
        await coordinator.followership.truncate_against("meta://127.0.0.1:9002")

    with pytest.raises(MasterSuperseded):
        asyncio.run(follow())
    assert time.monotonic() - started < 2, "gave up at once, not at the 30 s deadline"
    assert len(attempts) == 2
    assert queued_events(coordinator) == [Event.MASTER_GONE], "the event is still there to be handled"
