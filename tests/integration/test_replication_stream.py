"""The replication stream (replicationStream=true) with real processes: caught-up sync slaves
take each put's bytes pushed by the master and report positions on the stream
(metaq/ha/stream.py, metaq/protocol/replication_stream.py).

Every acked sync put is on every sync slave and the logs are byte-identical; the stream is
used (``replication_stream_frames`` on the slave); every doubt falls back to fetching with
nothing lost: the stream cut mid-frame by a proxy, a slave restarted, a kill -9 failover,
topics created/altered/deleted while streaming. Security on (a report on a connection that
holds no stream, or past what was sent, refused and logged): test_trust_replica_identity.py.
"""

from __future__ import annotations

import asyncio

import pytest

from metaq.record import encode_batch
from metaq.zk.embedded import free_port

from .failover_support import Group, SLAVE_B, ZK_SETTINGS, sync_system, wait_follows, wait_in_sync_set, wait_leads
from .replication_support import assert_identical, blocking_puts, put, replica_rows, stat, wait_caught_up, wait_for
from .test_sync_replication import (
    PIECE_REPORTING_SLAVE, SYNC, TOPIC, batch_body, on_disk, pipelined_puts, stamped, wait_sync_set,
)
from .test_topics_cli import metaq, serves

STREAM = {**SYNC, "replicationStream": True}
#: Streaming slaves report positions as they append (a group-commit slave reports fsynced
#: ends only, so it keeps fetching): the failover pair flushes by the default policy.
STREAM_FAILOVER = {**{k: v for k, v in sync_system().items() if k != "unflushThreshold"}, "replicationStream": True}


def stream_frames(slave) -> int:
    return int(stat(slave, "replication_stream_frames") or 0)


def start_streaming(broker_factory, zk_client, zk_root, slaves: int = 1, partitions: int = 2, **master_system):
    master = broker_factory(0, {TOPIC: partitions}, {**STREAM, **master_system})
    group = [broker_factory(0, {TOPIC: partitions}, PIECE_REPORTING_SLAVE, {"slaveId": k}) for k in range(slaves)]
    wait_sync_set(zk_client, zk_root, list(range(slaves)))
    # ZooKeeper names the set as soon as it is published, a moment before the master takes the
    # published set as its own (sync_set.py: publish before release): puts are accepted from then.
    wait_for(lambda: stat(master, "sync_state") == "ok", 10, "the master to take its published sync set")
    return master, group


def wait_streaming(slave, partitions: list[int], timeout: float = 20) -> None:
    wait_for(lambda: all(replica_rows(slave).get((TOPIC, p), {}).get("mode") == "streaming" for p in partitions),
             timeout, f"{slave.name} to stream partitions {partitions}")


async def acked_puts(address, puts: int, deadline_s: float) -> list[tuple[int, int, int, bytes]]:
    """Blocking puts round-robin over 2 partitions until ``puts`` were acked (200); 503 and
    504 are retried (a 504's put may be stored: the slave copies it all the same)."""
    from metaq.client.connection import BrokerConnection

    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    conn = await BrokerConnection.open(*address)
    acked: list[tuple[int, int, int, bytes]] = []
    seq = 0
    try:
        while len(acked) < puts:
            assert loop.time() < deadline, f"only {len(acked)} of {puts} puts acked in {deadline_s} s"
            partition = seq % 2
            body = batch_body(partition, seq, 2)
            reply = await conn.request({"op": "put", "topic": TOPIC, "partition": partition}, body, timeout=30)
            seq += 1
            if reply.code == 200:
                acked.append((partition, reply["offset"], reply["end_offset"], stamped(body, reply["msg_id"])))
            else:
                assert reply.code in (503, 504), reply.header
                await asyncio.sleep(0.02)
    finally:
        conn.close()
    return acked


def assert_acked_on(slave, acked) -> None:
    """Every acked put's stamped bytes are in the slave's segment files at its offsets."""
    for partition in {a[0] for a in acked}:
        data = on_disk(slave, partition)
        for _p, offset, end, stamped in (a for a in acked if a[0] == partition):
            assert data[offset:end] == stamped, f"{slave.name}: acked put at {partition}:{offset} missing or different"


@pytest.mark.parametrize("slaves", [1, 2], ids=["sync-pair", "two-sync-slaves"])
def test_every_acked_put_streamed_to_every_sync_slave(broker_factory, zk_client, zk_root, slaves: int) -> None:
    master, group = start_streaming(broker_factory, zk_client, zk_root, slaves=slaves)
    blocking_puts(master, TOPIC, 0, 20)  # fetched until caught up, then subscribed
    blocking_puts(master, TOPIC, 1, 20)
    for slave in group:
        wait_streaming(slave, [0, 1])
    before = [stream_frames(slave) for slave in group]
    blocking_puts(master, TOPIC, 0, 200)
    acked = asyncio.run(pipelined_puts(master.address, partitions=2, puts=300, batch=3))
    assert len(acked) == 300
    for slave, frames in zip(group, before):
        assert stream_frames(slave) - frames >= 200, "the blocking puts were not streamed"
        assert_acked_on(slave, acked)  # acked means on every sync slave, read before any catch-up
        wait_caught_up(master, slave, [(TOPIC, 0), (TOPIC, 1)])
    assert_identical(master, slaves=slaves)
    # The master pushed, and heard positions on, the stream.
    assert int(stat(master, "replication_streams") or 0) == 2 * slaves


def test_transaction_markers_travel_on_the_stream_like_puts(broker_factory, zk_client, zk_root) -> None:
    """A commit or rollback marker is appended by the partition's one leader append entry, as a
    put is: pushed to the streaming slave, never a gap that closes the stream. Both brokers then
    show exactly the committed messages, and their logs are byte-identical."""
    from chaos.transactions import read_committed
    from metaq.client import Message, MetaClientConfig
    from metaq.client.session import AsyncMessageSessionFactory

    master, (slave,) = start_streaming(broker_factory, zk_client, zk_root)
    blocking_puts(master, TOPIC, 0, 20)
    blocking_puts(master, TOPIC, 1, 20)
    wait_streaming(slave, [0, 1])
    closed, frames = int(stat(master, "replication_streams_closed") or 0), stream_frames(slave)
    config = MetaClientConfig(zk_connect=broker_factory.zk_connect, zk_root=broker_factory.zk_root,
                              zk_session_timeout_ms=5000, send_timeout_s=30)

    async def transactions() -> list[bytes]:
        committed = []
        async with AsyncMessageSessionFactory(config) as factory:
            producer = factory.create_transactional_producer()
            for round_ in range(4):
                await producer.begin_transaction()
                data = [f"tx{round_}-{i}".encode() for i in range(4)]
                for item in data:
                    await producer.send_message(Message(TOPIC, item))
                if round_ == 2:
                    await producer.rollback()
                else:
                    await producer.commit()
                    committed += data
        return sorted(committed)

    committed = asyncio.run(transactions())
    wait_caught_up(master, slave, [(TOPIC, 0), (TOPIC, 1)])
    assert int(stat(master, "replication_streams_closed") or 0) == closed, "a marker closed a stream"
    assert all(row.get("mode") == "streaming" for row in replica_rows(slave).values())
    assert stream_frames(slave) > frames
    assert_identical(master)

    async def seen(broker) -> list[bytes]:
        found = []
        for partition in (0, 1):
            found += [m for m in await read_committed(broker.address, TOPIC, partition) if m.startswith(b"tx")]
        return sorted(found)

    for broker in (master, slave):
        assert asyncio.run(seen(broker)) == committed, f"{broker.name} shows other than the committed messages"


def test_stream_cut_mid_frame_falls_back_to_fetching_and_loses_nothing(broker_factory, zk_client, zk_root) -> None:
    from chaos.proxy import ProxyThread
    from chaos.toxiproxy_client import client_for

    with ProxyThread() as server:
        toxi = client_for(server.url)
        listen = f"127.0.0.1:{free_port('127.0.0.1')}"
        port = free_port("127.0.0.1")
        proxy = toxi.create(upstream=f"127.0.0.1:{port}", name="master", listen=listen)
        # The slave reaches the master only through the proxy (the master advertises it).
        master = broker_factory(0, {TOPIC: 2}, {**STREAM, "serverPort": port, "advertisedAddress": listen}, start=False)
        master.start(wait_zk=False)
        wait_for(lambda: Group(zk_client, zk_root).master() == f"meta://{listen}", 30, "the master to lead at the proxy's address")
        slave = broker_factory(0, {TOPIC: 2}, PIECE_REPORTING_SLAVE, {"slaveId": 0})
        wait_sync_set(zk_client, zk_root, [0])
        blocking_puts(master, TOPIC, 0, 20)
        wait_streaming(slave, [0])
        # Every connection to the master is cut after 40 KB towards the slave, in slices of
        # 7 bytes on average: stream frames are cut mid-head and mid-chunk, again and again.
        proxy.add_toxic(name="slices", type="slicer", stream="downstream",
                        attributes={"average_size": 7, "size_variation": 5, "delay": 0})
        proxy.add_toxic(name="cut", type="limit_data", stream="downstream", attributes={"bytes": 40_000})
        # Each cut drops the slave from the sync set (reject): puts in flight then get 504
        # (outcome unknown) or 503 until it is back; every 200 must be on the slave.
        acked = asyncio.run(acked_puts(master.address, puts=300, deadline_s=120))
        assert_acked_on(slave, acked)
        cuts = slave.log_text().count("the connection to the master was lost")
        assert cuts >= 1, "the stream was never cut"
        proxy.destroy_toxic("cut")
        proxy.destroy_toxic("slices")
        frames = stream_frames(slave)
        wait_streaming(slave, [0, 1])  # back on the stream after the cuts
        blocking_puts(master, TOPIC, 1, 50)
        assert stream_frames(slave) >= frames + 50
        wait_caught_up(master, slave, [(TOPIC, 0), (TOPIC, 1)])
        assert_identical(master)


def test_slave_restarted_while_streaming_resumes_from_its_log_end(broker_factory, zk_client, zk_root) -> None:
    master, (slave,) = start_streaming(broker_factory, zk_client, zk_root, onSyncSlaveLoss="degrade")
    blocking_puts(master, TOPIC, 0, 30)
    wait_streaming(slave, [0])
    slave.kill()
    put(master, TOPIC, 0, 100)  # degraded: acked without the slave
    slave.start()
    wait_sync_set(zk_client, zk_root, [0])
    wait_streaming(slave, [0])  # caught up by fetching, then streamed again
    frames = stream_frames(slave)
    acked = asyncio.run(pipelined_puts(master.address, partitions=2, puts=100, batch=2))
    assert_acked_on(slave, acked)
    assert stream_frames(slave) > frames
    wait_caught_up(master, slave, [(TOPIC, 0), (TOPIC, 1)])
    assert_identical(master)


def test_kill_9_of_a_streaming_master_loses_no_acked_put(broker_factory, zk_client, zk_root) -> None:
    group = Group(zk_client, zk_root)
    a = broker_factory(0, {TOPIC: 2}, STREAM_FAILOVER, name="A", zookeeper=ZK_SETTINGS)
    b = broker_factory(0, {TOPIC: 2}, STREAM_FAILOVER, {"slaveId": SLAVE_B}, name="B", zookeeper=ZK_SETTINGS)
    wait_follows(b, a, group)
    wait_in_sync_set(group, SLAVE_B)
    blocking_puts(a, TOPIC, 0, 20)
    blocking_puts(a, TOPIC, 1, 20)
    wait_for(lambda: stream_frames(b) > 0, 20, "B to stream")
    acked = asyncio.run(pipelined_puts(a.address, partitions=2, puts=300, batch=2))
    epoch = group.epoch()
    a.kill()  # right after the last ack
    wait_leads(b, group, epoch)
    assert_acked_on(b, acked)
    a.start(wait_zk=False)
    wait_follows(a, b, group)
    put(b, TOPIC, 0, 20)
    wait_caught_up(b, a, [(TOPIC, 0), (TOPIC, 1)])
    assert_identical(b)


def test_topics_created_altered_and_deleted_while_streaming(broker_factory, zk, zk_client, zk_root, capsys) -> None:
    master, (slave,) = start_streaming(broker_factory, zk_client, zk_root)
    blocking_puts(master, TOPIC, 0, 20)
    wait_streaming(slave, [0])

    def run_topics(*args: str) -> None:
        code, out = metaq(capsys, zk, zk_root, "topics", *args)
        assert code == 0, out

    with_puts = asyncio.run  # the stream keeps carrying puts of t while the topic set changes
    run_topics("create", "--broker-id", "0", "--topic", "audit", "--partitions", "2")
    wait_for(lambda: serves(slave, "audit") == 2, 20, "the slave to serve audit")
    acked = with_puts(pipelined_puts(master.address, partitions=2, puts=100, batch=2))
    for partition in range(2):
        blocking_puts(master, "audit", partition, 30)
    run_topics("alter", "--broker-id", "0", "--topic", "audit", "--partitions", "3")
    wait_for(lambda: serves(slave, "audit") == 3, 20, "the slave to serve audit's third partition")
    blocking_puts(master, "audit", 2, 30)
    wait_caught_up(master, slave, [("audit", p) for p in range(3)])
    run_topics("delete", "--broker-id", "0", "--topic", "audit")
    wait_for(lambda: serves(slave, "audit") is None and serves(master, "audit") is None, 20, "audit to be deleted")
    run_topics("create", "--broker-id", "0", "--topic", "audit", "--partitions", "1")  # another life of it
    wait_for(lambda: serves(slave, "audit") == 1, 20, "the slave to serve the re-created audit")
    blocking_puts(master, "audit", 0, 30)
    acked += with_puts(pipelined_puts(master.address, partitions=2, puts=100, batch=2))
    assert_acked_on(slave, acked)
    wait_caught_up(master, slave, [(TOPIC, 0), (TOPIC, 1), ("audit", 0)])
    assert stream_frames(slave) > 100
    assert_identical(master)


# --- security on, TLS on every link ------------------------------------------------------------


def test_stream_over_tls_with_security_on_refuses_forged_reports(broker_factory, zk_client, zk_root, tmp_path) -> None:
    from metaq.client.connection import BrokerConnection, Credentials
    from metaq.protocol.messages import StreamRequest
    from metaq.protocol.replication_stream import encode_report
    from metaq.security.group import GroupSecret
    from metaq.security.handshake import ClientAuthenticator

    from .trust_support import PASSWORDS, start_tls_pair

    group, ca, master, slave = start_tls_pair(broker_factory, zk_client, zk_root, tmp_path, {TOPIC: 1},
                                              master_system={"replicationStream": True}, slave_system={})
    app = Credentials("app", PASSWORDS["app"], str(ca.cert_file))
    secret = GroupSecret.load(group.secret_file, 0)

    async def as_member(member: str) -> BrokerConnection:
        return await BrokerConnection.open(*master.address, ssl=app.ssl_context, authenticator=ClientAuthenticator(
            secret.username(member), secret.scram_password()))

    async def go() -> None:
        producer = await app.open(*master.address)
        try:
            async def puts(n: int) -> None:
                for seq in range(n):
                    body = encode_batch([(f"tls-{seq}".encode(), None)])
                    reply = await producer.request({"op": "put", "topic": TOPIC, "partition": 0}, body, timeout=30)
                    assert reply.ok, reply.header

            async def slave_stats() -> dict[str, str]:
                ops = await Credentials("ops", PASSWORDS["ops"], str(ca.cert_file)).open(*slave.address)
                try:
                    body = (await ops.request({"op": "stats"})).body.decode()
                finally:
                    ops.close()
                return dict(line.partition(" ")[::2] for line in body.splitlines())

            await puts(20)
            for _ in range(200):  # the real slave streams over TLS
                if int((await slave_stats()).get("replication_stream_frames", 0)):
                    break
                await puts(1)
            frames = int((await slave_stats())["replication_stream_frames"])
            assert frames > 0
            await puts(50)
            assert int((await slave_stats())["replication_stream_frames"]) >= frames + 50
            epoch = (await producer.request({"op": "topics"}))["epoch"]

            # Another member's login may not subscribe as slave0.
            rival = await as_member("slave1")
            try:
                log_end = (await rival.request({"op": "offset", "topic": TOPIC, "partition": 0, "offset": 0}))["max_offset"]
                header = StreamRequest(topic=TOPIC, partition=0,
                                       replica={"slave_id": 0, "epoch": epoch, "log_end": log_end}).to_header()
                refused = await rival.request(header, timeout=10)
                assert refused.code == 403 and "may not replicate as slave0" in refused.message, refused.header
                # A report on a connection that holds no stream (forged for the slave's stream ids): refused.
                for stream_id in range(1, 50):
                    rival.send_oneway({"op": "stream_ack", "opaque": 0}, encode_report(stream_id, epoch, log_end))
                await rival.request({"op": "version"})  # the reports were read before this reply
            finally:
                rival.close()
            # slave0's own login, its own stream, a report past what was sent: refused, stream closed.
            own = await as_member("slave0")
            try:
                closed = asyncio.get_running_loop().create_future()
                frames_seen: list[dict] = []

                def on_frame(header, body) -> None:
                    if header is not None:
                        frames_seen.append(header)
                        if header.get("code") == 503 and not closed.done():
                            closed.set_result(header)

                stream_id, accepted = own.subscribe(StreamRequest(
                    topic=TOPIC, partition=0, replica={"slave_id": 0, "epoch": epoch, "log_end": log_end}).to_header(), on_frame)
                assert (await accepted).ok
                own.send_oneway({"op": "stream_ack", "opaque": 0}, encode_report(stream_id, epoch, log_end + 1))
                header = await asyncio.wait_for(closed, 10)
                assert "past what was sent" in header["msg"]
            finally:
                own.close()
            await puts(10)
            assert int((await slave_stats())["replication_stream_frames"]) >= frames + 60  # its stream went on
        finally:
            producer.close()

    asyncio.run(go())
    text = master.log_text()
    assert "refused a stream report" in text and "not subscribed on this connection" in text
    assert "past what was sent" in text
    assert "refused replication for slave0 from broker 'broker:0:slave1'" in text
