"""Replication of many partitions on a real sync pair: a slave's cost on its master does not
grow with idle partitions (docs/replication.md, "Quiet partitions").

Before, a slave long-polled every partition on one connection: at about 2,000 partitions the
master stopped reading it at ``maxRequestsInFlight`` (1,000), the slave started a few
partitions a second, and the sync set never formed; each report also walked every partition
to decide whether the slave may join. Here ``maxRequestsInFlight`` is set well below the
partition count, so a slave that still kept one request parked per partition would not get
them all replicating; no timing is asserted (the machine is shared), only that every
partition replicates, the slave joins the sync set, puts are acked as replicated, and the
slave rejoins after a restart.
"""

from __future__ import annotations

import asyncio
import time

from metaq.client.connection import BrokerConnection
from metaq.protocol.codes import SERVICE_UNAVAILABLE
from metaq.record import encode_batch
from metaq.tools.launcher import wait_until

from .replication_support import assert_identical, replica_rows, stat
from .test_sync_replication import wait_sync_set

TOPICS = {f"wide{n}": 250 for n in range(6)}  # 1,500 partitions
PARTITIONS = sum(TOPICS.values())
SYNC = {"replicationMode": "sync", "onSyncSlaveLoss": "reject", "syncSlaveTimeoutMs": 5000,
        "unflushThreshold": 0, "maxRequestsInFlight": 200}


async def _put_everywhere(address: tuple[str, int], tag: str, topics: dict[str, int] = TOPICS) -> int:
    """One acked put to every partition, pipelined 200 at a time: how many were acked. A 503
    (nothing stored: the master's lease or sync set not confirmed this moment, on a loaded
    machine) is sent again, for up to a minute; any other refusal fails the test."""
    conn = await BrokerConnection.open(*address)
    keys = [(topic, p) for topic, count in topics.items() for p in range(count)]
    acked = 0
    deadline = time.monotonic() + 60
    try:
        while keys:
            batch, keys = keys[:200], keys[200:]
            futures = [conn.send({"op": "put", "topic": topic, "partition": p},
                                 encode_batch([(f"{tag}-{topic}-{p}".encode(), None)]))
                       for topic, p in batch]
            for key, reply in zip(batch, await asyncio.gather(*futures)):
                if reply.code == SERVICE_UNAVAILABLE and time.monotonic() < deadline:
                    keys.append(key)
                    continue
                assert reply.ok, reply.header
                acked += 1
            if keys and keys[-1] in batch:
                await asyncio.sleep(0.2)
    finally:
        conn.close()
    return acked


def put_everywhere(master, tag: str, topics: dict[str, int] = TOPICS) -> int:  # noqa: ANN001
    return asyncio.run(_put_everywhere(master.address, tag, topics))


def all_following(slave) -> bool:  # noqa: ANN001
    rows = replica_rows(slave)
    return len(rows) == PARTITIONS and all(row["state"] == "following" for row in rows.values())


def test_a_sync_pair_of_1500_partitions_replicates_all_of_them_and_rejoins_after_a_restart(
        broker_factory, zk_client, zk_root) -> None:  # noqa: ANN001
    master = broker_factory(0, TOPICS, SYNC)
    slave = broker_factory(0, TOPICS, {"unflushThreshold": 0, "maxRequestsInFlight": 200}, {"slaveId": 0})
    wait_until(lambda: all_following(slave), 120, interval=0.5, message="every partition to replicate")
    wait_sync_set(zk_client, zk_root, [0], timeout=120)

    # Acked in sync mode means on the slave: every partition's put waited for its report.
    assert put_everywhere(master, "first") == PARTITIONS
    assert stat(master, "sync_set") == "0"

    # A clean restart of the slave: it starts every partition again and rejoins.
    slave.restart()
    wait_until(lambda: all_following(slave), 120, interval=0.5, message="every partition to replicate again")
    wait_sync_set(zk_client, zk_root, [0], timeout=120)
    assert put_everywhere(master, "second") == PARTITIONS
    assert_identical(master)

    # The slave's log says how many partitions it started, and the master never had to
    # refuse the slave's requests for lack of room.
    assert f"started replicating {PARTITIONS} partitions" in slave.log_text()
