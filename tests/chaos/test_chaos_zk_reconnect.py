"""Reads go on while ZooKeeper accepts the master's session and then drops it unanswered.

Regression for the liveness finding of the 300 s random run (seed 21): during a
``zk-majority`` fault, reads of both partitions stopped for 4.75 s (bound 4 s). The
surviving ZooKeeper node took the master's session back for an instant (it had not yet
noticed it had lost its quorum) and closed the connection before answering the master's
read of the group; the master took the unanswered read for "my epoch is gone", became an
orphan that serves nothing (committed offset 0), and later took a new epoch.

Here the same sequence is made deterministic with the fault proxy: a ``limit_data`` toxic
on the master's ZooKeeper link lets every new connection's handshake through (the session
is re-validated: CONNECTED) and cuts it right after, so every read the master makes after
a reconnect goes unanswered. Acked messages must stay readable on the master throughout,
and after the heal the master leads the same epoch and acks again.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.cluster import ChaosCluster
from metaq.client.connection import BrokerConnection
from metaq.protocol.messages import GetRequest, PutRequest
from metaq.record import encode_batch, iter_records
from metaq.tools.launcher import wait_until

pytestmark = pytest.mark.chaos

#: A ZooKeeper connect response: length, protocol version, timeout, session id, password
#: (length + 16 bytes), read-only flag. Exactly this much passes, then the link is closed.
CONNECT_RESPONSE_BYTES = 41


def request(address: tuple[str, int], header: dict[str, Any], body: bytes = b"") -> Any:
    async def send() -> Any:
        conn = await BrokerConnection.open(*address, 2)
        try:
            return await conn.request(header, body, timeout=2)
        finally:
            conn.close()

    try:
        return asyncio.run(send())
    except (OSError, asyncio.TimeoutError, ConnectionError) as exc:
        return exc


def reads_back(address: tuple[str, int], topic: str, offset: int, payload: bytes) -> bool:
    reply = request(address, GetRequest(topic=topic, partition=0, offset=offset, max_size=4096).to_header())
    if isinstance(reply, Exception) or not reply.ok:
        return False
    first = next(iter(iter_records(bytes(reply.body), offset)), None)
    return first is not None and first.offset == offset and bytes(first.data) == payload


def put(address: tuple[str, int], topic: str, payload: bytes) -> Any:
    return request(address, PutRequest(topic=topic, partition=0, count=1).to_header(), encode_batch([(payload, None)]))


def test_regression_reads_continue_when_zookeeper_drops_the_master_after_a_reconnect(tmp_path: Path) -> None:
    with ChaosCluster(tmp_path, zk_nodes=1) as cluster:
        master = cluster.master_of(0)
        assert master is not None
        address = cluster.client_address(master.url)
        acked = put(address, cluster.topic, b"before")
        assert not isinstance(acked, Exception) and acked.ok, acked
        offset, epoch = int(acked["offset"]), cluster.view(0).epoch

        zk_link = cluster._proxy(master.zk_proxies[0])
        zk_link.add_toxic(name="drop-after-handshake", type="limit_data", stream="downstream",
                          attributes={"bytes": CONNECT_RESPONSE_BYTES})
        unread: list[float] = []
        started = time.monotonic()
        while time.monotonic() - started < 5.0:
            if not reads_back(address, cluster.topic, offset, b"before"):
                unread.append(round(time.monotonic() - started, 2))
            time.sleep(0.25)
        zk_link.destroy_toxic("drop-after-handshake")

        assert not unread, f"the acked message was unreadable on the master at {unread} s"
        assert "did not answer" in master.process.log_text(), "the fault did not reach the reconnect read"
        wait_until(lambda: (r := put(address, cluster.topic, b"after")) and not isinstance(r, Exception) and r.ok,
                   15, 0.2, "the master to ack again")
        assert cluster.view(0).epoch == epoch, "the master gave up its epoch although its session lived"
        assert cluster.view(0).master == master.url
