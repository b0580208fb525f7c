"""Background tasks with an owner: each is kept until it ends, and stopped with its owner.

asyncio keeps only a weak reference to a task: one started with ``ensure_future`` and
dropped may be collected mid-run, and an error it raises is reported only when it is
collected (if ever). An owner starts its tasks here instead, and ``close`` cancels the
ones still running and awaits them all, so stopping the owner leaves nothing running.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Coroutine

log = logging.getLogger(__name__)


class OwnedTasks:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start ``coro``; kept until it ends (an error it raises is logged then)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: a background task failed", self.owner, exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def wait(self) -> None:
        """Await every task still running (they end by themselves)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self, grace_s: float) -> None:
        """Let the tasks still running end by themselves for up to ``grace_s``, then cancel the rest."""
        if self._tasks:
            try:
                await asyncio.wait_for(self.wait(), grace_s)
            except asyncio.TimeoutError:
                log.warning("%s: %d background tasks still running after %.1fs; cancelled", self.owner, len(self._tasks), grace_s)
        await self.close()

    async def close(self) -> None:
        """Cancel every task still running and await them all."""
        while self._tasks:
            pending = list(self._tasks)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
