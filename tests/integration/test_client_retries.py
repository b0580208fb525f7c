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

from metaq.client import ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig, Partition
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
    # The listener can tell which delivery it is on (RocketMQ's reconsumeTimes + 1), and the last error.
    assert [m.delivery_attempt for _, m in calls] == [1, 2, 3, 4]
    assert failure_info(calls[0][1]) is None
    assert [(failure_info(m).attempts, failure_info(m).error) for _, m in calls[1:]] == [  # type: ignore[union-attr]
        (k, f"ValueError: cannot bill {sent.offset} (try {k})") for k in (1, 2, 3)]
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
    from metaq.tools.launcher import free_port

    from .test_metrics import scrape, value

    metrics_port = free_port("127.0.0.1")
    broker_factory(0, {TOPIC: 1}, system={**SYSTEM, "metricsPort": metrics_port})
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
    # What the dashboard's panel shows: the brokers count the retries and dead letters as puts to those topics.
    scraped = scrape(metrics_port)
    assert value(scraped, f'metaq_put_messages_total{{topic="{RETRY}"}}') == 2
    assert value(scraped, f'metaq_put_messages_total{{topic="{DLQ}"}}') == 1

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

    # A third, replayed with the idempotent producer.
    producer.send_message(Message(TOPIC, b"poison", attribute="us"))
    wait_until(lambda: consumer.stats.dead_lettered == 3, 30, message="the third dead letter")
    listener.failures = len(listener.poison_calls())  # from now on the listener takes it
    idempotent = metaq_cli("groups", "dlq", *zk_args, "--group", GROUP, "--replay", "--idempotent")
    assert idempotent.returncode == 0 and "replayed 1 dead letter(s)" in idempotent.stdout, idempotent.stdout + idempotent.stderr
    wait_until(lambda: listener.poison_calls()[-1][1].attribute == "us" and listener.failures < len(listener.poison_calls()), 15,
               message="the third replayed")
    assert json.loads(metaq_cli("groups", "dlq", *zk_args, "--group", GROUP, "--json").stdout)["count"] == 0
    consumer.shutdown()


def test_groups_dlq_refuses_bad_use_in_one_line(broker_factory, zk, zk_root) -> None:
    zk_args = ["--zk", zk.connect_string, "--zk-root", zk_root]
    both = metaq_cli("groups", "dlq", *zk_args, "--group", GROUP, "--replay", "--purge")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    idempotent = metaq_cli("groups", "dlq", *zk_args, "--group", GROUP, "--idempotent")
    assert idempotent.returncode == 2 and "--idempotent applies to --replay only" in idempotent.stderr, idempotent.stderr
    none = metaq_cli("groups", "dlq", *zk_args, "--group", "nobody")
    assert none.returncode == 1 and none.stderr.strip().count("\n") == 0 and "no dead-letter topic" in none.stderr, none.stderr


def test_a_member_killed_mid_retry_loses_nothing_another_member_retries_when_due(broker_factory, factory, zk, zk_root, zk_client, tmp_path) -> None:
    from metaq.zk.paths import parse_offset

    broker_factory(0, {TOPIC: 1}, system=SYSTEM)
    delay = 6.0
    out = tmp_path / "member.out"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    member = subprocess.Popen([sys.executable, "-m", "tests.integration.retry_consumer_main", zk.connect_string, zk_root, TOPIC, GROUP,
                               str(delay)], stdout=open(out, "wb"), stderr=open(tmp_path / "member.err", "wb"), cwd=REPO_ROOT, env=env)
    try:
        producer = factory.create_producer()
        sent = producer.send_message(Message(TOPIC, b"poison"))
        assert sent.success
        wait_until(lambda: "retried\t1" in out.read_text(), 30, message="the member stored its failure in the retry topic")
        failed_at = time.time()
        # The member committed its place past the message (so the next owner does not read it
        # again from the topic): the retry topic is now the only place it is pending in.
        offset_path = ZkPaths(zk_root).offset(GROUP, TOPIC, str(sent.partition))
        wait_until(lambda: zk_client.exists(offset_path) and parse_offset(zk_client.get(offset_path)[0])[1] > sent.offset, 10,
                   message="the member's commit past the message")
        member.kill()  # kill -9, mid-delay
        member.wait()
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()
    assert time.time() - failed_at < delay, "killed before the retry was due"
    listener = FlakyListener(failures=0)
    consumer = factory.create_consumer(retry_config(tmp_path, retry_delays_s=(delay,)))
    consumer.subscribe(TOPIC, listener=listener)
    consumer.complete_subscribe()
    # Another member takes the retry partition once the dead one's ZooKeeper session ends (4 s).
    wait_until(lambda: listener.poison_calls(), 30, message="the retry delivered by the other member")
    time.sleep(1.0)
    calls = listener.poison_calls()
    assert len(calls) == 1, calls  # once: from the retry topic, not again from the topic
    delivered_at, message = calls[0]
    assert delivered_at >= failed_at + delay - 0.5  # not before it was due (failed_at is a little late)
    assert (message.topic, message.partition, message.offset, message.id) == (TOPIC, sent.partition, sent.offset, sent.msg_id)
    consumer.shutdown()


def test_a_retry_is_delivered_through_a_kill_9_failover_of_the_master(broker_factory, zk, zk_client, zk_root, tmp_path) -> None:
    from .failover_support import TOPIC as FO_TOPIC, Group, make_pair, sync_system, wait_leads

    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)
    epoch = group.epoch()
    config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000, request_timeout_s=5)
    with MessageSessionFactory(config) as factory:
        listener = FlakyListener(failures=2)
        consumer = factory.create_consumer(retry_config(tmp_path, retry_delays_s=(4.0, 1.0)))
        consumer.subscribe(FO_TOPIC, listener=listener)
        consumer.complete_subscribe()
        sent = factory.create_producer().send_message(Message(FO_TOPIC, b"poison"))
        assert sent.success
        wait_until(lambda: consumer.stats.retried == 1, 30, message="the first failure in the retry topic (acked by the sync pair)")
        a.kill()  # kill -9 of the master while the retry waits
        killed_at = time.time()
        wait_leads(b, group, epoch)
        # The retry comes from the new master when due, fails once more (stored on the new
        # master), and the third delivery succeeds: within 30 s of the kill.
        wait_until(lambda: len(listener.poison_calls()) == 3, 30, message="three deliveries across the failover")
        assert time.time() - killed_at < 30
        time.sleep(1.5)
        assert len(listener.poison_calls()) == 3 and consumer.stats.retried == 2 and consumer.stats.dead_lettered == 0
        assert {m.offset for _, m in listener.poison_calls()} == {sent.offset}
        consumer.shutdown()


def test_security_on_the_retry_and_dead_letter_topics_need_an_operator_and_acls(broker_factory, zk, zk_root, tmp_path, caplog) -> None:
    """A secured group: the client may not write its topic configuration, so an operator
    creates the topics; a consumer without produce rights on them is told so in one line,
    and its message waits in its partition (nothing lost) until it has them."""
    import logging

    from metaq.client.connection import Credentials
    from metaq.security.credentials import SecurityFile

    from .trust_support import PASSWORDS, SecuredGroup, metaq as metaq_tool

    secured = SecuredGroup(tmp_path / "sec")
    users = SecurityFile.load(secured.users_file)
    # What a group's consumers need: consume the topic and the retry topic, produce both failure topics.
    users.add_user("biller", "biller-password", consume=f"{TOPIC},{RETRY}", produce=f"{RETRY},{DLQ}", iterations=4096)
    # Consume rights only: the failure topics refuse its puts.
    users.add_user("viewer", "viewer-password", consume=f"{TOPIC},{RETRY}", iterations=4096)
    users.save()
    broker_factory(0, {TOPIC: 1}, system={**SYSTEM, **secured.system})
    caplog.set_level(logging.INFO, logger="metaq.client")

    def factory_as(user: str, password: str) -> MessageSessionFactory:
        return MessageSessionFactory(MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000,
                                                      credentials=Credentials(user, password)))

    with factory_as("app", PASSWORDS["app"]) as app:
        sent = app.create_producer().send_message(Message(TOPIC, b"poison"))
        assert sent.success
    with factory_as("biller", "biller-password") as biller:
        listener = FlakyListener(failures=1)
        consumer = biller.create_consumer(retry_config(tmp_path, retry_delays_s=(0.5,)))
        consumer.subscribe(TOPIC, listener=listener)
        consumer.complete_subscribe()
        # ZooKeeper refuses the client's write of the secured group's topic configuration: one clear line.
        wait_until(lambda: any("may not create them" in r.getMessage() for r in caplog.records), 30, message="the refusal logged")
        line = next(r.getMessage() for r in caplog.records if "may not create them" in r.getMessage())
        assert RETRY in line and DLQ in line and "metaq topics create" in line and "\n" not in line
        assert consumer.stats.retried == 0 and consumer.stats.failure_send_errors >= 1
        # The operator creates them (the group's credentials); the retry then goes through.
        password_file = tmp_path / "ops.password"
        password_file.write_text(PASSWORDS["ops"] + "\n")
        for topic, partitions in ((RETRY, "1"), (DLQ, "1")):
            done = metaq_tool("topics", "create", "--zk", zk.connect_string, "--zk-root", zk_root, "--broker-id", "0", "--topic", topic,
                              "--partitions", partitions, "--user", "ops", "--password-file", str(password_file),
                              "--group-secret", str(secured.secret_file))
            assert done.returncode == 0, done.stdout + done.stderr
        wait_until(lambda: len(listener.poison_calls()) == 2, 30, message="the retry delivered once the topics exist")
        assert consumer.stats.retried == 1
        consumer.shutdown()

    caplog.clear()
    with factory_as("app", PASSWORDS["app"]) as app:
        again = app.create_producer().send_message(Message(TOPIC, b"poison"))
    with factory_as("viewer", "viewer-password") as viewer:
        listener = FlakyListener(failures=1)
        consumer = viewer.create_consumer(retry_config(tmp_path, retry_delays_s=(0.5,)))
        consumer.subscribe(TOPIC, listener=listener)
        consumer.complete_subscribe()
        wait_until(lambda: any(f"cannot store it in {RETRY}" in r.getMessage() for r in caplog.records), 30, message="the ACL refusal logged")
        line = next(r.getMessage() for r in caplog.records if f"cannot store it in {RETRY}" in r.getMessage())
        assert "viewer" in line and "produce" in line and f"{TOPIC}-{again.partition}@{again.offset}" in line, line
        # Nothing lost: the partition stays at the message (its offset is not committed past it).
        time.sleep(1.0)
        position = {str(p): consumer.aio.fetchers[(TOPIC, p)].position for p in consumer.owned_partitions(TOPIC)}
        assert position[str(again.partition)].offset == again.offset, position
        assert consumer.stats.retried == 0 and len(listener.poison_calls()) == 1
        consumer.shutdown()


def test_a_failed_batch_is_retried_message_by_message_and_missing_topics_without_auto_create_are_named(broker_factory, factory, tmp_path, caplog) -> None:
    import logging

    broker_factory(0, {TOPIC: 1}, system=SYSTEM)
    caplog.set_level(logging.INFO, logger="metaq.client")
    assert all(factory.create_producer().send_batch([Message(TOPIC, f"b{i}".encode()) for i in range(3)]))
    batches: list[list[bytes]] = []
    calls = 0

    def on_batch(messages: list[Message]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("database down")
        batches.append([m.data for m in messages])

    # auto_create_failure_topics=False: the missing topics are named, and the batch stays where it is.
    consumer = factory.create_consumer(retry_config(tmp_path, group="batcher", auto_create_failure_topics=False, retry_delays_s=(0.3,)))
    consumer.subscribe(TOPIC, batch_listener=on_batch)
    consumer.complete_subscribe()
    wait_until(lambda: any("auto_create_failure_topics is off" in r.getMessage() for r in caplog.records), 20, message="the missing topics named")
    line = next(r.getMessage() for r in caplog.records if "auto_create_failure_topics is off" in r.getMessage())
    assert "__retry.batcher" in line and "__dlq.batcher" in line and "metaq topics create" in line, line
    consumer.shutdown()
    assert batches == [] and consumer.stats.retried == 0

    calls = 0
    consumer = factory.create_consumer(retry_config(tmp_path, group="batcher", retry_delays_s=(0.3,)))
    consumer.subscribe(TOPIC, batch_listener=on_batch)
    consumer.complete_subscribe()
    # The whole fetch failed once: each of its messages went to the retry topic, and comes back alone.
    wait_until(lambda: sorted(batches) == [[b"b0"], [b"b1"], [b"b2"]], 20, message="each message retried alone")
    assert consumer.stats.retried == 3 and consumer.stats.listener_failures == 1
    consumer.shutdown()


def test_a_retry_topic_an_operator_deletes_is_created_again_at_the_next_failure(broker_factory, factory, zk, zk_root, zk_client, tmp_path) -> None:
    broker_factory(0, {TOPIC: 1}, system=SYSTEM)
    listener = FlakyListener(failures=1)
    consumer = factory.create_consumer(retry_config(tmp_path, retry_delays_s=(0.3, 0.3, 0.3), retry_topic_partitions=2))
    consumer.subscribe(TOPIC, listener=listener)
    consumer.complete_subscribe()
    producer = factory.create_producer()
    producer.send_message(Message(TOPIC, b"poison"))
    wait_until(lambda: len(listener.poison_calls()) == 2, 20, message="the first poison retried")
    paths = ZkPaths(zk_root)
    assert read_group_topics(zk_client, paths, 0).topics[RETRY]["numPartitions"] == "2"
    first = read_group_topics(zk_client, paths, 0).incarnations[RETRY]
    zk_args = ["--zk", zk.connect_string, "--zk-root", zk_root, "--broker-id", "0"]
    deleted = metaq_cli("topics", "delete", *zk_args, "--topic", RETRY)
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    # Alongside: the original topic altered (a partition added) while the consumer runs.
    altered = metaq_cli("topics", "alter", *zk_args, "--topic", TOPIC, "--partitions", "2")
    assert altered.returncode == 0, altered.stdout + altered.stderr
    listener.calls.clear()
    sent = producer.send_message(Message(TOPIC, b"poison"))
    wait_until(lambda: len(listener.poison_calls()) == 2, 30, message="the second poison retried through a new retry topic")
    again = read_group_topics(zk_client, paths, 0)
    assert RETRY in again.topics and again.incarnations[RETRY] != first
    assert {m.offset for _, m in listener.poison_calls()} == {sent.offset}
    assert consumer.stats.retried == 2
    consumer.shutdown()


def test_a_broker_group_lost_for_good_holds_back_only_its_own_partitions_retries(broker_factory, factory, tmp_path) -> None:
    """A fault that never heals: broker group 0 is killed -9 and stays down. Retries of broker
    group 1's messages live in group 1's retry topic and go on within the stated time."""
    brokers = [broker_factory(b, {TOPIC: 1}, system=SYSTEM) for b in (0, 1)]
    first_try: set[tuple[str, int]] = set()
    delivered: list[tuple[str, int]] = []
    lock = threading.Lock()

    def fails_once_each(message: Message) -> None:
        key = (str(message.partition), message.offset)
        with lock:
            delivered.append(key)
            if key not in first_try:
                first_try.add(key)
                raise RuntimeError("first try fails")

    consumer = factory.create_consumer(retry_config(tmp_path, retry_delays_s=(0.3,)))
    consumer.subscribe(TOPIC, listener=fails_once_each)
    consumer.complete_subscribe()
    producer = factory.create_producer()
    sent = [producer.send_message(Message(TOPIC, f"m{i}".encode())) for i in range(2)]
    assert {str(r.partition) for r in sent} == {"0-0", "1-0"}
    wait_until(lambda: len(delivered) == 4, 30, message="each message retried once in its own broker group")
    brokers[0].kill()  # never restarted
    later = producer.send_message(Message(TOPIC, b"after"))
    assert later.success and str(later.partition) == "1-0"
    started = time.time()
    wait_until(lambda: delivered.count((str(later.partition), later.offset)) == 2, 30, message="a retry in broker group 1")
    assert time.time() - started < 30
    consumer.shutdown()


def test_metaq_consume_says_where_the_messages_it_failed_to_print_went(broker_factory, factory, zk, zk_root, tmp_path) -> None:
    """Standard output on a full disk (/dev/full): every print fails. A fresh message goes to
    the retry topic; a retry already on its last allowed delivery goes to the dead-letter topic."""
    from metaq.client.retry_topics import FailureInfo

    group = "printer"
    retry, dlq = failure_topic_names(group)
    broker_factory(0, {TOPIC: 1, retry: 1, dlq: 1}, system=SYSTEM)
    producer = factory.create_producer()
    assert producer.send_message(Message(TOPIC, b"fresh")).success
    # As a member with the default max_reconsume_times (16) left it: 16 deliveries failed, due now.
    last = FailureInfo(TOPIC, Partition(0, 0), 0, 1, None, 16, "ValueError: earlier", 0)
    assert producer.send_message(Message(retry, b"old", last.encode())).success
    with open("/dev/full", "wb") as full:
        done = subprocess.run([sys.executable, "-m", "metaq", "consume", "--zk", zk.connect_string, "--zk-root", zk_root,
                               "--topic", TOPIC, "--group", group, "--idle-timeout", "8", "--recover-dir", str(tmp_path / "r")],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO_ROOT,
                              env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert done.returncode == 0, done.stderr
    summary = done.stderr.strip().splitlines()[-1]
    assert summary.startswith(f"consumed 0 messages from {TOPIC}") and "Traceback" not in done.stderr, done.stderr
    assert summary.endswith(f"; 1 failed and went to the retry topic {retry}; 1 moved to the dead-letter topic {dlq} "
                            f"(metaq groups dlq --group {group})"), summary
    listed = metaq_cli("groups", "dlq", "--zk", zk.connect_string, "--zk-root", zk_root, "--group", group)
    assert listed.returncode == 0 and "OSError" in listed.stdout, listed.stdout + listed.stderr


def test_retries_with_security_on_through_a_topic_alter_and_a_kill_9_failover(broker_factory, zk, zk_client, zk_root, tmp_path) -> None:
    """Everything at once: a secured sync pair, the operator-made retry and dead-letter topics,
    the original topic altered (a partition added) while retries wait, then the master killed
    -9 while they still wait, and more failing messages on both partitions of the new master.

    Each message that fails once is delivered exactly twice; each that always fails exactly
    1 + max_reconsume_times times and then lies once in the dead-letter topic; every one is
    settled within 60 s of the kill. Exactly: the consumer's retry sends are idempotent
    (``idempotence=True``), so a send cut by the kill and sent again is stored once."""
    from collections import Counter

    from metaq.client.connection import Credentials
    from metaq.security.credentials import SecurityFile

    from .failover_support import TOPIC as FO_TOPIC, Group
    from .test_trust_producer_ids import secured_pair
    from .trust_support import PASSWORDS, SecuredGroup, metaq as metaq_tool, request_as, run

    secured = SecuredGroup(tmp_path / "sec")
    users = SecurityFile.load(secured.users_file)
    # The group's needs (docs/client.md, "Failed messages"), and consume on the dead-letter topic to audit it.
    users.add_user("biller", "biller-password", consume=f"{FO_TOPIC},{RETRY},{DLQ}", produce=f"{RETRY},{DLQ}", iterations=4096)
    users.save()
    group = Group(zk_client, zk_root)
    a, b = secured_pair(broker_factory, secured, group)
    epoch = group.epoch()
    password_file = tmp_path / "ops.password"
    password_file.write_text(PASSWORDS["ops"] + "\n")
    operator = ["--zk", zk.connect_string, "--zk-root", zk_root, "--broker-id", "0", "--user", "ops", "--password-file",
                str(password_file), "--group-secret", str(secured.secret_file)]
    delays, max_reconsume = (10.0, 3.0), 2
    for topic, partitions in ((RETRY, len(delays)), (DLQ, 1)):
        done = metaq_tool("topics", "create", *operator, "--topic", topic, "--partitions", str(partitions))
        assert done.returncode == 0, done.stdout + done.stderr

    def topics_on(broker) -> dict[str, int]:  # type: ignore[no-untyped-def]
        return run(request_as(broker, "app", {"op": "topics"})).header["topics"]

    wait_until(lambda: {RETRY, DLQ} <= set(topics_on(b)), 30, message="the failure topics on the slave")

    deliveries: dict[bytes, list[int]] = {}
    lock = threading.Lock()

    def listener(message: Message) -> None:
        with lock:
            deliveries.setdefault(message.data, []).append(message.delivery_attempt)
            count = len(deliveries[message.data])
        if message.data.startswith(b"always") or (message.data.startswith(b"once") and count == 1):
            raise ValueError(f"cannot bill {message.data.decode()}")

    def client(user: str, password: str) -> MessageSessionFactory:
        return MessageSessionFactory(MetaClientConfig(
            zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000, request_timeout_s=3, send_timeout_s=60,
            send_retry_max_wait_s=0.2, idempotence=True, credentials=Credentials(user, password)))

    with client("app", PASSWORDS["app"]) as app, client("biller", "biller-password") as biller:
        consumer = biller.create_consumer(retry_config(tmp_path, retry_delays_s=delays, max_reconsume_times=max_reconsume))
        consumer.subscribe(FO_TOPIC, listener=listener)
        consumer.complete_subscribe()
        producer = app.create_producer()
        first = [f"{kind}-{i}".encode() for kind in ("once", "always") for i in range(3)] + [f"ok-{i}".encode() for i in range(10)]
        assert all(producer.send_batch([Message(FO_TOPIC, data) for data in first]))
        wait_until(lambda: consumer.stats.retried >= 6, 30, message="the first failures in the retry topic")
        failed_at = time.time()

        # While they wait: the topic altered, then the master killed -9.
        altered = metaq_tool("topics", "alter", *operator, "--topic", FO_TOPIC, "--partitions", "2")
        assert altered.returncode == 0, altered.stdout + altered.stderr
        wait_until(lambda: topics_on(b).get(FO_TOPIC) == 2, 30, message="the new partition on the slave")
        a.kill()
        killed_at = time.time()
        assert killed_at - failed_at < delays[0], "killed before the first retries were due"
        wait_until(lambda: group.master() == b.url and group.epoch() > epoch, 30, message="B to lead")

        second = [f"{kind}-{i}".encode() for kind in ("once", "always") for i in range(3, 9)] + [f"ok-{i}".encode() for i in range(10, 20)]
        sent = [producer.send_message(Message(FO_TOPIC, data)) for data in second]  # one by one: round robin
        assert all(sent) and {str(r.partition) for r in sent} == {"0-0", "0-1"}, [(r.partition, r.error_message) for r in sent]

        expected = {data: [1, 2] if data.startswith(b"once") else [1, 2, 3] if data.startswith(b"always") else [1]
                    for data in first + second}

        def settled() -> bool:
            with lock:
                return {d: list(v) for d, v in deliveries.items()} == expected and consumer.stats.dead_lettered == 9

        wait_until(settled, 60, message="every failed message settled within 60 s of the kill")
        assert time.time() - killed_at < 60
        time.sleep(max(delays) + 1.0)  # and nothing delivered again afterwards
        with lock:
            assert deliveries == expected, {d: v for d, v in deliveries.items() if expected.get(d) != v}
        assert (consumer.stats.retried, consumer.stats.dead_lettered) == (9 + 9 * max_reconsume, 9)
        consumer.shutdown()

        # The dead-letter topic on the new master holds each always-failing message once, attributes right.
        dead: list[Message] = []
        auditor = biller.create_consumer(ConsumerConfig(group="dlq-audit", fetch_wait_ms=200, failure_store="local",
                                                        recover_dir=str(tmp_path / "audit")))
        auditor.subscribe(DLQ, listener=dead.append)
        auditor.complete_subscribe()
        wait_until(lambda: len(dead) >= 9, 30, message="the dead letters read back")
        time.sleep(1.0)
        auditor.shutdown()
    infos = [failure_info(m) for m in dead]
    assert Counter(m.data for m in dead) == Counter(d for d in expected if d.startswith(b"always"))
    assert all(i is not None and i.topic == FO_TOPIC and i.attempts == 1 + max_reconsume and "cannot bill" in i.error for i in infos)
