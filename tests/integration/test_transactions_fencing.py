"""Transactional ids with real brokers and ZooKeeper: a new instance fences its zombie.

Two producers with the same ``transactional_id`` stand for an application instance
that hangs (the "old" one, a zombie) and the instance restarted in its place (the
"new" one). Checked, on a sync pair, across a kill -9 restart of a master, and across
a kill -9 failover of the pair:

* the new instance's ``init_producer`` answers the old one's producer id with the
  epoch + 1 (from the group's mapping in ZooKeeper, so also after a restart or a
  failover), and the old instance's open transaction is rolled back: no consumer, on
  the master or the slave, ever sees a message of it;
* the old instance's next put and its transaction steps get 403 ``fenced: ...``
  (``ProducerFenced`` in the client), on the master that served the init, after its
  restart, and on the slave that took over;
* the new instance's transactions commit;
* concurrent inits of one name get distinct epochs; a bad name gets 400;
* XA with a transactional id: the old instance's unprepared branch is rolled back, its
  prepared one stays in ``recover`` and can be committed;
* with security on, a name belongs to the user who first inited it (admin may init any).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from metaq.client import Message, ProducerFenced, TransactionError, Xid
from metaq.client.connection import BrokerConnection, Reply
from metaq.client.session import AsyncMessageSessionFactory
from metaq.client.transactional import AsyncTransactionalProducer
from metaq.protocol import commands as c
from metaq.protocol.messages import PutRequest
from metaq.record import encode_record
from metaq.server.producer_ids import ProducerIdAllocator, zookeeper_blocks
from metaq.server.transactional_ids import Owner, TransactionalIds, ZooKeeperMapping
from metaq.tools.launcher import BrokerProcess, wait_until
from metaq.zk.paths import ZkPaths

from .failover_support import GROUP, TOPIC, ZK_SETTINGS, Group, make_pair, sync_system, wait_leads
from .test_transactions import PARTITIONS, client_config, payloads, replicated, visible_all
from .trust_support import SecuredGroup, request_as, run

NAME = "app-1"


async def raw(broker: BrokerProcess, header: dict[str, Any], body: bytes = b"") -> Reply:
    conn = await BrokerConnection.open(*broker.address, timeout=5)
    try:
        return await conn.request(header, body, timeout=10)
    finally:
        conn.close()


async def assert_zombie_refused(broker: BrokerProcess, producer_id: int, epoch: int) -> None:
    """A transaction step of ``epoch`` (a fresh start, as a zombie would try next) is refused as fenced."""
    step = {"op": "transaction", "action": "start", "xid": f"TX:{producer_id}.{epoch}:99",
            "producer_id": producer_id, "producer_epoch": epoch}
    reply = await raw(broker, step)
    for _ in range(100):  # a master just started or promoted answers 503 until it has recovered transactions
        if reply.code != c.SERVICE_UNAVAILABLE:
            break
        await asyncio.sleep(0.1)
        reply = await raw(broker, step)
    assert reply.code == c.FORBIDDEN and reply.message.startswith("fenced: a newer instance"), reply.header


async def committed(factory: AsyncMessageSessionFactory, data: bytes) -> AsyncTransactionalProducer:
    """A new instance of NAME that commits one transaction of ``data``."""
    producer = factory.create_transactional_producer(transactional_id=NAME)
    await producer.begin_transaction()
    await producer.send_message(Message(TOPIC, data))
    await producer.commit()
    return producer


Instances = tuple[AsyncTransactionalProducer, AsyncTransactionalProducer, int, int]


async def zombie_and_successor(factory: AsyncMessageSessionFactory) -> Instances:
    """The old instance with an open transaction, then the new one (its init fences the old), which
    commits; and the new one's producer id and epoch."""
    old = factory.create_transactional_producer(transactional_id=NAME)
    await old.begin_transaction()
    for data in payloads("zombie", 3):
        await old.send_message(Message(TOPIC, data))
    new = await committed(factory, b"new-1")
    pid, epoch = new.sender.producer_id, new.sender.producer_epoch
    assert pid is not None and pid == old.sender.producer_id and epoch == old.sender.producer_epoch + 1
    return old, new, pid, epoch


@pytest.fixture
def pair(broker_factory: Any, zk_client: Any, zk_root: str) -> tuple[BrokerProcess, BrokerProcess, Group]:
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(maxTxTimeoutInSeconds=30), group, partitions=PARTITIONS)
    return a, b, group


def test_a_new_instance_fences_the_old_one_and_its_open_transaction_is_never_seen(
        broker_factory: Any, zk_client: Any, zk_root: str, pair: Any) -> None:
    a, b, _group = pair

    async def scenario() -> None:
        async with AsyncMessageSessionFactory(client_config(broker_factory)) as factory:
            old, new, pid, epoch = await zombie_and_successor(factory)
            with pytest.raises(ProducerFenced, match=f"a newer instance of transactional id {NAME} exists"):
                await old.send_message(Message(TOPIC, b"zombie-late"))
            with pytest.raises(ProducerFenced):
                await old.commit()  # the client stops for good once fenced
            with pytest.raises(ProducerFenced, match=f"a newer instance of transactional id {NAME} exists"):
                await old.begin_transaction()  # also a new transaction (docs/transactions.md: "refuses everything")
            refused = await raw(a, {"op": "transaction", "action": "end", "xid": f"TX:{pid}.{epoch - 1}:1",
                                    "producer_id": pid, "producer_epoch": epoch - 1})
            assert refused.code == c.FORBIDDEN and "fenced" in refused.message, refused.header
            # A zombie's put gets one verdict (the partition's table and the name's fence decide
            # together): fenced, naming the transactional id and the newest epoch.
            zombie_put = PutRequest(topic=TOPIC, partition=PARTITIONS - 1, producer_id=pid, producer_epoch=epoch - 1,
                                    sequence=1000, txid=f"TX:{pid}.{epoch - 1}:1").to_header()
            refused = await raw(a, zombie_put, encode_record(b"zombie-put"))
            assert refused.code == c.FORBIDDEN and refused.get("current_epoch") == epoch, refused.header
            assert refused.message.startswith(f"fenced: a newer instance of transactional id {NAME} exists"), refused.header

            await new.begin_transaction()
            await new.send_message(Message(TOPIC, b"new-2"))
            await new.commit()
            await replicated(a, b)
            for broker in (a, b):
                await asyncio.to_thread(
                    wait_until, lambda broker=broker: asyncio.run(visible_all(broker)) == [b"new-1", b"new-2"], 10, 0.1,
                    f"{broker.name} to show the new instance's transactions and nothing of the zombie's")

            node = f"{ZkPaths(zk_root).broker(GROUP)}/transactional_ids/{NAME}"
            assert json.loads(zk_client.get(node)[0]) == {"producer_id": pid, "epoch": epoch}

            inits = await asyncio.gather(*(raw(a, {"op": "init_producer", "transactional_id": "race"}) for _ in range(6)))
            assert sorted(reply["epoch"] for reply in inits) == list(range(6))
            assert len({reply["producer_id"] for reply in inits}) == 1
            bad = await raw(a, {"op": "init_producer", "transactional_id": "../etc"})
            assert bad.code == c.BAD_REQUEST and "transactional id" in bad.message, bad.header

    asyncio.run(scenario())


def test_a_restarted_broker_still_fences_from_its_logs_and_the_zookeeper_mapping(
        broker_factory: Any, zk_client: Any, zk_root: str) -> None:
    group = Group(zk_client, zk_root)
    master = broker_factory(GROUP, {TOPIC: PARTITIONS}, {"unflushThreshold": 0}, zookeeper=ZK_SETTINGS)
    producer: dict[str, int] = {}

    async def before() -> None:
        async with AsyncMessageSessionFactory(client_config(broker_factory)) as factory:
            _old, _new, pid, _epoch = await zombie_and_successor(factory)
            # A third instance inits and sends nothing: only the mapping knows its epoch.
            quiet = factory.create_transactional_producer(transactional_id=NAME)
            await quiet.sender.ensure_producer_id(TOPIC)
            producer.update(pid=pid, epoch=quiet.sender.producer_epoch)

    asyncio.run(before())
    epoch = group.epoch()
    master.restart(kill=True)
    wait_leads(master, group, epoch - 1)

    async def after() -> None:
        pid, quiet_epoch = producer["pid"], producer["epoch"]
        await assert_zombie_refused(master, pid, quiet_epoch - 2)  # the first instance: BATCH records and mapping
        await assert_zombie_refused(master, pid, quiet_epoch - 1)  # the second: the mapping alone
        async with AsyncMessageSessionFactory(client_config(broker_factory)) as factory:
            newest = await committed(factory, b"after restart")
            assert (newest.sender.producer_id, newest.sender.producer_epoch) == (pid, quiet_epoch + 1)
        assert await visible_all(master) == sorted([b"new-1", b"after restart"])

    asyncio.run(after())


def test_after_a_kill_9_failover_the_new_master_fences_the_zombie_and_continues_the_epochs(
        broker_factory: Any, pair: Any) -> None:
    a, b, group = pair

    async def scenario() -> None:
        async with AsyncMessageSessionFactory(client_config(broker_factory)) as factory:
            _old, new, pid, epoch = await zombie_and_successor(factory)
            await new.begin_transaction()
            await new.send_message(Message(TOPIC, b"open at the crash"))

            master_epoch = group.epoch()
            a.kill()
            await asyncio.to_thread(wait_leads, b, group, master_epoch)
            await assert_zombie_refused(b, pid, epoch - 1)
            with pytest.raises(TransactionError):
                await new.commit()  # unprepared at the crash: the new master rolled it back

            newest = await committed(factory, b"after failover")
            assert (newest.sender.producer_id, newest.sender.producer_epoch) == (pid, epoch + 1)
            await new.begin_transaction()
            with pytest.raises(ProducerFenced):
                await new.send_message(Message(TOPIC, b"now a zombie too"))
            assert await visible_all(b) == sorted([b"new-1", b"after failover"])

    asyncio.run(scenario())


def test_with_security_on_a_name_belongs_to_the_user_who_first_inited_it(broker_factory: Any, tmp_path: Any) -> None:
    secured = SecuredGroup(tmp_path / "security")
    master = broker_factory(GROUP, {TOPIC: 1}, {"unflushThreshold": 0, **secured.system})
    init = {"op": "init_producer", "transactional_id": "billing"}
    first = run(request_as(master, "app", init))
    assert first.code == c.OK and first["epoch"] == 0, first.header
    refused = run(request_as(master, "reader", init))  # a user may not fence another user's producer
    assert refused.code == c.FORBIDDEN and "belongs to another user" in refused.message, refused.header
    assert "'app'" not in refused.message  # the owner is not named (nor recorded in ZooKeeper)
    by_admin = run(request_as(master, "ops", init))
    assert by_admin.code == c.OK and (by_admin["producer_id"], by_admin["epoch"]) == (first["producer_id"], 1)


def test_two_brokers_of_a_group_racing_on_one_name_in_zookeeper_get_distinct_epochs(zk_client: Any, zk_root: str) -> None:
    """The compare-and-set on the real znode: e.g. an old master still answering while the new one inits."""
    paths = ZkPaths(zk_root)

    def create(path: str, value: bytes) -> Any:
        return zk_client.create(path, value, makepath=True)

    def broker_side() -> TransactionalIds:
        allocator = ProducerIdAllocator(GROUP, zookeeper_blocks(zk_client, paths, GROUP, create))
        return TransactionalIds(allocator, ZooKeeperMapping(zk_client, paths, GROUP, create))

    async def race() -> list[Owner]:
        brokers = [broker_side(), broker_side()]
        inits = await asyncio.gather(*(brokers[i % 2].init("raced") for i in range(10)))
        return [owner for owner, _previous in inits]

    owners = asyncio.run(race())
    assert sorted(owner.epoch for owner in owners) == list(range(10))
    assert len({owner.producer_id for owner in owners}) == 1
    assert ZooKeeperMapping(zk_client, paths, GROUP, zk_client.create).read_all() == {"raced": Owner(owners[0].producer_id, 9)}


def test_an_xa_instance_fences_the_old_ones_unprepared_branch_and_leaves_its_prepared_one(
        broker_factory: Any, pair: Any) -> None:
    a, _b, _group = pair
    prepared, unprepared, fresh = Xid(3, b"prepared"), Xid(3, b"unprepared"), Xid(3, b"fresh")

    async def scenario() -> None:
        async with AsyncMessageSessionFactory(client_config(broker_factory)) as factory:
            old = factory.create_xa_producer(transactional_id="tm-1")
            old_resource = old.xa_resource()
            for xid in (prepared, unprepared):
                await old_resource.start(xid)
                await old.send_message(Message(TOPIC, str(xid).encode()))
                await old_resource.end(xid)
            assert await old_resource.prepare(prepared) == old_resource.XA_OK

            new = factory.create_xa_producer(transactional_id="tm-1")
            resource = new.xa_resource()
            await resource.start(fresh)
            await new.send_message(Message(TOPIC, str(fresh).encode()))  # the init: the old instance is fenced
            await resource.end(fresh)
            await resource.commit(fresh, one_phase=True)
            with pytest.raises(ProducerFenced):
                await old_resource.prepare(unprepared)
            with pytest.raises(ProducerFenced):
                await old_resource.start(Xid(3, b"after-the-fence"))  # a fenced resource refuses everything
            assert await resource.recover() == [prepared]  # the prepared branch waits for its transaction manager
            await resource.commit(prepared, one_phase=False)
            assert await visible_all(a) == sorted([str(fresh).encode(), str(prepared).encode()])

    asyncio.run(scenario())
