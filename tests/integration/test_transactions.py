"""Local and XA transactions with real brokers and ZooKeeper.

Group 0 is a sync pair: A (master) and B (``--slave``), ``replicationMode=sync``,
ZK session 1500 ms; topic ``fo`` with two partitions. Consumers' view is read on
both brokers the way the client consumer reads it: ``get`` from offset 0 up to the
last stable offset, through ``txn.reader.committed_records`` with the reply's aborted
spans.

* local transactions: nothing visible on the master or the slave before commit, all of
  it after; nothing after a rollback or a timeout; an open transaction holds back the
  plain messages sent after it (read committed, not read uncommitted);
* XA: kill -9 of the master between prepare and commit; the new master lists the
  branch in ``recover`` and commits it; every message is then visible exactly once;
* XA: a broker restart (kill -9, same data) keeps a prepared branch.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from metaq.client import ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig, TransactionRolledBack, Xid
from metaq.client.connection import BrokerConnection
from metaq.client.session import AsyncMessageSessionFactory
from metaq.client.xa import XAError
from metaq.protocol import commands as c
from metaq.tools.launcher import BrokerProcess, wait_until
from metaq.txn.xa import Code

from chaos.transactions import read_committed

from .failover_support import GROUP, TOPIC, ZK_SETTINGS, Group, make_pair, sync_system, wait_leads

PARTITIONS = 2


async def visible(broker: BrokerProcess, partition: int) -> list[bytes]:
    """Every message a read-committed consumer of ``broker`` gets from ``partition`` now."""
    return await read_committed(broker.address, TOPIC, partition)


async def visible_all(broker: BrokerProcess) -> list[bytes]:
    return sorted([m for p in range(PARTITIONS) for m in await visible(broker, p)])


def log_end(broker: BrokerProcess, partition: int) -> int:
    return broker.disk_log(TOPIC, partition)[0] + len(broker.disk_log(TOPIC, partition)[1])


async def replicated(master: BrokerProcess, slave: BrokerProcess, timeout: float = 10) -> None:
    """Until the slave holds every byte of the master's log (so its view is final)."""
    await asyncio.to_thread(
        wait_until, lambda: all(log_end(slave, p) == log_end(master, p) for p in range(PARTITIONS)), timeout,
        0.05, "the slave to hold the master's log")


def client_config(factory: Any) -> MetaClientConfig:
    return MetaClientConfig(zk_connect=factory.zk_connect, zk_root=factory.zk_root, zk_session_timeout_ms=5000,
                            send_timeout_s=30)


def payloads(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


@pytest.fixture
def pair(broker_factory: Any, zk_client: Any, zk_root: str) -> tuple[BrokerProcess, BrokerProcess, Group]:
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(maxTxTimeoutInSeconds=30), group, partitions=PARTITIONS)
    return a, b, group


def test_local_transactions_are_all_or_nothing_on_master_and_slave(broker_factory: Any, pair: Any, tmp_path: Any) -> None:
    a, b, _group = pair

    async def scenario() -> None:
        async with AsyncMessageSessionFactory(client_config(broker_factory)) as factory:
            producer = factory.create_transactional_producer()
            plain = factory.create_producer()

            committed = payloads("commit", 6)
            await producer.begin_transaction()
            for data in committed:
                await producer.send_message(Message(TOPIC, data))
            # An open transaction holds back what is sent after it (its partitions' LSO stops at it).
            held = await plain.send_message(Message(TOPIC, b"plain after the open transaction"))
            assert held.success, held
            await replicated(a, b)
            for broker in (a, b):
                assert await visible_all(broker) == [], f"{broker.name} shows an uncommitted transaction"
            await producer.commit()
            expected = sorted(committed + [b"plain after the open transaction"])
            assert await visible_all(a) == expected
            await asyncio.to_thread(wait_until, lambda: asyncio.run(visible_all(b)) == expected, 10, 0.1,
                                    "the slave to show the committed transaction")

            await producer.begin_transaction()
            for data in payloads("rollback", 4):
                await producer.send_message(Message(TOPIC, data))
            await producer.rollback()

            await producer.begin_transaction(timeout_s=1)
            for data in payloads("timeout", 4):
                await producer.send_message(Message(TOPIC, data))
            await asyncio.sleep(2.5)  # the broker rolls it back (maxTxTimeoutInSeconds caps, 1 s asked)
            with pytest.raises(TransactionRolledBack):
                await producer.commit()

            after = await plain.send_message(Message(TOPIC, b"plain at the end"))
            assert after.success, after
            await replicated(a, b)
            final = sorted(expected + [b"plain at the end"])
            for broker in (a, b):
                await asyncio.to_thread(wait_until, lambda broker=broker: asyncio.run(visible_all(broker)) == final,
                                        10, 0.1, f"{broker.name} to show exactly the committed messages")

    asyncio.run(scenario())
    # The blocking consumer, reading the slave: exactly the committed and plain messages, once each.
    expected = sorted(payloads("commit", 6) + [b"plain after the open transaction", b"plain at the end"])
    got: list[bytes] = []
    with MessageSessionFactory(client_config(broker_factory)) as factory:
        consumer = factory.create_consumer(ConsumerConfig(group="readers", read_from="slave", fetch_wait_ms=200,
                                                          recover_dir=str(tmp_path / "recover")))
        consumer.subscribe(TOPIC, 64 * 1024, lambda message: got.append(message.data))
        consumer.complete_subscribe()
        wait_until(lambda: len(got) >= len(expected), 15, message=f"{len(expected)} messages from the slave")
        time.sleep(0.5)  # nothing more may come
        consumer.shutdown()
    assert sorted(got) == expected


def test_kill_master_between_prepare_and_commit_then_commit_on_the_new_master(broker_factory: Any, pair: Any) -> None:
    a, b, group = pair
    epoch = group.epoch()
    xid = Xid(1, b"order-42", b"metaq")
    messages = payloads("xa", 6)

    async def prepare() -> None:
        async with AsyncMessageSessionFactory(client_config(broker_factory)) as factory:
            producer = factory.create_xa_producer()
            resource = producer.xa_resource()
            await resource.start(xid)
            for data in messages:
                await producer.send_message(Message(TOPIC, data))
            await resource.end(xid)
            assert await resource.prepare(xid) == resource.XA_OK
            await replicated(a, b)  # acked in sync mode: it already is; this only checks it
            for broker in (a, b):
                assert await visible_all(broker) == [], f"{broker.name} shows a prepared, uncommitted branch"
            # Only the master takes transaction steps; the slave answers like it does for puts.
            conn = await BrokerConnection.open(*b.address, timeout=5)
            refused = await conn.request({"op": "transaction", "action": "recover"}, timeout=10)
            conn.close()
            assert refused.code == c.FORBIDDEN and "is a slave" in refused.message, refused.header

    asyncio.run(prepare())
    a.kill()
    wait_leads(b, group, epoch)

    async def commit_on_new_master() -> None:
        # A new resource of the same broker group, as a transaction manager recovering after the failover.
        async with AsyncMessageSessionFactory(client_config(broker_factory)) as factory:
            resource = factory.create_xa_producer(broker_id=GROUP).xa_resource()
            assert await resource.recover() == [xid]
            assert await visible_all(b) == []
            await resource.commit(xid, one_phase=False)
            await resource.commit(xid, one_phase=False)  # a retried commit: answered from the log, nothing twice
            assert await resource.recover() == []
            assert await visible_all(b) == sorted(messages)

    asyncio.run(commit_on_new_master())


def test_a_broker_restart_keeps_a_prepared_branch(broker_factory: Any, zk_client: Any, zk_root: str) -> None:
    group = Group(zk_client, zk_root)
    master = broker_factory(GROUP, {TOPIC: PARTITIONS}, {"unflushThreshold": 0}, zookeeper=ZK_SETTINGS)
    kept, doomed = Xid(7, b"kept"), Xid(7, b"doomed")

    async def prepare() -> None:
        async with AsyncMessageSessionFactory(client_config(broker_factory)) as factory:
            producer = factory.create_xa_producer()
            resource = producer.xa_resource()
            for xid in (kept, doomed):
                await resource.start(xid)
                await producer.send_message(Message(TOPIC, str(xid).encode()))
                await resource.end(xid)
                assert await resource.prepare(xid) == resource.XA_OK

    asyncio.run(prepare())
    epoch = group.epoch()
    master.restart(kill=True)
    wait_leads(master, group, epoch - 1)

    async def after_restart() -> None:
        async with AsyncMessageSessionFactory(client_config(broker_factory)) as factory:
            resource = factory.create_xa_producer(broker_id=GROUP).xa_resource()
            assert sorted(await resource.recover()) == sorted([kept, doomed])
            await resource.commit(kept)
            await resource.rollback(doomed)
            with pytest.raises(XAError) as unknown:
                await resource.forget(Xid(7, b"never"))
            assert unknown.value.code == Code.XAER_NOTA
            assert await visible_all(master) == [str(kept).encode()]

    asyncio.run(after_restart())
