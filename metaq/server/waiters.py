"""Long-poll support: fetches parked at a partition's end until it moves.

A consumer fetch waits for the partition's *committed* end to move, a slave's
fetch for the *log* end; both are woken by ``notify`` and re-check their own
condition, so one mechanism serves both.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict


class EndWaiters:
    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = defaultdict(set)

    async def wait(self, topic: str, partition: int, timeout: float) -> None:
        """Return when the partition is notified or ``timeout`` seconds pass."""
        if timeout <= 0:
            return
        key = (topic, partition)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[key].add(future)
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            waiting = self._waiters.get(key)
            if waiting is not None:
                waiting.discard(future)
                if not waiting:
                    del self._waiters[key]

    def notify(self, topic: str, partition: int) -> None:
        waiting = self._waiters.pop((topic, partition), None)
        if waiting:
            for future in waiting:
                if not future.done():
                    future.set_result(None)

    def notify_all(self) -> None:
        for topic, partition in list(self._waiters):
            self.notify(topic, partition)
