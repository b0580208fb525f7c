"""Background tasks have an owner (metaq/owned_tasks.py): kept until done, awaited or cancelled on stop."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from metaq.owned_tasks import OwnedTasks


def test_a_task_is_kept_until_it_ends_and_stop_waits_for_it() -> None:
    finished: list[str] = []

    async def slow() -> None:
        await asyncio.sleep(0.05)
        finished.append("slow")

    async def scenario() -> None:
        tasks = OwnedTasks("test")
        tasks.spawn(slow())
        gc.collect()  # asyncio keeps only a weak reference: the owner's must keep the task alive
        assert len(tasks) == 1
        await tasks.stop(grace_s=5)
        assert finished == ["slow"] and len(tasks) == 0

    asyncio.run(scenario())


def test_a_task_past_the_grace_is_cancelled_and_awaited() -> None:
    cancelled: list[bool] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def scenario() -> None:
        tasks = OwnedTasks("test")
        task = tasks.spawn(forever())
        await tasks.stop(grace_s=0.05)
        assert task.done() and cancelled == [True] and len(tasks) == 0

    asyncio.run(scenario())


def test_a_failing_task_is_logged_with_its_owner(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise OSError("disk gone")

    async def scenario() -> None:
        tasks = OwnedTasks("the flusher")
        tasks.spawn(fails())
        await tasks.wait()

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert any("the flusher" in r.getMessage() and r.exc_info for r in caplog.records), caplog.text
