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

Invariant: the lease vouches for the session that won the lock, and only that one.
It is bound to the session it started under; a round trip on a later session (kazoo
opens a new one after an expiry, or after ZooKeeper lost its data) renews nothing,
even while the role machine has not yet handled the expiry (it may be waiting on a
ZooKeeper call of its own): the old lock is gone with the old session, and a master
renewing on the new one acked writes ZooKeeper no longer knew it led (an ack read
back with the group's epoch node empty, after ZooKeeper came back without its data).
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
        #: The session the lease vouches for (``start``): renewals on any other renew nothing.
        self._session_id: int | None = None
        self._refused_session: int | None = None

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
        if not self.client.connected:
            return False
        session = self._session()
        if session != self._session_id:
            if session != self._refused_session:  # said once per session, not every renewal
                self._refused_session = session
                log.warning("lease not renewed: ZooKeeper session 0x%x is not the 0x%x that took the lock",
                            session or 0, self._session_id or 0)
            return False
        self._confirmed_at = started
        return True

    def _session(self) -> int | None:
        client_id = self.client.client_id
        return client_id[0] if client_id else None

    async def start(self) -> None:
        self._session_id = self._session()
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
