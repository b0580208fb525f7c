"""Stopping a slave whose master cannot be reached is prompt (metaq/ha/coordinator.py).

A slave following a master it cannot log in to (or reach) sits in ``_truncate_against``,
retrying for up to 30 s; STOP waited behind it until ``stop()``'s own 10 s bound cancelled
the worker (seen as a 10 s teardown in tests/integration/test_trust_fake_master.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from metaq.client.connection import ConnectionClosed
from metaq.ha import followership as followership_module
from metaq.ha.coordinator import HaCoordinator
from metaq.ha.progress import ReplicationProgress


def slave() -> HaCoordinator:
    config = SimpleNamespace(broker_id=0, zk=SimpleNamespace(root="/meta"))
    host = SimpleNamespace(config=config, registry=SimpleNamespace(client=object(), url="meta://127.0.0.1:9001",
                                                                   slave_id=0))
    return HaCoordinator(host, None, ReplicationProgress())  # type: ignore[arg-type]


def test_waiting_for_an_unreachable_master_ends_once_the_broker_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = []

    async def open_peer(*_: object, **__: object) -> None:
        attempts.append(1)
        raise ConnectionClosed("cannot connect to 127.0.0.1:1: refused")

    monkeypatch.setattr(followership_module, "open_peer", open_peer)
    coordinator = slave()

    async def scenario() -> None:
        waiting = asyncio.ensure_future(coordinator.followership.truncate_against("meta://127.0.0.1:1"))
        await asyncio.sleep(0.5)
        assert not waiting.done() and len(attempts) >= 2  # retries while the broker runs
        coordinator.followership.stopping = True  # what stop() sets before posting STOP
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(waiting, 1.0)

    asyncio.run(scenario())
