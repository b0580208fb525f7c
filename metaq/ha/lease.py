"""The master's lease: it may ack only while ZooKeeper has recently vouched for it.

Why: ZooKeeper expires the session of a master that went silent (network cut,
SIGSTOP, a long pause) and another broker may then take over, but the old
process only learns that when it next talks to ZooKeeper. A SIGSTOPped master
that wakes up could otherwise ack puts already sitting in its socket buffers
before kazoo reports the expiry: two masters acking for one partition.

So the master renews a lease by a round trip to ZooKeeper every
``session_timeout / 6``, and treats itself as fenced unless the last successful
round trip *started* less than ``session_timeout / 2`` ago on the monotonic
clock (which keeps running while the process is stopped). ZooKeeper cannot
expire a session sooner than ``session_timeout`` after the client's last
contact, so while the lease holds, no other master can exist yet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from kazoo.client import KazooClient

log = logging.getLogger(__name__)


class ZkLease:
    def __init__(self, client: KazooClient, session_timeout_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.session_timeout = session_timeout_ms / 1000
        self.valid_for = self.session_timeout / 2
        self.interval = self.session_timeout / 6
        self._clock = clock
        self._confirmed_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    def valid(self) -> bool:
        confirmed = self._confirmed_at
        return confirmed is not None and self._clock() - confirmed < self.valid_for

    @property
    def confirmed_once(self) -> bool:
        """Whether ZooKeeper has vouched for this lease since it was (re)started."""
        return self._confirmed_at is not None

    def remaining(self) -> float:
        if self._confirmed_at is None:
            return 0.0
        return max(0.0, self.valid_for - (self._clock() - self._confirmed_at))

    async def renew(self) -> bool:
        started = self._clock()
        try:
            await asyncio.to_thread(lambda: self.client.exists_async("/").get(timeout=self.valid_for))
        except Exception as exc:  # connection loss, expiry, timeout: the lease just runs out
            log.debug("lease renewal failed: %s", exc)
            return False
        if self.client.connected:
            self._confirmed_at = started
            return True
        return False

    async def start(self) -> None:
        await self.renew()
        self._task = asyncio.ensure_future(self._renew_forever())

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.renew()

    def invalidate(self) -> None:
        self._confirmed_at = None

    async def stop(self) -> None:
        self.invalidate()
        if self._task is not None:
            # Not awaited: a renewal stuck on an unreachable ZooKeeper must not hold us.
            self._task.cancel()
            self._task = None
