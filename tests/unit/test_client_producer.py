"""Retry classification and bounded retries, against a fake cluster and fake broker replies."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from metaq.client.cluster import ClusterSnapshot
from metaq.client.config import MetaClientConfig
from metaq.client.connection import ConnectionClosed, Reply
from metaq.client.message import Message, Partition
from metaq.client.producer import (
    PROBE_INTERVAL_S,
    SUSPECT_SECONDS,
    AsyncMessageProducer,
    StoredResults,
    classify_reply,
    stored_results,
)
from metaq.client.routing import BrokerAddresses
from metaq.client.selector import KeyHashPartitionSelector
from metaq.protocol import commands as c


def test_classification_of_result_codes() -> None:
    assert classify_reply(200, "") is None
    for code in (403, 503):
        failure = classify_reply(code, "x")
        assert failure.retriable and not failure.outcome_unknown
    failure = classify_reply(504, "x")
    assert failure.outcome_unknown and not failure.retriable
    assert classify_reply(504, "x", retry_unknown_outcome=True).retriable
    for code in (400, 404, 500):
        failure = classify_reply(code, "x")
        assert not failure.retriable and not failure.outcome_unknown


class FakeCluster:
    def __init__(self, brokers: int = 2, parts: int = 2) -> None:
        partitions = tuple(Partition(b, n) for b in range(brokers) for n in range(parts))
        self.snapshot = ClusterSnapshot(
            {b: BrokerAddresses(b, f"meta://127.0.0.1:{9000 + b}") for b in range(brokers)}, {"t": partitions}, {}
        )

    async def watch_topic(self, topic: str, **_: Any) -> None:
        pass

    def request_refresh(self) -> None:
        pass

    def add_departure_listener(self, listener: Any) -> None:
        pass

    def remove_departure_listener(self, listener: Any) -> None:
        pass


class FakeConnection:
    """Answers puts from a script: an int code, or an exception to raise while waiting."""

    is_open = True

    def __init__(self, port: int, script: list[Any], log: list[tuple[int, int]]) -> None:
        self.port, self.script, self.log = port, script, log
        self.offsets: dict[int, int] = {}

    def send(self, header: dict, body: bytes) -> "asyncio.Future[Reply]":
        self.log.append((self.port, header["partition"]))
        future = asyncio.get_running_loop().create_future()
        outcome = self.script.pop(0) if self.script else 200
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        elif outcome == 200:
            future.set_result(Reply({"code": 200, "partition": header["partition"], "offset": self.offsets.get(header["partition"], 0), "msg_id": 100, "count": header["count"]}, bytearray()))
            self.offsets[header["partition"]] = self.offsets.get(header["partition"], 0) + len(body)
        else:
            future.set_result(Reply({"code": outcome, "msg": c.CODE_NAMES[outcome]}, bytearray()))
        return future

    async def diagnose(self, exc: Exception, timeout: float = 5.0) -> Exception:
        return exc  # a lost connection is a lost connection here (no TLS port to tell apart)


class FakePool:
    def __init__(self, scripts: dict[int, list[Any]], refuse: set[int] = frozenset()) -> None:
        self.log: list[tuple[int, int]] = []
        self.refuse = refuse
        self.conns = {9000 + b: FakeConnection(9000 + b, s, self.log) for b, s in scripts.items()}

    async def get(self, host: str, port: int) -> FakeConnection:
        if port in self.refuse:
            raise ConnectionClosed(f"cannot connect to {host}:{port}: refused")
        return self.conns.setdefault(port, FakeConnection(port, [], self.log))


# The plain (non-idempotent) producer: these tests pin its retry rules; test_client_idempotence the other.
CONFIG = MetaClientConfig(send_retry_min_wait_s=0.001, send_retry_max_wait_s=0.002, send_timeout_s=2, idempotence=False)


def producer(pool: FakePool, cluster: FakeCluster | None = None, **config: Any) -> AsyncMessageProducer:
    cfg = MetaClientConfig(**{**CONFIG.__dict__, **config})
    return AsyncMessageProducer(cluster or FakeCluster(), pool, cfg)  # type: ignore[arg-type]


def test_retriable_code_is_retried_on_another_partition() -> None:
    pool = FakePool({0: [503], 1: []})
    result = asyncio.run(producer(pool).send_message(Message("t", b"x")))
    assert result.success and result.attempts == 2
    assert pool.log[0] == (9000, 0) and pool.log[1] != pool.log[0]


def test_definite_failure_is_not_retried() -> None:
    pool = FakePool({0: [400]})
    result = asyncio.run(producer(pool).send_message(Message("t", b"x")))
    assert not result.success and not result.outcome_unknown and result.attempts == 1
    assert result.code == 400 and "Bad Request" in result.error_message


def test_lost_connection_after_sending_is_an_unknown_outcome() -> None:
    # At-most-once (opted in): the result says the outcome is unknown, nothing is resent.
    pool = FakePool({0: [ConnectionClosed("connection lost")]})
    result = asyncio.run(producer(pool, retry_unknown_outcome=False).send_message(Message("t", b"x")))
    assert not result.success and result.outcome_unknown and result.attempts == 1
    assert "outcome unknown" in result.error_message
    # The default, at-least-once, resends it (a failover is a pause, not an error).
    pool = FakePool({0: [ConnectionClosed("connection lost")]})
    assert asyncio.run(producer(pool).send_message(Message("t", b"x"))).success


def test_unreachable_broker_is_skipped_for_the_next_sends() -> None:
    pool = FakePool({0: [], 1: []}, refuse={9000})
    p = producer(pool)

    async def scenario():
        return [await p.send_message(Message("t", b"x")) for _ in range(6)]

    results = asyncio.run(scenario())
    assert all(r.success for r in results)
    assert {r.partition.broker_id for r in results} == {1}


def test_a_skipped_broker_is_used_again_once_a_probe_reaches_it() -> None:
    pool = FakePool({0: [], 1: []}, refuse={9000})
    p = producer(pool)

    async def scenario():
        before = [await p.send_message(Message("t", b"x")) for _ in range(4)]
        pool.refuse = set()  # broker 0 is back
        await p.send_message(Message("t", b"x"))  # a send while it is skipped starts the probe
        await asyncio.sleep(PROBE_INTERVAL_S * 3)
        after = [await p.send_message(Message("t", b"x")) for _ in range(4)]
        return before, after

    before, after = asyncio.run(scenario())
    assert {r.partition.broker_id for r in before} == {1}
    # Well before SUSPECT_SECONDS: round robin covers both brokers again.
    assert PROBE_INTERVAL_S * 3 < SUSPECT_SECONDS
    assert all(r.success for r in after) and {r.partition.broker_id for r in after} == {0, 1}


def test_retries_are_bounded_and_end_in_a_clear_error() -> None:
    pool = FakePool({0: [503] * 100, 1: [503] * 100})
    result = asyncio.run(producer(pool, send_max_attempts=4).send_message(Message("t", b"x")))
    assert not result.success and result.attempts == 4 and not result.outcome_unknown
    assert "503" in result.error_message and "after 4 attempts" in result.error_message


def test_no_partition_fails_after_the_send_timeout() -> None:
    cluster = FakeCluster()
    cluster.snapshot = ClusterSnapshot({}, {"t": ()}, {})
    result = asyncio.run(producer(FakePool({}), cluster, send_timeout_s=0.2, send_max_attempts=1000).send_message(Message("t", b"x")))
    assert not result.success and "no available partition" in result.error_message


def test_batch_results_carry_each_message_offset_and_id() -> None:
    pool = FakePool({0: [], 1: []})
    p = producer(pool)
    results = asyncio.run(p.send_batch([Message("t", b"a" * 10, attribute="k" if i % 2 else None) for i in range(4)]))
    assert all(r.success for r in results)
    assert {r.partition for r in results} == {Partition(0, 0)}  # round robin: one put per batch
    # 20-byte header + 10 bytes; with an attribute 4 + 1 more.
    assert [r.offset for r in results] == [0, 30, 65, 95] and [r.msg_id for r in results] == [100, 101, 102, 103]
    assert len(pool.log) == 1


def test_key_selector_groups_a_batch_by_partition() -> None:
    pool = FakePool({0: [], 1: []})
    p = AsyncMessageProducer(FakeCluster(), pool, CONFIG, KeyHashPartitionSelector())  # type: ignore[arg-type]
    messages = [Message("t", b"x", attribute=f"key{i % 3}") for i in range(9)]
    results = asyncio.run(p.send_batch(messages))
    for key in ("key0", "key1", "key2"):
        assert len({r.partition for m, r in zip(messages, results) if m.attribute == key}) == 1
    assert len(pool.log) == len({r.partition for r in results})  # one put per partition


def test_a_broken_selector_fails_the_message_not_the_batch() -> None:
    class Broken:
        def select(self, topic, partitions, message):
            raise RuntimeError("boom")

    p = AsyncMessageProducer(FakeCluster(), FakePool({}), CONFIG, Broken())  # type: ignore[arg-type]
    (result,) = asyncio.run(p.send_batch([Message("t", b"x")]))
    assert not result.success and "boom" in result.error_message


def test_message_refuses_str_data_and_copies_other_bytes_likes() -> None:
    with pytest.raises(TypeError, match="bytes, not str"):
        Message("t", "text")  # type: ignore[arg-type]
    assert Message("t", bytearray(b"ab")).data == b"ab" and type(Message("t", memoryview(b"ab")).data) is bytes


def test_sends_without_a_master_wait_in_order_and_later_sends_queue_behind_them() -> None:
    cluster = FakeCluster()
    full = cluster.snapshot
    cluster.snapshot = ClusterSnapshot(full.brokers, {"t": ()}, {})  # the topic's master is gone
    pool = FakePool({0: [], 1: []})
    p = AsyncMessageProducer(cluster, pool, CONFIG, KeyHashPartitionSelector())  # type: ignore[arg-type]

    async def run() -> list:
        first = [p.send_message_async(Message("t", f"{i}".encode(), attribute="k")) for i in range(5)]
        await asyncio.sleep(0.01)
        assert not any(f.done() for f in first) and "t" in p._parked
        cluster.snapshot = full  # the master is back: the parked sends go first, in order
        later = [p.send_message_async(Message("t", f"{i}".encode(), attribute="k")) for i in range(5, 8)]
        return [await f for f in first + later]

    results = asyncio.run(run())
    assert all(r.success for r in results) and len({r.partition for r in results}) == 1
    assert [r.offset for r in results] == sorted(r.offset for r in results)  # stored in send order
    assert not p._parked and p.accumulator.buffered == 0


def test_a_producer_idle_between_two_event_loops_sends_on_the_second() -> None:
    # The producer keeps the running loop while messages are buffered (asking asyncio costs
    # a system call per send); once everything is answered it asks again.
    p = producer(FakePool({0: [], 1: []}))

    async def send_on_this_loop() -> bool:
        future = p.send_message_async(Message("t", b"x"))
        result = await future
        return result.success and future.get_loop() is asyncio.get_running_loop()

    assert asyncio.run(send_on_this_loop()) and asyncio.run(send_on_this_loop())


def test_stored_results_built_as_read_are_the_same_results() -> None:
    header = {"partition": 1, "offset": 1000, "msg_id": 7}
    starts = [0, 30, 65]
    lazy = StoredResults("t", Partition(0, 1), header, starts, 2)
    eager = stored_results("t", Partition(0, 1), header, starts, 2)
    assert list(lazy) == eager and len(lazy) == 3
    assert [r.offset for r in eager] == [1000, 1030, 1065] and [r.msg_id for r in eager] == [7, 8, 9]
    assert lazy[1] == eager[1] and lazy[-1] == eager[2] and lazy[1:] == eager[1:]
    with pytest.raises(IndexError):
        lazy[3]
    # Stored in another partition than asked (the broker's reply says which), or long ago.
    moved = StoredResults("t", Partition(0, 1), {**header, "partition": 0}, starts, 1)
    assert {r.partition for r in moved} == {Partition(0, 0)}
    assert [r.offset for r in StoredResults("t", Partition(0, 1), {**header, "offset": -1}, starts, 1)] == [-1] * 3
