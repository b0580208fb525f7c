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

The second test is the exception to "reads go on" (docs/guarantees.md, V9): reads past a
transaction left undecided by the quorum's loss wait for its marker, a write.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.cluster import ChaosCluster
from metaq.client import Message, MetaClientConfig
from metaq.client.session import AsyncMessageSessionFactory
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


def reads_back(address: tuple[str, int], topic: str, offset: int, payload: bytes, partition: int = 0) -> bool:
    reply = request(address, GetRequest(topic=topic, partition=partition, offset=offset, max_size=4096).to_header())
    if isinstance(reply, Exception) or not reply.ok:
        return False
    first = next(iter(iter_records(bytes(reply.body), offset)), None)
    return first is not None and first.offset == offset and bytes(first.data) == payload


def put(address: tuple[str, int], topic: str, payload: bytes, partition: int = 0) -> Any:
    return request(address, PutRequest(topic=topic, partition=partition, count=1).to_header(),
                   encode_batch([(payload, None)]))


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


#: The open transaction's timeout (whole seconds): longer than the master's lease (the
#: 1.5 s session), so that the master is fenced before it could abort it, shorter than the hold.
TXN_TIMEOUT_S = 3
HOLD_S = 4.0


def test_reads_past_a_transaction_open_when_zookeeper_loses_its_majority_resume_within_the_bound(tmp_path: Path) -> None:
    """The shape of the seed-44 random run's ``reads_stopped`` (docs/chaos.md, "Liveness"): a
    transaction stores a record, a plain put is acked after it, two of three ZooKeeper nodes
    die. Readers are read-committed: the acked message stays unreadable on the master and
    the slave for the whole outage (its transaction's abort is a write), while what is below
    the transaction is read throughout; once the quorum is back the master aborts the
    timed-out transaction and the acked message is read within ``2T + 1 s`` (V9)."""
    with ChaosCluster(tmp_path, zk_nodes=3) as cluster:
        master, (slave,) = cluster.master_of(0), cluster.slaves_of(0)
        assert master is not None
        replicas = {"master": cluster.client_address(master.url), "slave": cluster.client_address(slave.url)}
        config = MetaClientConfig(zk_connect=cluster.zk_connect, zk_root=cluster.zk_root, zk_session_timeout_ms=10_000,
                                  address_map=cluster.client_address_map)
        loop = asyncio.new_event_loop()
        factory = loop.run_until_complete(AsyncMessageSessionFactory(config).start())
        try:
            producer = factory.create_transactional_producer()

            async def open_transaction() -> int:
                await producer.begin_transaction(timeout_s=TXN_TIMEOUT_S)
                result = await producer.send_message(Message(cluster.topic, b"in-the-transaction"))
                assert result.success, result.error_message
                return result.partition.partition

            # One acked message below the transaction in each partition (it picks its own).
            befores = [put(replicas["master"], cluster.topic, b"before", n) for n in range(cluster.partitions)]
            assert all(not isinstance(r, Exception) and r.ok for r in befores), befores
            partition = loop.run_until_complete(open_transaction())
            before = befores[partition]
            wait_until(lambda: all(reads_back(a, cluster.topic, int(before["offset"]), b"before", partition)
                                   for a in replicas.values()), 10, 0.1, "the message before the transaction on both")
            after = put(replicas["master"], cluster.topic, b"after", partition)
            assert not isinstance(after, Exception) and after.ok, after
            lost = [0, 1]
            for index in lost:
                cluster.kill_zk(index)

            unread_below, read_past = [], []
            started = time.monotonic()
            while time.monotonic() - started < HOLD_S:
                for name, address in replicas.items():
                    if not reads_back(address, cluster.topic, int(before["offset"]), b"before", partition):
                        unread_below.append((name, round(time.monotonic() - started, 2)))
                    if reads_back(address, cluster.topic, int(after["offset"]), b"after", partition):
                        read_past.append((name, round(time.monotonic() - started, 2)))
                time.sleep(0.2)
            for index in lost:
                cluster.restart_zk(index)
            for index in lost:
                cluster.zks[index].wait_until_serving(60)
            quorum_back = time.monotonic()
            wait_until(lambda: all(reads_back(a, cluster.topic, int(after["offset"]), b"after", partition)
                                   for a in replicas.values()), 30, 0.1, "the acked message past the transaction")
            resumed_after = time.monotonic() - quorum_back
        finally:
            loop.run_until_complete(factory.shutdown())
            loop.close()

        assert not unread_below, f"a message below the open transaction was unreadable at {unread_below}"
        assert not read_past, f"an acked message past an undecided transaction was served at {read_past}"
        bound = 2 * cluster.session_ms / 1000 + 1
        assert resumed_after <= bound + 1.0, f"reads resumed {resumed_after:.2f}s after the quorum (bound {bound}s + 1 s for CI)"
        assert cluster.view(0).master == master.url
