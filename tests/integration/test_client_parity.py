"""MetaQ's consumer rules against real ZooKeeper and broker processes: where a new group
starts (the oldest message by default), and message filters (skipped, offsets move on)."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter

import pytest

from metaq.client import AttributeFilter, ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig
from metaq.zk.paths import ZkPaths, parse_offset
from tests.harness import wait_until

from .test_client_basic import Collector
from .test_client_cli import metaq

TOPIC = "parity"
PARTITIONS = ("0-0", "0-1", "1-0", "1-1")


@pytest.fixture
def brokers(broker_factory):
    return [broker_factory(b, {TOPIC: 2}, system={"unflushThreshold": 0}) for b in (0, 1)]


@pytest.fixture
def factory(zk, zk_root):
    with MessageSessionFactory(MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000)) as f:
        yield f


def config(tmp_path, group: str, **overrides) -> ConsumerConfig:
    return ConsumerConfig(group=group, commit_interval_s=0.3, fetch_wait_ms=200, recover_dir=str(tmp_path / "recover"), **overrides)


def produce(factory, messages: list[Message]) -> list:
    producer = factory.create_producer()
    results = []
    for start in range(0, len(messages), 100):
        results += producer.send_batch(messages[start:start + 100])
    assert all(r.success for r in results), [r.error_message for r in results if not r.success]
    return results


def consume_all(factory, consumer_config: ConsumerConfig, expected: int, settle: float = 1.0) -> Collector:
    collector = Collector()
    consumer = factory.create_consumer(consumer_config)
    consumer.subscribe(TOPIC, None, collector)
    consumer.complete_subscribe()
    if expected:
        collector.wait_for(expected, timeout=30)
    else:
        wait_until(lambda: len(consumer.owned_partitions(TOPIC)) == 4 and consumer.stats.commits >= 1, 15, message="partitions taken")
    time.sleep(settle)  # nothing more may come
    consumer.shutdown()
    return collector


def test_new_group_gets_everything_produced_before_it_started(brokers, factory, tmp_path) -> None:
    produce(factory, [Message(TOPIC, f"m{i}".encode()) for i in range(1000)])
    got = consume_all(factory, config(tmp_path, "newcomer"), 1000)
    assert sorted(got.data()) == sorted(f"m{i}".encode() for i in range(1000))

    # consume_from_max_offset: a new group sees only what comes after it joined.
    got = consume_all(factory, config(tmp_path, "latecomer", consume_from_max_offset=True), 0)
    assert got.data() == []

    # always=True ignores the stored offsets of "newcomer" (at the end of the first 1000):
    # messages sent while no member ran are skipped. Without it they are delivered.
    produce(factory, [Message(TOPIC, f"while-away{i}".encode()) for i in range(20)])
    got = consume_all(factory, config(tmp_path, "newcomer").set_consume_from_max_offset(always=True), 0)
    assert got.data() == []
    produce(factory, [Message(TOPIC, f"while-away-again{i}".encode()) for i in range(20)])
    got = consume_all(factory, config(tmp_path, "newcomer", consume_from_max_offset=True), 20)
    assert sorted(got.data()) == sorted(f"while-away-again{i}".encode() for i in range(20))


def test_new_group_starts_at_an_explicit_offset(brokers, factory, tmp_path) -> None:
    results = produce(factory, [Message(TOPIC, f"m{i}".encode()) for i in range(40)])
    # One send_batch: all 40 in one partition. Start at its 5th message; the empty partitions
    # start at their end (an offset past the newest is moved back to it).
    assert len({str(r.partition) for r in results}) == 1
    got = consume_all(factory, config(tmp_path, "from-offset", offset=results[4].offset), 36)
    assert [m.offset for m in got.messages] == [r.offset for r in results[4:]]


def stored_offsets(zk_client, zk_root: str, group: str) -> dict[str, int]:
    paths = ZkPaths(zk_root)
    return {p: parse_offset(zk_client.get(paths.offset(group, TOPIC, p))[0])[1] for p in PARTITIONS}


def test_filters_skip_messages_in_every_delivery_style_and_offsets_move_past_them(brokers, factory, zk_client, zk_root, tmp_path) -> None:
    messages = [Message(TOPIC, f"{kind}{i}".encode(), attribute=kind) for i in range(100) for kind in ("a", "b", "c")]
    messages += [Message(TOPIC, b"plain")]  # no attribute
    results = produce(factory, messages)
    # 400 messages in 100-message batches: the last batch's partition ends with b"plain", so
    # every filter below rejects a partition's last messages: the offsets must still reach the end.
    ends = {}
    for r in results:
        ends[str(r.partition)] = max(ends.get(str(r.partition), 0), r.offset)

    # Per-message listener, with MetaQ's accept(group, message) filter object.
    per_message = Collector()
    consumer = factory.create_consumer(config(tmp_path, "want-a"))
    consumer.subscribe(TOPIC, None, per_message, message_filter=AttributeFilter("a"))
    # Batch listener, with a plain callable that also looks at the group.
    batches: list[list[Message]] = []
    batch_consumer = factory.create_consumer(config(tmp_path, "want-b"))
    batch_consumer.subscribe(TOPIC, batch_listener=batches.append,
                             message_filter=lambda group, m: group == "want-b" and m.attribute == "b")
    # Iterated: the filter applies before the application sees a message.
    iterated = factory.create_consumer(config(tmp_path, "want-c", iterator_timeout_s=3.0))
    iterated.subscribe(TOPIC, message_filter=AttributeFilter("c"))
    try:
        consumer.complete_subscribe()
        batch_consumer.complete_subscribe()
        got_c = [m.data for m in iterated]  # ends 3 s after the last message
        per_message.wait_for(100)
        wait_until(lambda: sum(map(len, batches)) >= 100, 15, message="100 b messages")
        time.sleep(0.5)
        assert sorted(per_message.data()) == sorted(f"a{i}".encode() for i in range(100))
        assert sorted(m.data for batch in batches for m in batch) == sorted(f"b{i}".encode() for i in range(100))
        assert sorted(got_c) == sorted(f"c{i}".encode() for i in range(100))
        assert consumer.stats.filtered == 201 and batch_consumer.stats.filtered == 201 and iterated.stats.filtered == 201
    finally:
        for c in (consumer, batch_consumer, iterated):
            c.shutdown()
    for group in ("want-a", "want-b", "want-c"):
        stored = stored_offsets(zk_client, zk_root, group)
        for name, last in ends.items():
            assert stored[name] > last, (group, name, stored[name], last)


def test_cli_consume_new_group_reads_all_and_keeps_offsets_in_sql(brokers, zk, zk_root, tmp_path) -> None:
    zk_args = ["--zk", zk.connect_string, "--zk-root", zk_root, "--topic", TOPIC]
    done = metaq("produce", *zk_args, "--count", "1000", "--size", "16", "--sync")
    assert done.returncode == 0 and "sent 1000 of 1000" in done.stdout.decode(), done.stderr
    done = metaq("produce", *zk_args, "--attribute", "urgent", stdin=b"u1\nu2\n")
    assert done.returncode == 0, done.stderr
    url = f"sqlite:///{tmp_path / 'offsets.db'}"
    consume = ["consume", *zk_args, "--group", "sql-cli", "--offset-url", url, "--recover-dir", str(tmp_path / "r"), "--idle-timeout", "4"]
    done = metaq(*consume)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.decode().splitlines()) == 1002
    with sqlite3.connect(tmp_path / "offsets.db") as db:
        assert db.execute("select count(*) from meta_topic_partition_group_offset where group_id='sql-cli'").fetchone()[0] == 4
    done = metaq(*consume)  # the offsets come from the database: nothing again
    assert done.returncode == 0 and done.stdout == b"", done.stderr
    # A filtered new group: only the urgent ones.
    done = metaq("consume", *zk_args, "--group", "urgent-only", "--attribute", "urgent", "--idle-timeout", "4", "--recover-dir", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.decode().splitlines()) == ["u1", "u2"]
