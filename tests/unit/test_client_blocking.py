"""The blocking producer's direct path: first attempt on the caller's thread, the loop only on failure."""

from __future__ import annotations

import time
from typing import Any

from metaq.client.blocking import LoopThread, MessageProducer
from metaq.client.connection import Credentials
from metaq.client.direct import NoReply, NotSent
from metaq.client.message import Message
from metaq.client.producer import AsyncMessageProducer
from tests.unit.test_client_producer import CONFIG, FakeCluster, FakePool


class ScriptedDirect:
    """Stands in for the per-thread connections: answers from a script, logs each put."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.puts: list[dict] = []

    def get(self, host: str, port: int) -> "ScriptedDirect":
        return self

    def request(self, header: dict, body: bytes) -> dict:
        self.puts.append(header)
        outcome = self.script.pop(0) if self.script else 200
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome == 200:
            return {"code": 200, "partition": header["partition"], "offset": 0, "msg_id": 7}
        return {"code": outcome, "msg": "scripted"}

    def close_all(self) -> None:
        pass


def blocking_producer(script: list[Any], cluster: FakeCluster | None = None,
                      **config: Any) -> tuple[MessageProducer, ScriptedDirect, FakePool, LoopThread]:
    pool = FakePool({0: [], 1: []})
    pool.resolve = lambda host, port: (host, port)  # type: ignore[attr-defined]
    aio = AsyncMessageProducer(cluster or FakeCluster(), pool, type(CONFIG)(**{**CONFIG.__dict__, **config}))  # type: ignore[arg-type]
    runner = LoopThread()
    producer = MessageProducer(runner, aio)
    direct = producer._direct = ScriptedDirect(script)  # type: ignore[assignment]
    return producer, direct, pool, runner


def test_a_stored_message_costs_one_direct_put_and_no_loop_put() -> None:
    producer, direct, pool, runner = blocking_producer([])
    try:
        result = producer.send_message(Message("t", b"x"))
        batch = producer.send_batch([Message("t", b"y") for _ in range(3)])
    finally:
        runner.stop()
    assert result.success and result.attempts == 1 and all(batch)
    assert len(direct.puts) == 2 and direct.puts[1]["count"] == 3 and pool.log == []


def test_plain_put_headers_are_built_once_and_stay_per_partition_and_count() -> None:
    producer, direct, pool, runner = blocking_producer([], FakeCluster(brokers=1, parts=2))
    try:
        for _ in range(4):
            producer.send_message(Message("t", b"x"))
        producer.send_batch([Message("t", b"y") for _ in range(3)])
    finally:
        runner.stop()
    assert [(p["topic"], p["count"]) for p in direct.puts] == [("t", 1)] * 4 + [("t", 3)]
    assert all(set(p) == {"op", "topic", "partition", "count"} and p["op"] == "put" for p in direct.puts)
    assert {p["partition"] for p in direct.puts[:4]} == {0, 1}  # one cached header per partition, not one for all
    assert len(producer._put_headers) == len({(p["topic"], p["partition"], p["count"]) for p in direct.puts})


def test_failed_first_attempts_continue_in_the_loop_with_their_class() -> None:
    producer, direct, pool, runner = blocking_producer([NotSent("refused"), 503, 400, NoReply("lost")], retry_unknown_outcome=False)
    try:
        refused = producer.send_message(Message("t", b"x"))  # retriable: the loop retries, elsewhere
        busy = producer.send_message(Message("t", b"x"))  # 503: retriable too
        bad = producer.send_message(Message("t", b"x"))  # 400: final at once
        lost = producer.send_message(Message("t", b"x"))  # sent, no reply: unknown, not resent (at most once)
    finally:
        runner.stop()
    assert refused.success and refused.attempts == 2 and busy.success and busy.attempts == 2
    assert not bad.success and bad.code == 400 and bad.attempts == 1 and not bad.outcome_unknown
    assert not lost.success and lost.outcome_unknown and lost.attempts == 1
    assert len(pool.log) == 2  # the two retries went through the loop's connections


def test_send_message_queues_behind_pending_send_message_async() -> None:
    producer, direct, pool, runner = blocking_producer([], FakeCluster(brokers=1, parts=1))
    try:
        runner.call_soon(time.sleep, 0.3)  # hold the loop thread: the async sends stay queued
        futures = [producer.send_message_async(Message("t", f"{i}".encode())) for i in range(5)]
        last = producer.send_message(Message("t", b"last"))
        producer.flush()
    finally:
        runner.stop()
    assert all(f.result(timeout=5).success for f in futures) and last.success
    # Not put directly ahead of them: it went through the loop, after them in the partition.
    assert direct.puts == [] and last.offset > max(f.result().offset for f in futures)


def test_with_credentials_every_send_takes_the_pooled_path() -> None:
    """The direct path's plain per-thread socket cannot log in or speak TLS: it is skipped."""
    producer, direct, pool, runner = blocking_producer([], credentials=Credentials(user="app", password="pw"))
    try:
        result = producer.send_message(Message("t", b"x"))
    finally:
        runner.stop()
    assert result.success and direct.puts == [] and len(pool.log) == 1
