"""Several numbered puts per partition in flight (metaq/client/idempotence.py, producer.py).

A fake broker with the real producer-state table (``plan_put``) appends the puts of
each connection in the order they were written, as the real one does, and a fault
script decides, put by put, whether a request is lost before the broker reads it, its
reply is lost after the append, or the connection dies (a failover: the puts written on
it are read up to a point, the rest never; the table survives, as on a sync slave).
Whatever the faults: every acked message is in the log exactly once, at its acked
offset, and the acked messages of a partition are in the log in send order.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any, Callable

import pytest

from metaq.client.codec import decode_messages
from metaq.client.config import MetaClientConfig
from metaq.client.connection import ConnectionClosed, Reply
from metaq.client.idempotence import NoProducerId, Numbered, Sequencer
from metaq.client.message import Message, Partition, SendResult
from metaq.client.producer import AsyncMessageProducer
from metaq.txn.producer_state import ProducerStateTable, Verdict
from metaq.txn.put import plan_put
from tests.unit.test_client_producer import FakeCluster

DELIVER, LOSE_REQUEST, LOSE_REPLY, FAILOVER = "deliver", "lose request", "lose reply", "failover"


class FakeBroker:
    """One partition-per-key log and producer table shared by every connection (master and its sync slave)."""

    def __init__(self) -> None:
        self.tables: dict[int, ProducerStateTable] = {}
        self.logs: dict[int, bytearray] = {}
        self.stored: dict[int, list[tuple[int, bytes]]] = {}  # partition -> (offset, data) in log order
        self.ids = iter(range(7, 1000))

    def put(self, header: dict, body: bytes) -> Reply:
        partition = header["partition"]
        table = self.tables.setdefault(partition, ProducerStateTable())
        log = self.logs.setdefault(partition, bytearray())
        plan = plan_put(table, body, header["count"], producer_id=header["producer_id"], producer_epoch=header["producer_epoch"],
                        first_seq=header["sequence"], timestamp_ms=1)
        decision = plan.decision
        if decision.verdict is Verdict.DUPLICATE:
            offset = -1 if decision.first_offset is None else decision.first_offset  # as the broker answers
            return Reply({"code": 200, "partition": partition, "offset": offset, "msg_id": 1,
                          "count": header["count"], "duplicate": True}, bytearray())
        if decision.verdict is Verdict.OUT_OF_ORDER:
            return Reply({"code": 400, "msg": "out of order", "expected_seq": decision.expected_seq}, bytearray())
        assert decision.verdict is Verdict.NEW and plan.append is not None
        offset = len(log)
        log += plan.append
        table.apply(plan.header, offset, plan.data_start)  # type: ignore[arg-type]
        first = offset + plan.data_start
        messages, _ = decode_messages(body, first, "t", Partition(0, partition))
        self.stored.setdefault(partition, []).extend((m.offset, m.data) for m in messages)  # type: ignore[misc]
        return Reply({"code": 200, "partition": partition, "offset": first, "msg_id": 1, "count": header["count"]}, bytearray())


class FakeBrokerConnection:
    """Reads its puts in write order, a little later; ``faults(put)`` decides each one's fate."""

    def __init__(self, broker: FakeBroker, faults: Callable[[dict], str], pool: "FakeBrokerPool") -> None:
        self.broker, self.faults, self.pool = broker, faults, pool
        self.is_open = True
        self.queue: list[tuple[dict, bytes, asyncio.Future[Reply]]] = []
        self.written: list[tuple[int, int, int]] = []  # (partition, producer id, sequence) in write order

    async def request(self, header: dict, body: bytes = b"", timeout: float | None = None) -> Reply:
        assert header["op"] == "init_producer"
        return Reply({"code": 200, "producer_id": next(self.broker.ids), "epoch": 0}, bytearray())

    async def diagnose(self, exc: Exception, timeout: float = 5.0) -> Exception:
        return exc  # a lost connection is a lost connection here (no TLS port to tell apart)

    def send(self, header: dict, body: bytes) -> "asyncio.Future[Reply]":
        if not self.is_open:
            raise ConnectionClosed("closed")
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.written.append((header["partition"], header["producer_id"], header["sequence"]))
        self.pool.written.append(self.written[-1])
        self.queue.append((header, body, future))
        asyncio.get_running_loop().call_later(0.001, self._read_one)
        return future

    def _read_one(self) -> None:
        if not self.queue or not self.is_open:
            return
        header, body, future = self.queue.pop(0)
        fate = self.faults(header)
        if fate == FAILOVER:  # this put and every later one on the connection: read or not, no reply
            read = random.random() < 0.5
            for h, b, f in [(header, body, future), *self.queue]:
                if read:
                    self.broker.put(h, b)
                    read = random.random() < 0.7
                f.set_exception(ConnectionClosed("connection lost"))
            self.queue.clear()
            self.is_open = False
            return
        if fate == LOSE_REQUEST:
            return  # never read, never answered: the client's request timeout
        reply = self.broker.put(header, body)
        if fate == DELIVER and not future.done():
            future.set_result(reply)


class FakeBrokerPool:
    def __init__(self, faults: Callable[[dict], str]) -> None:
        self.broker = FakeBroker()
        self.faults = faults
        self.conn: FakeBrokerConnection | None = None
        self.written: list[tuple[int, int, int]] = []

    async def get(self, host: str, port: int) -> FakeBrokerConnection:
        if self.conn is None or not self.conn.is_open:
            self.conn = FakeBrokerConnection(self.broker, self.faults, self)
        return self.conn


def inflight_producer(pool: FakeBrokerPool, parts: int = 1, **config: Any) -> AsyncMessageProducer:
    cfg = MetaClientConfig(idempotence=True, request_timeout_s=0.05, send_retry_min_wait_s=0.001,
                           send_retry_max_wait_s=0.01, send_timeout_s=20, **config)
    return AsyncMessageProducer(FakeCluster(brokers=1, parts=parts), pool, cfg)  # type: ignore[arg-type]


def check_exactly_once_in_order(pool: FakeBrokerPool, sent: list[tuple[bytes, SendResult]]) -> None:
    stored = pool.broker.stored
    copies = Counter(data for records in stored.values() for _, data in records)
    assert not [d for d, n in copies.items() if n > 1], "a message stored twice"
    place = {(p, offset): data for p, records in stored.items() for offset, data in records}
    for data, result in sent:
        if result.success:
            assert place.get((result.partition.partition, result.offset)) == data, (data, result)  # type: ignore[union-attr]
    order = {data: i for i, (data, _) in enumerate(sent)}
    acked = {data for data, result in sent if result.success}
    for records in stored.values():
        indexes = [order[data] for _, data in records if data in acked]
        assert indexes == sorted(indexes), "acked messages out of send order"


def new(seq: Sequencer, key: str, count: int, conn: object) -> Numbered | None:
    """A new batch's claim; one refused leaves the line (as a batch that moves elsewhere does)."""
    ticket = seq.enter(key)
    numbered = seq.claim(key, count, conn, None, ticket)
    if numbered is None:
        seq.leave(key, ticket)
    return numbered


def test_a_partition_pipelines_only_after_an_ack_and_only_on_one_connection() -> None:
    seq = Sequencer(limit=3)
    seq.set_id(1, 0)
    conn, other = object(), object()
    first = new(seq, "p", 1, conn)
    assert first is not None and new(seq, "p", 1, conn) is None  # the broker may not know us yet
    seq.end(first, True)
    batches = [new(seq, "p", 2, conn) for _ in range(3)]
    assert [b.sequence for b in batches] == [1, 3, 5]  # type: ignore[union-attr]
    assert new(seq, "p", 1, conn) is None  # the limit
    seq.end(batches[1], True)  # settled behind an unsettled one: still counts against the limit
    assert new(seq, "p", 1, conn) is None
    seq.end(batches[0], True)
    assert new(seq, "p", 1, other) is None  # the others were written on another connection
    seq.failed(batches[2])
    assert new(seq, "p", 1, conn) is None  # a failure: nothing new until the lane is empty
    assert seq.claim("p", 2, other, batches[2]) is batches[2]  # the head is resent
    seq.end(batches[2], True)
    assert new(seq, "p", 1, other).sequence == 7  # type: ignore[union-attr]
    assert seq.try_begin("q", 1) is not None and new(seq, "q", 1, conn) is None  # the direct path holds q alone
    assert seq.try_begin("p", 1) is None


def test_new_batches_are_numbered_in_the_order_they_arrived() -> None:
    seq = Sequencer(limit=5)
    conn = object()
    early, late = seq.enter("p"), seq.enter("p")
    with pytest.raises(NoProducerId):
        seq.claim("p", 1, conn, None, early)
    seq.set_id(1, 0)
    assert seq.claim("p", 1, conn, None, late) is None  # the earlier one waits for the id, the later behind it
    first = seq.claim("p", 1, conn, None, early)
    assert first is not None and first.sequence == 0
    seq.leave("p", late)
    assert seq.try_begin("p", 1) is None  # ``first`` is in flight


def test_a_gap_drops_the_id_and_the_head_behind_it_is_renumbered() -> None:
    seq = Sequencer(limit=3)
    seq.set_id(1, 0)
    conn = object()
    seq.end(new(seq, "p", 1, conn), True)  # type: ignore[arg-type]
    lost, behind = new(seq, "p", 1, conn), new(seq, "p", 1, conn)
    assert lost is not None and behind is not None
    seq.end(lost, False)  # surely not stored, but ``behind`` was written after it: a gap
    assert not seq.has_id and not seq.is_current(behind) and seq.is_head(behind)
    assert seq.renumber(behind) is None  # needs the new id first
    seq.set_id(2, 0)
    renumbered = seq.renumber(behind)
    assert renumbered is not None and (renumbered.producer_id, renumbered.sequence) == (2, 0)
    assert seq.claim("p", 1, conn, renumbered) is renumbered
    with pytest.raises(ValueError):
        Sequencer(limit=6)


def scripted(fates: dict[int, str]) -> Callable[[dict], str]:
    """The n-th put read by the broker (from 0) meets ``fates[n]``; every other one is delivered."""
    count = iter(range(1_000_000))
    return lambda header: fates.get(next(count), DELIVER)


def test_first_of_three_in_flight_times_out_the_others_are_out_of_order_and_all_end_stored_once() -> None:
    pool = FakeBrokerPool(scripted({1: LOSE_REQUEST}))  # put 0 warms the lane up; put 1 is lost
    p = inflight_producer(pool)

    async def scenario() -> list[tuple[bytes, SendResult]]:
        first = await p.send_message(Message("t", b"warm"))
        datas = [b"a", b"b", b"c"]
        results = await asyncio.gather(*(p.send_batch([Message("t", d)]) for d in datas))
        return [(b"warm", first)] + [(d, r[0]) for d, r in zip(datas, results)]

    sent = asyncio.run(scenario())
    assert all(r.success for _, r in sent), [r.error_message for _, r in sent]
    check_exactly_once_in_order(pool, sent)
    assert [d for _, d in pool.broker.stored[0]] == [b"warm", b"a", b"b", b"c"]
    sequences = [s for _, _, s in pool.written]
    # Three in flight at once, then the timed-out one resent first and the others after it.
    assert sequences[:4] == [0, 1, 2, 3] and sequences[4:] == [1, 2, 3]
    assert len({pid for _, pid, _ in pool.written}) == 1


def test_a_failover_in_the_middle_of_a_pipeline() -> None:
    pool = FakeBrokerPool(scripted({3: FAILOVER}))
    p = inflight_producer(pool, parts=2)

    async def scenario() -> list[tuple[bytes, SendResult]]:
        sent = [(f"m{i}".encode(), p.send_message_async(Message("t", f"m{i}".encode()))) for i in range(400)]
        await p.flush()
        return [(d, f.result()) for d, f in sent]

    random.seed(3)
    sent = asyncio.run(scenario())
    assert all(r.success for _, r in sent), [r.error_message for _, r in sent if not r.success][:3]
    check_exactly_once_in_order(pool, sent)


@pytest.mark.parametrize("seed", range(12))
def test_randomized_faults_keep_exactly_once_and_order(seed: int) -> None:
    rng = random.Random(seed)
    random.seed(seed)
    fate_weights = [(DELIVER, 0.8), (LOSE_REQUEST, 0.07), (LOSE_REPLY, 0.08), (FAILOVER, 0.05)]

    def faults(header: dict) -> str:
        return rng.choices([f for f, _ in fate_weights], [w for _, w in fate_weights])[0]

    pool = FakeBrokerPool(faults)
    p = inflight_producer(pool, parts=2, batch_size=300)

    async def scenario() -> list[tuple[bytes, SendResult]]:
        # One sender per partition key order: per-message sends in order, batches from several tasks.
        async def batches(task: int) -> list[tuple[bytes, SendResult]]:
            out = []
            for n in range(5):
                datas = [f"b{task}-{n}-{i}".encode() for i in range(rng.randrange(1, 6))]
                results = await p.send_batch([Message("t", d) for d in datas])
                out += list(zip(datas, results))
            return out

        futures = [(f"s{i}".encode(), p.send_message_async(Message("t", f"s{i}".encode()))) for i in range(150)]
        batch_sent = await asyncio.gather(*(batches(t) for t in range(4)))
        await p.flush()
        return [(d, f.result()) for d, f in futures] + [x for task in batch_sent for x in task]

    sent = asyncio.run(scenario())
    assert all(r.success for _, r in sent), [r.error_message for _, r in sent if not r.success][:3]
    stored = pool.broker.stored
    assert sum(len(records) for records in stored.values()) == len(sent)  # nothing stored twice, nothing lost
    check_exactly_once_in_order(pool, [(d, r) for d, r in sent if d.startswith(b"s")])
    for task in range(4):  # each batch task's messages, in its send order
        check_exactly_once_in_order(pool, [(d, r) for d, r in sent if d.startswith(f"b{task}-".encode())])
