"""Sync replication with real processes: what consumers see, and 504 vs 503.

* While a sync slave is SIGSTOPped, consumers of the master and of the other slave never
  get bytes past the reply's committed offset, and a put that is still waiting for its
  acks is invisible until it is acked; sync slaves serve consumers.
* A put that times out waiting for the sync set gets 504 (unknown outcome: it is on the
  master and becomes visible once a slave has it), the next one 503 (refused, not stored).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from metaq.client.connection import BrokerConnection
from metaq.tools.launcher import wait_until
from metaq.protocol import commands as c
from metaq.record import iter_records

from .test_sync_replication import (
    TOPIC,
    batch_body,
    on_disk,
    pipelined_puts,
    put_once,
    read_range,
    start_pair,
    sync_set,
    wait_sync_set,
)


async def consumer_get(conn: BrokerConnection, offset: int, partition: int = 0) -> tuple[Any, int]:
    """One consumer fetch; returns (reply, end of the returned bytes); checks the committed cap."""
    reply = await conn.request(
        {"op": "get", "topic": TOPIC, "partition": partition, "offset": offset, "max_size": 1 << 20}, timeout=10
    )
    end = offset
    if reply.code == c.OK:
        end = offset + len(reply.body)
        assert end <= reply["committed"], f"consumer got bytes up to {end} past committed {reply['committed']}"
    else:
        assert reply.code == c.NOT_FOUND, reply.header
    return reply, end


def test_sigstopped_slave_consumers_never_see_past_committed(broker_factory, zk_client, zk_root) -> None:
    master, (s0, s1) = start_pair(broker_factory, zk_client, zk_root, partitions=1, slaves=2)
    acked = asyncio.run(pipelined_puts(master.address, partitions=1, puts=40, batch=5, window=16))
    acked_end = max(a[2] for a in acked)
    s1.pause()
    try:

        async def scenario() -> dict[str, Any]:
            m_conn = await BrokerConnection.open(*master.address)
            s_conn = await BrokerConnection.open(*s0.address)
            p_conn = await BrokerConnection.open(*master.address)
            observed = {"polls": 0}
            try:
                started = time.perf_counter()
                pending = asyncio.ensure_future(
                    p_conn.request({"op": "put", "topic": TOPIC, "partition": 0}, batch_body(0, 999, 3), timeout=30)
                )
                while not pending.done():
                    for conn in (m_conn, s_conn):
                        reply, end = await consumer_get(conn, acked_end)
                        if reply.code == c.OK:
                            # Visible means committed: the put's ack must already be on its way
                            # (its reply travels on another connection and may arrive a moment
                            # after this one), and it must be a success, not a 504.
                            ack = await asyncio.wait_for(asyncio.shield(pending), 2)
                            assert ack.code == c.OK, ("a put that was not acked became visible", reply.header, ack.header)
                        else:
                            assert reply.code == c.NOT_FOUND, reply.header
                            assert reply["committed"] <= acked_end, reply.header
                    observed["polls"] += 1
                    await asyncio.sleep(0.02)
                put_reply = pending.result()
                observed["waited"] = time.perf_counter() - started
                observed["put"] = put_reply
                observed["zk_at_ack"] = sync_set(zk_client, zk_root)
                return observed
            finally:
                for conn in (m_conn, s_conn, p_conn):
                    conn.close()

        observed = asyncio.run(scenario())
        put = observed["put"]
        assert put.code == c.OK, put.header  # slave 0 still counts; minSyncSlaves=1
        assert observed["waited"] >= 0.8, "the put waited for the stopped slave until syncSlaveTimeoutMs"
        assert observed["polls"] > 10
        assert observed["zk_at_ack"]["slaves"] == [0], "ZooKeeper dropped the stopped slave before the ack"

        # Acked now: visible on the master and (after its next fetch) on the sync slave,
        # with the stopped slave still stopped. More puts are acked by slave 0 alone.
        more = asyncio.run(pipelined_puts(master.address, partitions=1, puts=20, batch=5, window=8))
        last_end = max(a[2] for a in more)

        async def read_all(address: tuple[str, int]) -> int:
            conn = await BrokerConnection.open(*address)
            try:
                offset = 0
                while True:
                    reply, end = await consumer_get(conn, offset)
                    if reply.code != c.OK:
                        return offset
                    offset = end
            finally:
                conn.close()

        assert asyncio.run(read_all(master.address)) == last_end
        wait_until(lambda: asyncio.run(read_all(s0.address)) == last_end, 5, message="slave 0 to serve every acked byte")
        data = asyncio.run(read_range(s0.address, 0, 0, last_end))
        assert data == on_disk(master, 0)[:last_end]
        assert len(list(iter_records(data, 0))) == 5 * (40 + 1 + 20) - 2  # every acked message, CRC-valid
    finally:
        s1.resume()
    wait_sync_set(zk_client, zk_root, [0, 1])


def test_put_timing_out_in_sync_wait_is_504_unknown_outcome_distinct_from_503(broker_factory, zk_client, zk_root) -> None:
    master, (slave,) = start_pair(broker_factory, zk_client, zk_root, partitions=1)
    reply, _ = put_once(master)
    assert reply.code == c.OK
    committed_before = reply["end_offset"]
    slave.pause()
    try:
        timed_out, seconds = put_once(master)
        assert timed_out.code == c.GATEWAY_TIMEOUT, timed_out.header
        assert "outcome unknown" in timed_out.message
        assert 0.8 <= seconds < 5, seconds
        assert sync_set(zk_client, zk_root)["slaves"] == []
        refused, seconds = put_once(master)
        assert refused.code == c.SERVICE_UNAVAILABLE and "nothing was stored" in refused.message
        assert seconds < 0.5
        # The 504 put is on the master's log but not committed: consumers do not see it.
        assert len(on_disk(master, 0)) > committed_before
        assert asyncio.run(read_range(master.address, 0, committed_before, committed_before + 10_000)) == b""
    finally:
        slave.resume()
    wait_sync_set(zk_client, zk_root, [0])
    # "May be stored": once the slave has it, the 504'd message is committed and readable.
    stored_end = len(on_disk(master, 0))
    wait_until(
        lambda: len(asyncio.run(read_range(master.address, 0, committed_before, stored_end))) == stored_end - committed_before,
        5,
        message="the 504'd put to become visible",
    )
    again, _ = put_once(master)
    assert again.code == c.OK and again["offset"] == stored_end
