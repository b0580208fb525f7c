"""The Spark source reads committed: no transaction marker, no batch header, no rolled-back record."""

from __future__ import annotations

import asyncio

import pytest

from metaq.client import Message, MetaClientConfig
from metaq.client.session import AsyncMessageSessionFactory

pytestmark = pytest.mark.spark
TOPIC = "events"


def test_batch_read_skips_control_records_and_rolled_back_transactions(spark, zk, zk_root, broker_factory):
    broker_factory(0, {TOPIC: 2}, {"unflushThreshold": 0})

    async def produce() -> None:
        config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root)
        async with AsyncMessageSessionFactory(config) as factory:
            producer = factory.create_transactional_producer()
            plain = factory.create_producer()
            for n, outcome in enumerate(["commit", "rollback", "commit", "rollback"]):
                await producer.begin_transaction()
                for i in range(3):
                    await producer.send_message(Message(TOPIC, f"{outcome}-{n}-{i}".encode()))
                assert (await plain.send_message(Message(TOPIC, f"plain-{n}".encode()))).success
                await (producer.commit() if outcome == "commit" else producer.rollback())

    asyncio.run(produce())
    df = spark.read.format("metaq").option("zkConnect", zk.connect_string).option("zkRoot", zk_root).option("topic", TOPIC).option("readFrom", "master").load()
    rows = sorted(bytes(r.data).decode() for r in df.collect())
    expected = sorted([f"commit-{n}-{i}" for n in (0, 2) for i in range(3)] + [f"plain-{n}" for n in range(4)])
    assert rows == expected
