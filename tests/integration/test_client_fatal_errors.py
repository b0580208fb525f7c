"""Errors no retry can fix fail the send at once, naming the cause;
and what a client trusts from ZooKeeper.

One secured broker group (SCRAM users, ACLs, TLS; topic ``t``, and ``closed`` with
``acceptPublish=false``) and one plain group (topic ``p``), real processes on the shared
ZooKeeper. Each case below used to be retried until ``send_timeout_s`` and then reported
as "unreachable", "no master publishes topic ... yet" or "outcome unknown: connection
lost"; now each ends in well under a second (docs/client.md, "Error classes") with the
broker's reason, and with the default send timeout (15 s) a retry would show as seconds.

The same brokers then face registrations that a ZooKeeper client wrote: a fake group
that anybody could write (never contacted by a client that logs in), and a ``numParts``
far above the client's cap (ignored, not looped over).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from typing import Iterator

import pytest

from metaq.client import ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig, SendResult
from metaq.client.cluster import MAX_PARTITIONS
from metaq.client.connection import Credentials
from metaq.client.xa import XAError
from metaq.tools.launcher import BrokerFactory, BrokerProcess, wait_until
from metaq.zk.acl import ZkSecurity
from metaq.zk.paths import ZkPaths, topic_node_data
from tests.harness import kazoo_client

from .trust_support import PASSWORDS, SecuredGroup
from tests.security_support import TestCA

#: What "at once" means here: a few round trips and at most one extra TLS probe, on a
#: slow shared CI machine; a retried send would take the whole send timeout (15 s).
AT_ONCE_S = 1.0


class Brokers:
    def __init__(self, factory: BrokerFactory, ca: TestCA, secured: BrokerProcess, plain: BrokerProcess,
                 group: SecuredGroup) -> None:
        self.factory, self.ca, self.secured, self.plain, self.group = factory, ca, secured, plain, group

    def app(self) -> Credentials:
        return Credentials("app", PASSWORDS["app"], str(self.ca.cert_file))


@pytest.fixture(scope="module")
def brokers(zk, tmp_path_factory) -> Iterator[Brokers]:  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("fatal")
    factory = BrokerFactory(directory, zk.connect_string, f"/meta-{uuid.uuid4().hex[:12]}")
    try:
        group = SecuredGroup(directory / "security")
        ca = TestCA.create(directory / "tls")
        cert, key = ca.issue("secured")
        tls = {"tlsCertFile": str(cert), "tlsKeyFile": str(key), "tlsCaFile": str(ca.cert_file)}
        secured = factory(0, {"t": 1, "closed": {"acceptPublish": "false"}}, {"unflushThreshold": 0, **group.system, **tls})
        plain = factory(1, {"p": 1}, {"unflushThreshold": 0})
        yield Brokers(factory, ca, secured, plain, group)
    finally:
        factory.stop_all()


def send(brokers: Brokers, topic: str, credentials: Credentials, count: int = 1) -> tuple[list[SendResult], float]:
    """Blocking sends with the default retry budget: their results and how long they took."""
    config = MetaClientConfig(zk_connect=brokers.factory.zk_connect, zk_root=brokers.factory.zk_root,
                              credentials=credentials)
    with MessageSessionFactory(config) as factory:
        producer = factory.create_producer()
        producer.publish(topic)
        started = time.monotonic()
        results = [producer.send_message(Message(topic, b"m")) for _ in range(count)]
        elapsed = time.monotonic() - started
        producer.close()
    assert config.send_timeout_s >= 10 * AT_ONCE_S  # a retried failure could not pass as fast
    return results, elapsed


def send_one(brokers: Brokers, topic: str, credentials: Credentials) -> tuple[SendResult, float]:
    (result,), elapsed = send(brokers, topic, credentials)
    return result, elapsed


def assert_fails_at_once(result: SendResult, elapsed: float, *words: str) -> None:
    assert not result.success, result
    assert elapsed < AT_ONCE_S, f"took {elapsed:.2f}s: {result.error_message}"
    for word in words:
        assert word in (result.error_message or ""), result.error_message
    # At most the blocking producer's first attempt on its own socket (direct.py), which
    # cannot tell a TLS port's silent close from a crash, and the pooled one that does.
    assert result.attempts <= 2, f"retried: {result.error_message}"


def test_the_control_case_is_acked(brokers: Brokers) -> None:
    result, _ = send_one(brokers, "t", Credentials("app", PASSWORDS["app"], str(brokers.ca.cert_file)))
    assert result.success, result.error_message


def test_a_wrong_password_fails_at_once(brokers: Brokers) -> None:
    result, elapsed = send_one(brokers, "t", Credentials("app", "guess", str(brokers.ca.cert_file)))
    assert_fails_at_once(result, elapsed, "authentication failed")
    assert "unreachable" not in (result.error_message or "")


def test_an_unknown_user_fails_at_once(brokers: Brokers) -> None:
    result, elapsed = send_one(brokers, "t", Credentials("nobody", "guess", str(brokers.ca.cert_file)))
    assert_fails_at_once(result, elapsed, "authentication failed")


def test_an_acl_denial_fails_at_once_with_the_brokers_reason(brokers: Brokers) -> None:
    result, elapsed = send_one(brokers, "t", Credentials("reader", PASSWORDS["reader"], str(brokers.ca.cert_file)))
    assert_fails_at_once(result, elapsed, "403", "user 'reader' may not produce topic 't'")
    assert result.code == 403


def test_an_xa_recover_without_a_produce_right_fails_at_once_with_the_brokers_reason(brokers: Brokers) -> None:
    # The transactional sender retries 403s (a slave naming its master) through a failover;
    # an ACL's refusal (reason "acl" in the reply) is answered at once instead.
    config = MetaClientConfig(zk_connect=brokers.factory.zk_connect, zk_root=brokers.factory.zk_root,
                              credentials=Credentials("reader", PASSWORDS["reader"], str(brokers.ca.cert_file)))
    with MessageSessionFactory(config) as factory:
        resource = factory.create_xa_producer(broker_id=0).xa_resource()
        started = time.monotonic()
        with pytest.raises(XAError, match="403 may not recover transactions: user 'reader' may not produce any topic"):
            resource.recover()
        elapsed = time.monotonic() - started
    assert elapsed < AT_ONCE_S, f"took {elapsed:.2f}s"
    assert config.send_timeout_s >= 10 * AT_ONCE_S  # a retried refusal could not pass as fast


def test_a_topic_that_does_not_accept_publishing_fails_at_once(brokers: Brokers) -> None:
    result, elapsed = send_one(brokers, "closed", Credentials("app", PASSWORDS["app"], str(brokers.ca.cert_file)))
    assert_fails_at_once(result, elapsed, "'closed' does not accept publishing", "acceptPublish=false")


def test_a_plaintext_client_to_a_tls_port_is_told_so(brokers: Brokers) -> None:
    result, elapsed = send_one(brokers, "t", Credentials("app", PASSWORDS["app"]))
    assert_fails_at_once(result, elapsed, "speaks TLS", "tls_ca_file")
    assert not result.outcome_unknown, result


def test_a_plaintext_client_without_a_login_to_a_tls_port_is_told_so(brokers: Brokers) -> None:
    result, elapsed = send_one(brokers, "t", Credentials())
    assert_fails_at_once(result, elapsed, "speaks TLS")
    assert not result.outcome_unknown, result


def test_a_tls_client_to_a_plaintext_port_is_told_so(brokers: Brokers) -> None:
    result, elapsed = send_one(brokers, "p", Credentials(tls_ca_file=str(brokers.ca.cert_file)))
    assert_fails_at_once(result, elapsed, "does not speak TLS")


def test_a_certificate_from_another_ca_fails_at_once(brokers: Brokers, tmp_path) -> None:  # type: ignore[no-untyped-def]
    other = TestCA.create(tmp_path / "other", "another CA")
    result, elapsed = send_one(brokers, "t", Credentials("app", PASSWORDS["app"], str(other.cert_file)))
    assert_fails_at_once(result, elapsed, "certificate is not trusted")


def test_a_consumer_without_the_right_says_why_at_once(brokers: Brokers, caplog) -> None:  # type: ignore[no-untyped-def]
    reader = Credentials("reader", PASSWORDS["reader"], str(brokers.ca.cert_file))  # may consume "t" only
    config = MetaClientConfig(zk_connect=brokers.factory.zk_connect, zk_root=brokers.factory.zk_root, credentials=reader)
    caplog.set_level(logging.WARNING, logger="metaq.client.consumer")
    with MessageSessionFactory(config) as factory:
        consumer = factory.create_consumer(ConsumerConfig(group="denied", offset_store_path=str(brokers.factory.tmp_dir / "o.json")))
        consumer.subscribe("closed", 1 << 20, lambda message: None)
        started = time.monotonic()
        consumer.complete_subscribe()
        wait_until(lambda: "cannot read" in caplog.text, 5, interval=0.02, message="the consumer's warning")
        elapsed = time.monotonic() - started
        time.sleep(0.5)  # several retries: still one line
        consumer.shutdown()
    lines = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert elapsed < AT_ONCE_S and len(lines) == 1, (elapsed, lines)
    assert "user 'reader' may not consume topic 'closed'" in lines[0], lines


# --- registrations in ZooKeeper the client does not trust ---------------------


class Listener(threading.Thread):
    """A port that counts the connections made to it (what a forged master would collect)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.halt.set()
        self.join(5)
        self.sock.close()


def test_a_group_anybody_could_register_is_never_contacted(brokers: Brokers) -> None:
    fake = Listener()
    fake.start()
    paths = ZkPaths(brokers.factory.zk_root)
    forged = [paths.broker(777), paths.master(777), paths.topic_pub_node("t", 777), paths.topic_sub_node("t", 777),
              paths.master_config_checksum(777)]
    with kazoo_client(brokers.factory.zk_connect) as anonymous:  # no credentials: the default open ACL
        anonymous.create(forged[0], b"")
        anonymous.create(forged[1], f"meta://127.0.0.1:{fake.port}".encode(), ephemeral=True)
        for path in forged[2:4]:
            anonymous.create(path, topic_node_data(1, 777), ephemeral=True)
        anonymous.create(forged[4], b"0", ephemeral=True)
        try:
            # Round robin over 0-0 and the forged 777-0: half of these went to the fake before.
            results, _ = send(brokers, "t", brokers.app(), count=6)
        finally:
            fake.close()
            for path in reversed(forged):
                anonymous.delete(path)
    assert fake.accepted == 0, f"the client connected {fake.accepted} time(s) to a master anybody could register"
    assert all(r.success and r.partition is not None and r.partition.broker_id == 0 for r in results), results


def test_a_num_parts_above_the_cap_is_ignored(brokers: Brokers) -> None:
    # Written with group 0's own ZooKeeper credentials: only the client's cap stands in the way.
    security = ZkSecurity(brokers.factory.zk_root, 0, brokers.group.zk_password())
    paths = ZkPaths(brokers.factory.zk_root)
    node = paths.topic_pub_node("huge", 0)
    with kazoo_client(brokers.factory.zk_connect, **security.client_kwargs()) as group_zk:
        security.create(group_zk, node, topic_node_data(50 * MAX_PARTITIONS, 0), ephemeral=True)
        try:
            config = MetaClientConfig(zk_connect=brokers.factory.zk_connect, zk_root=brokers.factory.zk_root,
                                      credentials=brokers.app())
            with MessageSessionFactory(config) as factory:
                factory.create_producer().publish("huge")
                partitions = factory.aio.cluster.snapshot.pub["huge"]
        finally:
            group_zk.delete(node)
    assert partitions == (), f"{len(partitions)} partitions taken from a numParts above {MAX_PARTITIONS}"
