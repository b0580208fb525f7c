"""GroupTopicsApplier.apply records a version as applied only once the broker serves it.

A fake broker stands for metaq.server.broker.Broker (the ``TopicsBroker`` protocol): its
``update_topics`` fails on demand, and reads the applier's overlay as the real one does.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from metaq.config import TopicConfig, parse_server_ini
from metaq.server import group_topics
from metaq.server.group_topics import GroupTopicsApplier
from metaq.zk.topic_config import decode_group_topics


class FakeBroker:
    """Serves whatever ``update_topics`` is given, through the applier's overlay, or fails."""

    def __init__(self) -> None:
        self.config = parse_server_ini(b"[system]\nbrokerId=3\n[zookeeper]\nzk.zkConnect=127.0.0.1:1\n")
        self.local_topics: dict[str, TopicConfig] = {}
        self.registry = None
        self.store = SimpleNamespace(remove_unserved=lambda name, data_path: None)
        self.ha = SimpleNamespace(acting_master=False, follower=None)
        self.security = None
        self.applier: GroupTopicsApplier | None = None
        self.failures = 0  # the next updates that fail
        self.updates = 0
        self.served: dict[str, TopicConfig] = {}

    async def update_topics(self, topics: dict[str, TopicConfig]) -> None:
        self.updates += 1
        assert self.applier is not None
        topics = self.applier.overlay(topics)  # as Broker.update_topics: the group's configuration wins
        if self.failures:
            self.failures -= 1
            raise OSError("the store could not lay out a partition directory")
        self.served = topics


def version(number: int, *topics: str) -> Any:
    body = ",".join(f'"{name}":{{"numPartitions":"2"}}' for name in topics)
    return decode_group_topics(f'{{"topics":{{{body}}},"deleted":[]}}'.encode(), number)


async def serving_version_1(failures: int) -> tuple[FakeBroker, GroupTopicsApplier]:
    """A broker serving version 1 (topic ``a``) whose next ``failures`` updates fail."""
    broker = FakeBroker()
    applier = GroupTopicsApplier(broker, seeds=False)  # type: ignore[arg-type]
    broker.applier = applier
    await applier.apply(version(1, "a"))
    assert applier.group.version == 1 and set(broker.served) == {"a"}
    broker.failures = failures
    return broker, applier


def test_a_version_whose_update_failed_is_not_recorded_as_applied_and_is_applied_again() -> None:
    async def run() -> None:
        broker, applier = await serving_version_1(failures=1)
        with pytest.raises(OSError):
            await applier.apply(version(2, "a", "b"))
        # Not served, so not applied: the version recorded is still the one served.
        assert applier.group.version == 1 and set(broker.served) == {"a"}
        assert set(applier.overlay({})) == {"a"}, "the map offered to the broker is still version 1's"

        await applier.apply(version(2, "a", "b"))  # applied again: served this time
        assert applier.group.version == 2 and set(broker.served) == {"a", "b"}

    asyncio.run(run())


def test_a_watched_version_that_failed_is_retried_until_served(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(group_topics, "APPLY_RETRY_FIRST_S", 0.01)
    monkeypatch.setattr(group_topics, "APPLY_RETRY_MAX_S", 0.02)

    async def run() -> None:
        broker, applier = await serving_version_1(failures=2)
        await applier._apply_watched(version(2, "a", "b"))
        assert broker.updates == 1 + 3, "failed twice, applied the third time"
        assert applier.group.version == 2 and set(broker.served) == {"a", "b"}

    asyncio.run(run())
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 2 and all("version 2" in line and "trying again" in line for line in failures)


def test_a_failed_watched_version_is_left_to_a_newer_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_topics, "APPLY_RETRY_FIRST_S", 0.05)

    async def run() -> None:
        broker, applier = await serving_version_1(failures=1)
        older = asyncio.ensure_future(applier._apply_watched(version(2, "a", "b")))
        await asyncio.sleep(0)  # version 2 failed; its retry waits
        await applier._apply_watched(version(3, "c"))
        await older  # sees version 3 and stops: it never puts version 2 back over it
        assert applier.group.version == 3 and set(broker.served) == {"c"}
        assert broker.updates == 3

    asyncio.run(run())
