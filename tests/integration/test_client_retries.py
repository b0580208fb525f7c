"""Durable retries against real ZooKeeper and broker processes: the group's retry topic,
its delays, the dead-letter topic, and ``metaq groups dlq`` (list, replay, purge)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from metaq.client import ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig
from metaq.client.retry_topics import failure_info, failure_topic_names
from metaq.zk.paths import ZkPaths
from metaq.zk.topic_config import read_group_topics
from tests.harness import REPO_ROOT, wait_until

SYSTEM = {"unflushThreshold": 0}
TOPIC = "orders"
GROUP = "billing"
RETRY, DLQ = failure_topic_names(GROUP)


@pytest.fixture
def factory(zk, zk_root):
    with MessageSessionFactory(MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000)) as f:
        yield f


def retry_config(tmp_path, **overrides: Any) -> ConsumerConfig:
    settings: dict[str, Any] = dict(group=GROUP, commit_interval_s=0.3, fetch_wait_ms=200, recover_dir=str(tmp_path / "recover"))
    settings.update(overrides)
    return ConsumerConfig(**settings)


class FlakyListener:
    """Fails the first ``failures`` deliveries of the message b"poison" (all: None); records every call's time."""

    def __init__(self, failures: int | None) -> None:
        self.failures = failures
        self.calls: list[tuple[float, Message]] = []
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.calls.append((time.time(), message))
            if message.data != b"poison":
                return
            tries = sum(1 for _, m in self.calls if m.data == b"poison")
        if self.failures is None or tries <= self.failures:
            raise ValueError(f"cannot bill {message.offset} (try {tries})")

    def poison_calls(self) -> list[tuple[float, Message]]:
        with self.lock:
            return [(t, m) for t, m in self.calls if m.data == b"poison"]

    def others(self) -> list[bytes]:
        with self.lock:
            return [m.data for _, m in self.calls if m.data != b"poison"]


def metaq_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "metaq", *args], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=env)


def test_a_listener_failing_n_times_gets_the_message_n_plus_one_times_spaced_by_the_delays(broker_factory, factory, zk_client, zk_root, tmp_path) -> None:
    broker_factory(0, {TOPIC: 2}, system=SYSTEM)
    delays = (0.6, 1.2, 1.8)
    listener = FlakyListener(failures=3)
    consumer = factory.create_consumer(retry_config(tmp_path, retry_delays_s=delays, max_reconsume_times=5))
    consumer.subscribe(TOPIC, listener=listener)
    consumer.complete_subscribe()
    producer = factory.create_producer()
    sent = producer.send_message(Message(TOPIC, b"poison", attribute="eu"))
    assert sent.success
    others = [Message(TOPIC, f"ok{i}".encode()) for i in range(20)]
    producer.send_batch(others)
    started = time.time()
    wait_until(lambda: len(listener.poison_calls()) >= 4, 30, message="the poison message delivered 4 times")
    # Other messages (the same partition's after the poison too) were never held back by its retries.
    wait_until(lambda: len(listener.others()) == 20, 10, message="the other messages")
    first_retry_at = listener.poison_calls()[1][0]
    assert all(t < first_retry_at for t, m in listener.calls if m.data != b"poison"), "the others came before the first retry"
    time.sleep(max(delays) + 1.0)  # no fifth delivery: the fourth succeeded
    calls = listener.poison_calls()
    assert len(calls) == 4, [round(t - started, 2) for t, _ in calls]
    for (before, _), (after, _), delay in zip(calls, calls[1:], delays):
        # Due at the retry record's append time plus the delay: never early (10 ms of clock
        # granularity), and late only by a fetch's round and the listener's own time.
        assert delay - 0.05 <= after - before <= delay + 1.5, (delay, after - before)
    # Every delivery is the original message: topic, partition, offset, msg id, attribute, data.
    assert {(m.topic, m.partition, m.offset, m.id, m.attribute, m.data) for _, m in calls} == {
        (TOPIC, sent.partition, sent.offset, sent.msg_id, "eu", b"poison")}
    stats = consumer.stats
    assert (stats.retried, stats.dead_lettered, stats.listener_failures) == (3, 0, 3)
    # The topics were created in the broker group's topic configuration: a partition per delay level.
    topics = read_group_topics(zk_client, ZkPaths(zk_root), 0).topics
    assert topics[RETRY]["numPartitions"] == str(len(delays)) and topics[DLQ]["numPartitions"] == "1"
    # Delivery k's retry went to partition k-1 of the retry topic; the group committed them like any topic.
    consumer.shutdown()
    offsets = ZkPaths(zk_root)
    committed = {p: zk_client.get(offsets.offset(GROUP, RETRY, p))[0].decode() for p in ("0-0", "0-1", "0-2")}
    assert all(int(value.split("-")[-1]) > 0 for value in committed.values()), committed


def test_always_failing_lands_in_the_dead_letter_topic_and_groups_dlq_lists_replays_and_purges(broker_factory, factory, zk, zk_root, tmp_path) -> None:
    broker_factory(0, {TOPIC: 1}, system=SYSTEM)
    listener = FlakyListener(failures=None)
    consumer = factory.create_consumer(retry_config(tmp_path, retry_delays_s=(0.2,), max_reconsume_times=2))
    consumer.subscribe(TOPIC, listener=listener)
    consumer.complete_subscribe()
    producer = factory.create_producer()
    sent = producer.send_message(Message(TOPIC, b"poison", attribute="eu"))
    wait_until(lambda: consumer.stats.dead_lettered == 1, 30, message="the poison message dead-lettered")
    assert len(listener.poison_calls()) == 3  # the first delivery and max_reconsume_times retries
    assert consumer.stats.retried == 2
    # The dead letter, read as any topic: the original's data, and where it came from in its attribute.
    with MessageSessionFactory(MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root)) as reader_factory:
        reader = reader_factory.create_consumer(ConsumerConfig(group="dlq-reader", iterator_timeout_s=5, fetch_wait_ms=200))
        reader.subscribe(DLQ)
        letters = list(reader)
        reader.shutdown()
    assert [m.data for m in letters] == [b"poison"]
    info = failure_info(letters[0])
    assert info is not None
    assert (info.topic, info.partition, info.offset, info.msg_id, info.attribute, info.attempts) == (
        TOPIC, sent.partition, sent.offset, sent.msg_id, "eu", 3)
    assert info.error == f"ValueError: cannot bill {sent.offset} (try 3)"

    zk_args = ["--zk", zk.connect_string, "--zk-root", zk_root]
    listed = metaq_cli("groups", "dlq", *zk_args, "--group", GROUP)
    assert listed.returncode == 0, listed.stderr
    assert "1 dead letter(s)" in listed.stdout and f"ValueError: cannot bill {sent.offset} (try 3)" in listed.stdout, listed.stdout
    as_json = json.loads(metaq_cli("groups", "dlq", *zk_args, "--group", GROUP, "--json").stdout)
    assert as_json["count"] == 1 and as_json["by_error"] == {f"ValueError: cannot bill {sent.offset} (try 3)": 1}
    assert as_json["by_topic"] == {TOPIC: 1} and as_json["oldest"] is not None

    # Replay: back to the original topic (the original attribute too); the listener now takes it.
    listener.failures = 3
    replayed = metaq_cli("groups", "dlq", *zk_args, "--group", GROUP, "--replay")
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 1 dead letter(s)" in replayed.stdout, replayed.stdout
    wait_until(lambda: len(listener.poison_calls()) == 4, 15, message="the replayed message delivered")
    replayed_message = listener.poison_calls()[-1][1]
    assert (replayed_message.topic, replayed_message.attribute, replayed_message.data) == (TOPIC, "eu", b"poison")
    assert replayed_message.offset != sent.offset  # a new message of the topic
    after = json.loads(metaq_cli("groups", "dlq", *zk_args, "--group", GROUP, "--json").stdout)
    assert after["count"] == 0

    # A second dead letter, purged: listed no more, nothing replayed.
    listener.failures = None
    producer.send_message(Message(TOPIC, b"poison"))
    wait_until(lambda: consumer.stats.dead_lettered == 2, 30, message="the second dead letter")
    assert json.loads(metaq_cli("groups", "dlq", *zk_args, "--group", GROUP, "--json").stdout)["count"] == 1
    purged = metaq_cli("groups", "dlq", *zk_args, "--group", GROUP, "--purge")
    assert purged.returncode == 0 and "purged 1 dead letter(s)" in purged.stdout, purged.stdout + purged.stderr
    assert json.loads(metaq_cli("groups", "dlq", *zk_args, "--group", GROUP, "--json").stdout)["count"] == 0
    consumer.shutdown()


def test_groups_dlq_refuses_bad_use_in_one_line(broker_factory, zk, zk_root) -> None:
    zk_args = ["--zk", zk.connect_string, "--zk-root", zk_root]
    both = metaq_cli("groups", "dlq", *zk_args, "--group", GROUP, "--replay", "--purge")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    none = metaq_cli("groups", "dlq", *zk_args, "--group", "nobody")
    assert none.returncode == 1 and none.stderr.strip().count("\n") == 0 and "no dead-letter topic" in none.stderr, none.stderr
