"""Exactly once through a kill -9 failover of a sync pair, with the idempotent producer.

Group 0: A (master) and B (``--slave``), ``replicationMode=sync``, group commit, ZK
session 1500 ms (failover_support). The ordinary client with ``idempotence=True`` sends a
steady stream; A is killed with SIGKILL mid-stream, puts in flight on A have an unknown
outcome and are resent, with the same producer id and sequence, to B once it leads.

* every acked message is on B exactly once, at its acked offset (a resent batch that A
  had stored, and B had from replication, is answered as a duplicate with the original
  offsets instead of being stored again);
* the same with concurrent ``send_batch`` callers, several numbered puts per partition
  in flight at the kill: exactly once, and each caller's messages in its send order;
* a batch acked by A and resent by hand to B is answered ``duplicate`` with A's offset
  and msg id, and nothing is appended;
* (one broker) a consumer gets exactly the idempotent producers' messages, at their
  acked offsets: the BATCH records in the log are never delivered;
* (one broker) the verdicts on the wire: a gap is refused naming the expected sequence,
  a resend is a duplicate, a forged control record is refused, producer ids come from
  the group's counter in ZooKeeper.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

from metaq.client import AsyncMessageSessionFactory, Message, MessageSessionFactory, MetaClientConfig
from metaq.client.codec import encode_messages
from metaq.client.connection import BrokerConnection
from metaq.protocol.messages import InitProducerRequest, PutRequest
from metaq.tools.launcher import wait_until

from .failover_support import TOPIC, Group, fetch_all, make_pair, run, stat, sync_system, wait_leads

PARTITIONS = 4


async def _numbered_put(address: tuple[str, int], producer_id: int | None, payloads: list[bytes]) -> tuple[int, dict]:
    """Put ``payloads`` as one batch numbered (producer_id or a new one, epoch 0, sequence 0)."""
    conn = await BrokerConnection.open(*address, timeout=2)
    try:
        if producer_id is None:
            reply = await conn.request(InitProducerRequest().to_header(), timeout=10)
            assert reply.code == 200, reply.message
            producer_id = int(reply["producer_id"])
        body, _ = encode_messages([Message(TOPIC, p) for p in payloads])
        header = PutRequest(topic=TOPIC, partition=0, count=len(payloads), producer_id=producer_id,
                            producer_epoch=0, sequence=0).to_header()
        reply = await conn.request(header, body, timeout=10)
        return producer_id, reply.header
    finally:
        conn.close()


class Load:
    """One message every ``interval`` s through the blocking producer, from a thread."""

    def __init__(self, factory: MessageSessionFactory, interval: float = 0.002) -> None:
        self.producer = factory.create_producer()
        self.interval = interval
        self.sent: list[tuple[bytes, object]] = []  # (payload, future of its SendResult)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            payload = f"idem-{n}".encode()
            self.sent.append((payload, self.producer.send_message_async(Message(TOPIC, payload))))
            n += 1
            time.sleep(self.interval)

    def start(self) -> "Load":
        self._thread.start()
        return self

    def acked(self) -> int:
        return sum(1 for _, f in self.sent if f.done() and f.result().success)  # type: ignore[attr-defined]

    def stop(self) -> list[tuple[bytes, object]]:
        self._stop.set()
        self._thread.join()
        self.producer.flush()
        return [(payload, future.result()) for payload, future in self.sent]  # type: ignore[attr-defined]


def failover_config(zk, zk_root: str) -> MetaClientConfig:  # type: ignore[no-untyped-def]
    """An idempotent client that rides out the failover: resends until the new master answers."""
    return MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000,
                            request_timeout_s=3, send_timeout_s=60, send_max_attempts=10_000,
                            send_retry_max_wait_s=0.2, idempotence=True)


def kill_mid_stream(load: Any, a: Any, b: Any, group: Group, epoch_before: int, acks: int) -> None:
    """``acks`` acks from A, kill -9 of A, B leads, ``acks`` more acks from B."""
    wait_until(lambda: load.acked() >= acks, 60, message=f"{acks} acks from A")
    a.kill()
    wait_leads(b, group, epoch_before)
    acked_before = load.acked()
    wait_until(lambda: load.acked() >= acked_before + acks, 60, message=f"{acks} more acks from B")


def check_exactly_once_at_offsets(b: Any, results: list[tuple[bytes, Any]], partitions: int,
                                  prefix: bytes) -> dict[int, dict[int, bytes]]:
    """Every send acked, each on B at its acked offset, none twice; B's records by partition."""
    failed = [(p, r.error_message) for p, r in results if not r.success]
    assert not failed, failed[:3]
    on_b = {n: fetch_all(b, partition=n) for n in range(partitions)}
    wrong_place = [(p, r.partition, r.offset) for p, r in results if on_b[r.partition.partition].get(r.offset) != p]
    assert not wrong_place, wrong_place[:3]
    copies = Counter(data for records in on_b.values() for data in records.values() if data.startswith(prefix))
    duplicated = {p: n for p, n in copies.items() if n > 1}
    assert not duplicated, list(duplicated.items())[:3]
    assert len(copies) == len(results)
    return on_b


def test_every_acked_message_is_on_the_new_master_exactly_once_at_its_offset(broker_factory, zk, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    # Four partitions: at the kill, up to four batches are in flight, each resent to B.
    a, b = make_pair(broker_factory, sync_system(), group, partitions=PARTITIONS)
    epoch_before = group.epoch()

    # A batch acked by A (sync: B holds it), to be resent to B after the failover.
    producer_id, original = run(_numbered_put(a.address, None, [b"by-hand-0", b"by-hand-1"]))
    assert original["code"] == 200 and not original.get("duplicate")

    with MessageSessionFactory(failover_config(zk, zk_root)) as factory:
        load = Load(factory, interval=0.001).start()
        kill_mid_stream(load, a, b, group, epoch_before, 300)
        results = load.stop()
    on_b = check_exactly_once_at_offsets(b, results, PARTITIONS, b"idem-")
    print(f"\nidempotent failover: {len(results)} acked, 0 lost, 0 duplicated; "
          f"retries B answered as duplicates: {stat(b, 'put_duplicates')}")

    # The hand-made batch, resent to the new master: a duplicate, with A's offsets.
    end_before = max(on_b[0])
    _, resent = run(_numbered_put(b.address, producer_id, [b"by-hand-0", b"by-hand-1"]))
    assert resent["code"] == 200 and resent["duplicate"] is True
    assert (resent["offset"], resent["msg_id"], resent["end_offset"]) == (
        original["offset"], original["msg_id"], original["end_offset"])
    assert max(fetch_all(b)) == end_before  # nothing appended


class BatchLoad:
    """``callers`` tasks each sending batches of ``size`` through one asyncio producer, in a thread of its own.

    Round robin spreads each batch over the partitions, so every partition has several
    numbered puts in flight (up to ``max_in_flight_per_partition``).
    """

    def __init__(self, config: MetaClientConfig, callers: int = 8, size: int = 10) -> None:
        self.config, self.callers, self.size = config, callers, size
        self.sent: list[tuple[bytes, object]] = []  # (payload, SendResult), each caller's in its send order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        async with AsyncMessageSessionFactory(self.config) as factory:
            producer = factory.create_producer()
            await producer.publish(TOPIC)

            async def caller(name: int) -> None:
                n = 0
                while not self._stop.is_set():
                    payloads = [f"batch-{name}-{n:06d}-{i:02d}".encode() for i in range(self.size)]
                    results = await producer.send_batch([Message(TOPIC, p) for p in payloads])
                    self.sent.extend(zip(payloads, results))
                    n += 1

            await asyncio.gather(*(caller(c) for c in range(self.callers)))

    def start(self) -> "BatchLoad":
        self._thread.start()
        return self

    def acked(self) -> int:
        return sum(1 for _, r in list(self.sent) if r.success)  # type: ignore[attr-defined]

    def stop(self) -> list[tuple[bytes, object]]:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the batch callers did not stop"
        return self.sent


def test_concurrent_send_batch_with_puts_in_flight_per_partition_through_a_kill(broker_factory, zk, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    partitions = 2  # 8 callers over 2 partitions: several numbered puts per partition in flight
    a, b = make_pair(broker_factory, sync_system(), group, partitions=partitions)
    epoch_before = group.epoch()
    load = BatchLoad(failover_config(zk, zk_root)).start()
    kill_mid_stream(load, a, b, group, epoch_before, 2000)
    results = load.stop()
    on_b = check_exactly_once_at_offsets(b, results, partitions, b"batch-")
    # Each caller's messages, partition by partition, in its send order (payloads sort in send order).
    for records in on_b.values():
        by_caller: dict[bytes, list[bytes]] = {}
        for offset in sorted(records):
            data = records[offset]
            if data.startswith(b"batch-"):
                by_caller.setdefault(data.split(b"-")[1], []).append(data)
        for caller, payloads in by_caller.items():
            assert payloads == sorted(payloads), f"caller {caller!r} out of order"
    print(f"\nconcurrent send_batch failover: {len(results)} acked, 0 lost, 0 duplicated, in order; "
          f"retries B answered as duplicates: {stat(b, 'put_duplicates')}")


def test_consumers_get_exactly_the_idempotent_producers_messages(broker_factory, zk, zk_root, tmp_path):
    """Both producers (blocking direct path and batches) with idempotence; a consumer sees no BATCH record."""
    from .test_client_basic import SYSTEM, Collector, consumer_config

    broker_factory(0, {"plain": 2}, system=SYSTEM)
    config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000, idempotence=True)
    with MessageSessionFactory(config) as factory:
        producer = factory.create_producer()
        producer.publish("plain")
        results = [producer.send_message(Message("plain", f"m{i}".encode())) for i in range(20)]
        results += producer.send_batch([Message("plain", f"b{i}".encode()) for i in range(30)])
        assert all(r.success for r in results), [r.error_message for r in results if not r.success]
        collector = Collector()
        consumer = factory.create_consumer(consumer_config(tmp_path))
        consumer.subscribe("plain", 64 * 1024, collector)
        consumer.complete_subscribe()
        collector.wait_for(50)
        time.sleep(0.3)
        consumer.shutdown()
    assert Counter(collector.data()) == Counter([f"m{i}".encode() for i in range(20)] + [f"b{i}".encode() for i in range(30)])
    assert sorted((str(r.partition), r.offset) for r in results) == sorted((str(m.partition), m.offset) for m in collector.messages)


async def _put_numbered(conn: BrokerConnection, topic: str, payloads: list[bytes], **numbers: object) -> dict:
    body, _ = encode_messages([Message(topic, p) for p in payloads])
    header = PutRequest(topic=topic, partition=0, count=len(payloads), **numbers).to_header()  # type: ignore[arg-type]
    return (await conn.request(header, body, timeout=10)).header


def test_the_brokers_verdicts_and_producer_ids_from_zookeeper(broker_factory, zk_client, zk_root):
    from metaq.protocol.messages import InitProducerRequest
    from metaq.txn.control import Control, Kind, encode_control
    from metaq.zk.paths import ZkPaths

    broker = broker_factory(0, {"v": 1}, system={"unflushThreshold": 0})

    async def scenario() -> None:
        conn = await BrokerConnection.open(*broker.address, timeout=2)
        try:
            ids = [int((await conn.request(InitProducerRequest().to_header(), timeout=10))["producer_id"]) for _ in range(3)]
            assert len(set(ids)) == 3
            pid = ids[0]
            first = await _put_numbered(conn, "v", [b"a", b"b"], producer_id=pid, producer_epoch=0, sequence=0)
            assert first["code"] == 200 and first["msg_id"] > 0
            gap = await _put_numbered(conn, "v", [b"c"], producer_id=pid, producer_epoch=0, sequence=5)
            assert gap["code"] == 400 and gap["expected_seq"] == 2 and "expected 2" in gap["msg"]
            again = await _put_numbered(conn, "v", [b"a", b"b"], producer_id=pid, producer_epoch=0, sequence=0)
            assert again["duplicate"] is True and (again["offset"], again["msg_id"]) == (first["offset"], first["msg_id"])
            half = await _put_numbered(conn, "v", [b"x"], producer_id=pid)
            assert half["code"] == 400 and "producer_epoch and sequence" in half["msg"]
            huge = await _put_numbered(conn, "v", [b"x"], producer_id=pid, producer_epoch=1 << 20, sequence=0)
            assert huge["code"] == 400 and "out of range" in huge["msg"]
            # A producer may not write a control record (a forged BATCH header or marker).
            forged = encode_control(Control(Kind.COMMIT, 1, 0, 0, "TX:1:0"))
            reply = await conn.request(PutRequest(topic="v", partition=0).to_header(), forged, timeout=10)
            assert reply.code == 400 and "reserved control attribute" in reply.message
        finally:
            conn.close()

    run(scenario())
    # The ids came from the group's counter in ZooKeeper: one block taken.
    value, _ = zk_client.get(ZkPaths(zk_root).producer_ids(0))
    assert int(value) == 1000
