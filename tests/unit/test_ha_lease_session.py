"""The master's lease vouches for the ZooKeeper session that took the lock, and only that one
(metaq/ha/lease.py): a round trip on a later session renews nothing."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from metaq.ha.lease import ZkLease


class FakeClient:
    """A kazoo client: connected, answering exists('/'), in session ``client_id[0]``."""

    def __init__(self, session: int) -> None:
        self.connected = True
        self.client_id: tuple[int, bytes] | None = (session, b"password")

    def exists_async(self, path: str) -> SimpleNamespace:
        return SimpleNamespace(get=lambda timeout: SimpleNamespace(version=0))


def test_a_renewal_on_a_new_session_renews_nothing_and_the_lease_runs_out() -> None:
    now = [100.0]
    client = FakeClient(session=0x11)
    lease = ZkLease(client, session_timeout_ms=1500, clock=lambda: now[0])  # type: ignore[arg-type]

    async def scenario() -> None:
        lease._session_id = client.client_id[0]  # what start() records
        assert await lease.renew() and lease.valid()
        # ZooKeeper lost the session (an expiry, its data lost): kazoo connected again in a new one,
        # before the role machine handled the loss.
        client.client_id = (0x22, b"other")
        now[0] += 0.2
        assert not await lease.renew()
        now[0] += lease.valid_for
        assert not lease.valid(), "the old session's lease ran out: no ack on the new session's word"
        client.client_id = (0x11, b"password")  # the same session back (a blip): renewed again
        assert await lease.renew() and lease.valid()

    asyncio.run(scenario())


def test_start_binds_the_lease_to_the_session_of_the_moment() -> None:
    client = FakeClient(session=0x33)
    lease = ZkLease(client, session_timeout_ms=1500)  # type: ignore[arg-type]

    async def scenario() -> None:
        await lease.start()
        assert lease.valid()
        await lease.stop()

    asyncio.run(scenario())
