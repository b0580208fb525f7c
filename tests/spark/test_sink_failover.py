"""The sink's driver commit through a failover: kill -9 of the master while the driver
commits the tasks' prepared branches (real sync pair A/B and ZooKeeper; the task and
driver halves of the sink called as Spark calls them, without a Spark job around them,
so the kill lands inside the commit)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pyarrow as pa
import pytest

from chaos.transactions import read_committed
from metaq.client.session import AsyncMessageSessionFactory
from metaq.client.config import MetaClientConfig
from metaq.spark.sink import MetaQBatchWriter, SinkCommit, task_xid, write_task
from metaq.spark.sink_options import SinkOptions
from tests.integration.failover_support import TOPIC, Group, make_pair, sync_system, wait_leads

pytestmark = pytest.mark.spark
PARTITIONS = 2


def _task(options: SinkOptions, writer: MetaQBatchWriter, partition_id: int, rows: list[str]) -> SinkCommit:
    """What a task's ``write()`` does: its rows in its own XA branch, prepared, reported."""
    batch = pa.record_batch({"key": rows, "value": [r.encode() for r in rows]})
    branches, count = asyncio.run(write_task(options, [batch], task_xid(writer.scope, partition_id), partition_id))
    return SinkCommit(branches, count)


def test_kill_master_during_the_driver_commit(broker_factory: Any, zk_client: Any, zk_root: str) -> None:
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(maxTxTimeoutInSeconds=60), group, partitions=PARTITIONS)
    options = SinkOptions.parse({"zkConnect": broker_factory.zk_connect, "zkRoot": zk_root, "topic": TOPIC, "batchBytes": "256"})
    writer = MetaQBatchWriter(options)
    rows = {pid: [f"k{n % 5}:{pid}:{n}" for n in range(120)] for pid in range(3)}
    reported = [_task(options, writer, pid, rows[pid]) for pid in (0, 1)]
    _task(options, writer, 2, rows[2])  # an attempt that prepared, then lost (never reported)

    epoch = group.epoch()
    failure: list[BaseException] = []

    def commit() -> None:
        try:
            writer.commit([*reported, None])
        except BaseException as exc:  # pragma: no cover - reported below
            failure.append(exc)

    committer = threading.Thread(target=commit)
    committer.start()
    a.kill()  # kill -9 while the driver commits (its XA steps retry on the new master)
    wait_leads(b, group, epoch)
    committer.join(60)
    assert not committer.is_alive() and not failure, failure

    async def visible() -> list[bytes]:
        found: list[bytes] = []
        for p in range(PARTITIONS):
            found += await read_committed(b.address, TOPIC, p)
        return sorted(found)

    expected = sorted(r.encode() for pid in (0, 1) for r in rows[pid])
    assert asyncio.run(visible()) == expected  # the reported tasks' rows once, the lost attempt's never

    async def in_doubt() -> list[Any]:
        config = MetaClientConfig(zk_connect=broker_factory.zk_connect, zk_root=zk_root)
        async with AsyncMessageSessionFactory(config) as factory:
            return await factory.create_xa_producer(0).xa_resource().recover()

    assert asyncio.run(in_doubt()) == []
