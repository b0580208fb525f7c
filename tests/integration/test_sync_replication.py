"""Sync replication with real processes: acked means on the slave.

* kill -9 of the master right after a stream of pipelined acked puts: every acked byte
  is on the slave at the same offsets, byte for byte (compared with the bytes the master
  stamped and with the master's own segment files);
* ``onSyncSlaveLoss=reject``: the only slave killed -> puts fail fast with 503 (nothing
  stored), and succeed again once it has caught up and rejoined;
* ``onSyncSlaveLoss=degrade``: puts continue; ZooKeeper's sync_set shows the slave gone,
  then back after it rejoins.

Helpers here are shared with test_sync_visibility.py.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from typing import Any

import pytest

from metaq.client.connection import BrokerConnection
from metaq.ha.replica import REPORT_PIECE_BYTES
from metaq.tools.launcher import BrokerProcess, wait_until
from metaq.protocol import commands as c
from metaq.record import encode_batch
from metaq.zk.paths import ZkPaths

from .replication_support import blocking_puts, stat, stats_lines

TOPIC = "t"
# An idle slave is heard from every slaveMaxDelayMs (500 ms long polls): a timeout of 3 s keeps a
# slave stalled for a moment on a busy machine counted (reject would refuse every put meanwhile);
# no test here waits for the timeout (a killed slave's connection closes: removed at once).
SYNC = {"replicationMode": "sync", "onSyncSlaveLoss": "reject", "syncSlaveTimeoutMs": 3000, "unflushThreshold": 0}


# --- helpers ----------------------------------------------------------------------------------


def sync_set(zk_client: Any, zk_root: str, broker_id: int = 0) -> dict[str, Any] | None:
    path = ZkPaths(zk_root).sync_set(broker_id)
    if not zk_client.exists(path):
        return None
    return json.loads(zk_client.get(path)[0])


def wait_sync_set(zk_client: Any, zk_root: str, slaves: list[int], timeout: float = 15) -> dict[str, Any]:
    return wait_until(
        lambda: (lambda s: s if s is not None and s["slaves"] == slaves else None)(sync_set(zk_client, zk_root)),
        timeout,
        interval=0.05,
        message=f"sync_set to be {slaves}",
    )


#: A slave that reports its page cache (default flush), so it reports positions within a
#: large reply; a group-commit slave reports only fsynced ends (docs/sync-replication.md).
PIECE_REPORTING_SLAVE: dict[str, Any] = {}


def start_pair(broker_factory: Any, zk_client: Any, zk_root: str, partitions: int = 2, slaves: int = 1,
               slave_system: dict[str, Any] | None = None, **system: Any):
    master = broker_factory(0, {TOPIC: partitions}, {**SYNC, **system})
    slave_system = {"unflushThreshold": 0} if slave_system is None else slave_system
    group = [broker_factory(0, {TOPIC: partitions}, slave_system, {"slaveId": k}) for k in range(slaves)]
    wait_sync_set(zk_client, zk_root, list(range(slaves)))
    return master, group


def batch_body(partition: int, seq: int, batch: int, size: int = 100) -> bytes:
    return encode_batch([(f"p{partition}-{seq:06d}-{i:04d}".encode().ljust(size, b"."), None) for i in range(batch)])


def stamped(body: bytes, first_id: int) -> bytes:
    """The bytes the master wrote for ``body``: the same records with its msg ids."""
    from metaq.record import stamp_msg_ids

    buf = bytearray(body)
    stamp_msg_ids(buf, first_id)
    return bytes(buf)


async def pipelined_puts(
    address: tuple[str, int], partitions: int, puts: int, batch: int, window: int = 64, timeout: float = 30
) -> list[tuple[int, int, int, bytes]]:
    """``puts`` puts round-robin over partitions, ``window`` in flight on one connection.
    Returns the acked ones as (partition, offset, end, stamped bytes); every reply must be 200."""
    conn = await BrokerConnection.open(*address)
    acked: list[tuple[int, int, int, bytes]] = []
    sem = asyncio.Semaphore(window)

    async def one(seq: int) -> None:
        partition = seq % partitions
        body = batch_body(partition, seq, batch)
        async with sem:
            reply = await conn.request({"op": "put", "topic": TOPIC, "partition": partition}, body, timeout=timeout)
        assert reply.code == c.OK, reply.header
        acked.append((partition, reply["offset"], reply["end_offset"], stamped(body, reply["msg_id"])))

    try:
        await asyncio.gather(*(one(seq) for seq in range(puts)))
    finally:
        conn.close()
    return acked


async def one_put(address: tuple[str, int], partition: int = 0, batch: int = 1, timeout: float = 30) -> tuple[Any, float]:
    """One put on a fresh connection: (reply, seconds)."""
    conn = await BrokerConnection.open(*address)
    try:
        started = time.perf_counter()
        reply = await conn.request(
            {"op": "put", "topic": TOPIC, "partition": partition}, batch_body(partition, 0, batch), timeout=timeout
        )
        return reply, time.perf_counter() - started
    finally:
        conn.close()


def put_once(broker: BrokerProcess, partition: int = 0, batch: int = 1) -> tuple[Any, float]:
    return asyncio.run(one_put(broker.address, partition, batch))


async def read_range(address: tuple[str, int], partition: int, start: int, end: int, replica: bool = False) -> bytes:
    """Bytes [start, end) of a partition as a consumer sees them (up to committed); ``replica``
    reads past committed like a slave's fetch (a master counts that caller as a slave, and a
    slave refuses it: 403)."""
    conn = await BrokerConnection.open(*address)
    out = bytearray()
    try:
        while start + len(out) < end:
            header: dict[str, Any] = {
                "op": "get", "topic": TOPIC, "partition": partition, "offset": start + len(out),
                "max_size": min(1 << 20, end - start - len(out)),
            }
            if replica:
                header["replica"] = {"slave_id": 99, "epoch": 0}
            reply = await conn.request(header, timeout=10)
            if reply.code != c.OK or not reply.body:
                break
            out += reply.body
    finally:
        conn.close()
    return bytes(out[: end - start])


async def _range_crc(address: tuple[str, int], partition: int, start: int, end: int) -> int:
    conn = await BrokerConnection.open(*address)
    try:
        reply = await conn.request({"op": "checksum", "topic": TOPIC, "partition": partition, "start": start, "end": end})
    finally:
        conn.close()
    assert reply.code == c.OK and reply["end"] == end, reply.header
    return int(reply["crc"])


def range_crc(broker: BrokerProcess, partition: int, start: int, end: int):
    return _range_crc(broker.address, partition, start, end)


def on_disk(broker: BrokerProcess, partition: int) -> bytes:
    """A partition's log bytes from its segment files (offset 0 onwards; no retention in tests)."""
    start, data = broker.disk_log(TOPIC, partition)
    assert start == 0 and data, f"{broker}: partition {partition} on disk starts at {start}"
    return data


# --- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "puts,batch,window",
    [(600, 5, 64), (24, 4000, 8)],
    ids=["small-puts", "large-puts-acked-by-position-reports"],
)
def test_kill_master_after_acked_stream_leaves_every_ack_on_slave(
    broker_factory, zk_client, zk_root, puts: int, batch: int, window: int
) -> None:
    large = batch * 100 > REPORT_PIECE_BYTES
    master, (slave,) = start_pair(broker_factory, zk_client, zk_root, partitions=2,
                                  slave_system=PIECE_REPORTING_SLAVE if large else None)
    acked = asyncio.run(pipelined_puts(master.address, partitions=2, puts=puts, batch=batch, window=window))
    if large:
        # Fetch replies of several puts (~400 KB each): the slave appended them in pieces
        # and the master counted its position reports, which let acks out early.
        topics = stats_lines(master, "topics")
        assert any(line.startswith(f"{TOPIC} ") and "replica_positions=0" not in line for line in topics), topics
    master.kill()  # right after the last ack: no grace for the slave to fetch more
    assert len(acked) == puts

    for partition in range(2):
        mine = sorted((a for a in acked if a[0] == partition), key=lambda a: a[1])
        # The acked puts tile the partition from 0 (nothing else was written).
        assert mine[0][1] == 0
        for prev, nxt in zip(mine, mine[1:]):
            assert prev[2] == nxt[1]
        acked_end = mine[-1][2]
        expected = b"".join(a[3] for a in mine)
        got = on_disk(slave, partition)[:acked_end]
        assert len(got) == acked_end, f"slave has {len(got)} of {acked_end} acked bytes on partition {partition}"
        assert got == expected, f"partition {partition}: slave bytes differ from what the master acked"
        assert on_disk(master, partition)[:acked_end] == got, "slave is not a byte-identical prefix of the master"
        # The live slave process serves the same bytes (CRC of the range, as metaq verify does).
        assert asyncio.run(range_crc(slave, partition, 0, acked_end)) == zlib.crc32(expected)


def test_sync_slave_fetches_again_at_once_so_a_put_never_waits_for_the_async_linger(
    broker_factory, zk_client, zk_root
) -> None:
    """An async slave waits LINGER_S after a small reply (test_replication_pair.py); a sync
    slave must not, as every ack waits for its next fetch: one reply per blocking put, and
    not one wait (the slave's ``replication_lingers``; how fast a put is, is a benchmark's)."""
    master, slaves = start_pair(broker_factory, zk_client, zk_root, partitions=1)
    fetched_before = int(stat(master, "replica_get_requests"))
    blocking_puts(master, TOPIC, 0, 50)
    assert int(stat(master, "replica_get_requests")) - fetched_before >= 50, "a reply per put"
    assert int(stat(slaves[0], "replication_lingers")) == 0


def test_reject_fails_fast_when_only_slave_killed_and_recovers_after_rejoin(broker_factory, zk_client, zk_root) -> None:
    master, (slave,) = start_pair(broker_factory, zk_client, zk_root, partitions=1)
    reply, _ = put_once(master)
    assert reply.code == c.OK
    slave.kill()
    wait_sync_set(zk_client, zk_root, [], timeout=5)  # connection close -> removed at once
    end_before = asyncio.run(_log_end(master))
    for _ in range(3):
        reply, seconds = put_once(master)
        assert reply.code == c.SERVICE_UNAVAILABLE, reply.header
        assert "minSyncSlaves=1" in reply.message and "nothing was stored" in reply.message
        assert seconds < 0.5, f"a refused put should fail fast, took {seconds:.3f}s"
    assert asyncio.run(_log_end(master)) == end_before, "a 503 put must not be written"

    slave.start()
    wait_sync_set(zk_client, zk_root, [0])
    reply, _ = put_once(master)
    assert reply.code == c.OK, reply.header
    assert len(on_disk(slave, 0)) >= reply["end_offset"], "the rejoined slave holds everything acked"
    assert on_disk(slave, 0)[: reply["end_offset"]] == on_disk(master, 0)[: reply["end_offset"]]


def test_degrade_continues_and_zk_shows_slave_gone_and_back(broker_factory, zk_client, zk_root) -> None:
    master, (slave,) = start_pair(broker_factory, zk_client, zk_root, partitions=1, onSyncSlaveLoss="degrade")
    assert sync_set(zk_client, zk_root) == {"slaves": [0], "epoch": sync_set(zk_client, zk_root)["epoch"], "min_sync_slaves": 1}
    slave.kill()
    wait_sync_set(zk_client, zk_root, [], timeout=5)
    for _ in range(5):
        reply, seconds = put_once(master)
        assert reply.code == c.OK, reply.header
        assert seconds < 0.5
    status = asyncio.run(_stats(master))
    assert "sync_state degraded" in status
    slave.start()
    wait_sync_set(zk_client, zk_root, [0])
    reply, _ = put_once(master)
    assert reply.code == c.OK
    assert "sync_state ok" in asyncio.run(_stats(master))
    assert on_disk(slave, 0)[: reply["end_offset"]] == on_disk(master, 0)[: reply["end_offset"]]
    assert len(on_disk(slave, 0)) >= reply["end_offset"]


async def _log_end(broker: BrokerProcess, partition: int = 0) -> int:
    conn = await BrokerConnection.open(*broker.address)
    try:
        reply = await conn.request({"op": "stats", "item": "offsets"})
    finally:
        conn.close()
    for line in reply.body.decode().splitlines():
        if f"{TOPIC}-{partition}" in line or f"{TOPIC}-{broker.broker_id}-{partition}" in line:
            for field in line.split():
                if field.startswith("max_offset="):
                    return int(field.split("=")[1])
    raise AssertionError(f"no offsets line for {TOPIC}-{partition}: {reply.body!r}")


async def _stats(broker: BrokerProcess) -> str:
    conn = await BrokerConnection.open(*broker.address)
    try:
        reply = await conn.request({"op": "stats"})
    finally:
        conn.close()
    return reply.body.decode()
