"""The idempotent producer's numbering (metaq/client/idempotence.py) and its retries (producer.py).

Against the fake cluster and connections of test_client_producer, plus a fake
``init_producer``: what matters here is which numbers each put carries.
"""

from __future__ import annotations

import asyncio
from typing import Any

from metaq.client.connection import ConnectionClosed, Reply
from metaq.client.idempotence import Sequencer
from metaq.client.message import Message
from tests.unit.test_client_producer import FakeConnection, FakePool, producer


class NumberedConnection(FakeConnection):
    """Also answers ``init_producer`` (ids 7, 8, ...) and records the numbers of every put."""

    ids = iter(range(7, 1000))

    def __init__(self, port: int, script: list[Any], log: list[tuple[int, int]]) -> None:
        super().__init__(port, script, log)
        self.puts: list[tuple[int, int, int]] = []  # (partition, producer id, sequence)

    async def request(self, header: dict, body: bytes = b"", timeout: float | None = None) -> Reply:
        assert header["op"] == "init_producer"
        return Reply({"code": 200, "producer_id": next(self.ids), "epoch": 0}, bytearray())

    def send(self, header: dict, body: bytes) -> "asyncio.Future[Reply]":
        self.puts.append((header["partition"], header["producer_id"], header["sequence"]))
        return super().send(header, body)


def numbered_pool(script: list[Any]) -> FakePool:
    pool = FakePool({})
    pool.conns[9000] = NumberedConnection(9000, script, pool.log)
    return pool


def one_partition_producer(pool: FakePool, **config: Any):  # type: ignore[no-untyped-def]
    from tests.unit.test_client_producer import FakeCluster

    return producer(pool, FakeCluster(brokers=1, parts=1), idempotence=True, **config)


def test_sequences_count_messages_per_partition_and_resume_after_a_give_back() -> None:
    seq = Sequencer()
    assert seq.try_begin("p", 3) is None  # no producer id yet
    seq.set_id(42, 0)
    first = seq.try_begin("p", 3)
    assert first is not None and (first.producer_id, first.sequence) == (42, 0)
    assert seq.try_begin("p", 1) is None  # try_begin (the direct path) takes only an empty lane
    other = seq.try_begin("q", 2)
    assert other is not None and other.sequence == 0
    seq.end(first, stored=True)
    second = seq.try_begin("p", 2)
    assert second is not None and second.sequence == 3
    seq.end(second, stored=False)  # surely not stored: its numbers are used again
    third = seq.try_begin("p", 5)
    assert third is not None and third.sequence == 3
    seq.end(third, stored=None)  # unknown: the next batch numbers from 0 under a new id
    assert not seq.has_id and seq.try_begin("p", 1) is None
    seq.set_id(43, 0)
    fresh = seq.try_begin("p", 1)
    assert fresh is not None and (fresh.producer_id, fresh.sequence) == (43, 0)
    seq.end(other, stored=True)  # numbered under the old id: changes nothing now
    assert seq.try_begin("q", 1).sequence == 0  # type: ignore[union-attr]


def test_an_unknown_outcome_is_resent_with_the_same_numbers_to_the_same_partition() -> None:
    pool = numbered_pool([ConnectionClosed("connection lost"), 200, 200])
    p = one_partition_producer(pool)

    async def scenario():
        first = await p.send_message(Message("t", b"a"))
        second = await p.send_batch([Message("t", b"b"), Message("t", b"c")])
        return first, second

    first, second = asyncio.run(scenario())
    assert first.success and first.attempts == 2 and all(r.success for r in second)
    puts = pool.conns[9000].puts  # type: ignore[attr-defined]
    (pid,) = {producer_id for _, producer_id, _ in puts}
    assert puts == [(0, pid, 0), (0, pid, 0), (0, pid, 1)]


def test_a_batch_that_gave_up_unknown_makes_the_next_one_number_under_a_new_id() -> None:
    pool = numbered_pool([ConnectionClosed("lost")])
    p = one_partition_producer(pool, retry_unknown_outcome=False)

    async def scenario():
        return await p.send_message(Message("t", b"a")), await p.send_message(Message("t", b"b"))

    lost, sent = asyncio.run(scenario())
    assert not lost.success and lost.outcome_unknown and sent.success
    (first_id, first_seq), (second_id, second_seq) = [(pid, s) for _, pid, s in pool.conns[9000].puts]  # type: ignore[attr-defined]
    assert first_seq == second_seq == 0 and first_id != second_id


def test_out_of_order_renumbers_and_a_definite_refusal_gives_its_numbers_back() -> None:
    pool = numbered_pool([400, 200])
    p = one_partition_producer(pool)

    async def scenario():
        return await p.send_message(Message("t", b"a")), await p.send_message(Message("t", b"b"))

    refused, sent = asyncio.run(scenario())
    assert not refused.success and not refused.outcome_unknown and sent.success
    puts = pool.conns[9000].puts  # type: ignore[attr-defined]
    assert [s for _, _, s in puts] == [0, 0] and puts[0][1] == puts[1][1]


def test_the_producer_token_travels_with_every_numbered_put_and_only_when_given() -> None:
    secured = Sequencer()
    secured.set_id(7, 2, "a" * 32)
    numbered = secured.try_begin(("t", 0, 0), 1)
    assert numbered is not None
    assert numbered.put_fields() == {"producer_id": 7, "producer_epoch": 2, "sequence": 0, "producer_token": "a" * 32}
    open_ = Sequencer()  # security off: init_producer answers no token
    open_.set_id(8, 0)
    numbered = open_.try_begin(("t", 0, 0), 1)
    assert numbered is not None and "producer_token" not in numbered.put_fields()
