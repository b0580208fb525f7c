"""A secured group's brokers ask each other as members of the group (ha/peers.py).

One secured sync pair (group 0, security on, real processes) on a ZooKeeper of this module's
own, with a super-user login so a test can remove a node the group's ACLs protect:

* a partition added at run time (``metaq topics alter --partitions 3``) is replicated: the
  slave asks its master's topics as ``slave{k}``; anonymously it got 403 and never
  fetched the new partition, so a sync put there was refused;
* the join check of a broker started without ``--slave`` asks the master's topics as a
  member of the group too: anonymously it got 403, read that as "does not answer", and
  let a broker with a topic the master lacks join as its slave;
* a slave started with another group secret exits with one line naming its secret file
  (it was a 50-line ``kazoo.exceptions.NoAuthError`` traceback);
* last, ZooKeeper loses its data under the pair (docs/operations.md, "Losing ZooKeeper's
  data"): the group recovers with security on, its nodes under the group's ACL again.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from metaq.protocol.codes import OK
from metaq.record import encode_batch, iter_records
from metaq.tools.launcher import BrokerFactory, BrokerProcess, wait_until
from metaq.zk.acl import super_digest
from metaq.zk.embedded import EmbeddedZooKeeper
from metaq.zk.paths import ZkPaths
from tests.conftest import TEST_TICK_MS
from tests.harness import kazoo_client

from .failover_support import restart_empty
from .trust_support import PASSWORDS, SecuredGroup, metaq, request_as, run

TOPIC = "t"
SYNC = {"replicationMode": "sync", "unflushThreshold": 0, "syncSlaveTimeoutMs": 1000}
ZK_ADMIN_PASSWORD = "zk-admin-password"


class SecuredPair:
    def __init__(self, directory: Path) -> None:
        self.zk = EmbeddedZooKeeper(data_dir=directory / "zk", tick_ms=TEST_TICK_MS, super_digest=super_digest(ZK_ADMIN_PASSWORD))
        self.root = f"/meta-{uuid.uuid4().hex[:12]}"
        self.paths = ZkPaths(self.root)
        self.directory = directory
        self.group = SecuredGroup(directory / "security")
        self.factory: BrokerFactory | None = None
        self.master: BrokerProcess | None = None
        self.slave: BrokerProcess | None = None

    def start(self) -> "SecuredPair":
        self.zk.start()
        self.factory = BrokerFactory(self.directory, self.zk.connect_string, self.root)
        self.master = self.factory(0, {TOPIC: 1}, {**SYNC, **self.group.system})
        self.slave = self.factory(0, {TOPIC: 1}, {"unflushThreshold": 0, **self.group.system}, {"slaveId": 0})
        self.wait_in_sync_set()
        return self

    def wait_in_sync_set(self) -> None:
        node = self.paths.sync_set(0)
        with kazoo_client(self.zk.connect_string) as client:
            wait_until(lambda: client.exists(node) and json.loads(client.get(node)[0])["slaves"] == [0],
                       30, message="the slave in the sync set")

    def topics_tool(self, action: str, *args: str) -> Any:
        password_file = self.directory / "ops.password"
        password_file.write_text(PASSWORDS["ops"] + "\n")
        return metaq("topics", action, "--zk", self.zk.connect_string, "--zk-root", self.root, "--broker-id", "0",
                     "--user", "ops", "--password-file", str(password_file),
                     "--group-secret", str(self.group.secret_file), *args)

    def stop(self) -> None:
        if self.factory is not None:
            self.factory.stop_all()
        self.zk.stop()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredPair]:
    secured = SecuredPair(tmp_path_factory.mktemp("secured-peers"))
    try:
        yield secured.start()
    finally:
        secured.stop()


def served(broker: BrokerProcess, topic: str) -> int | None:
    return run(request_as(broker, "ops", {"op": "topics"}))["topics"].get(topic)


def test_a_partition_added_at_run_time_is_replicated_with_security_on(pair: SecuredPair) -> None:
    master, slave = pair.master, pair.slave
    assert master is not None and slave is not None
    done = pair.topics_tool("alter", "--topic", TOPIC, "--partitions", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    wait_until(lambda: served(master, TOPIC) == 3 and served(slave, TOPIC) == 3, 15, message="both to serve 3 partitions")

    payloads = [f"new-partition-{n}".encode() for n in range(5)]
    for payload in payloads:
        # Sync mode, onSyncSlaveLoss=reject: acked only once the slave holds it.
        reply = run(request_as(master, "app", {"op": "put", "topic": TOPIC, "partition": 2}, encode_batch([(payload, None)])))
        assert reply.code == OK, f"{reply.code} {reply.message}"
    start, data = slave.disk_log(TOPIC, 2)
    assert [bytes(r.data) for r in iter_records(data, start)] == payloads
    pair.wait_in_sync_set()


def test_the_join_check_asks_a_secured_master_as_a_member(pair: SecuredPair) -> None:
    """Without the group's topic configuration node, the master's own answer decides."""
    assert pair.factory is not None and pair.master is not None
    with kazoo_client(pair.zk.connect_string, auth_data=[("digest", f"super:{ZK_ADMIN_PASSWORD}")]) as admin:
        admin.delete(pair.paths.topic_config(0))
    stray = pair.factory(0, {TOPIC: 3, "extra": 1}, {**SYNC, **pair.group.system}, name="stray", start=False)
    stray.start(wait=False)
    wait_until(lambda: not stray.alive, 30, message="the stray broker to refuse to join")
    assert stray.returncode == 1
    log_text = stray.log_text()
    assert "brokerId=0 is in use" in log_text and "topics not on the master: extra" in log_text, log_text
    assert "does not answer" not in log_text
    assert served(pair.master, "extra") is None


def test_a_slave_with_a_wrong_group_secret_exits_with_one_line_naming_the_file(pair: SecuredPair) -> None:
    assert pair.factory is not None
    wrong = SecuredGroup(pair.directory / "wrong-secret")  # same users, another group secret
    slave = pair.factory(0, {TOPIC: 3}, {"unflushThreshold": 0, **wrong.system}, {"slaveId": 5}, name="wrong-secret", start=False)
    slave.start(wait=False)
    wait_until(lambda: not slave.alive, 30, message="the slave with a wrong secret to exit")
    assert slave.returncode == 1
    log_text = slave.log_text()
    assert "Traceback" not in log_text and "NoAuthError" not in log_text, log_text
    errors = [line for line in log_text.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and str(wrong.secret_file) in errors[0] and "another group secret" in errors[0], log_text


def test_a_secured_group_never_failed_over_recovers_from_an_emptied_zookeeper(pair: SecuredPair) -> None:
    """ZooKeeper's data lost under a secured pair still at epoch 1: its master (it led epoch 1)
    re-seeds the group with the group's ACLs, its slave follows, every ack stays readable."""
    master, slave = pair.master, pair.slave
    assert master is not None and slave is not None

    def put(payload: bytes) -> Any:
        return run(request_as(master, "app", {"op": "put", "topic": TOPIC, "partition": 0}, encode_batch([(payload, None)])))

    acked = [payload for payload in (f"before-{n}".encode() for n in range(5)) if put(payload).code == OK]
    assert len(acked) == 5
    restart_empty(pair.zk)
    wait_until(lambda: put(b"after").code == OK, 30, interval=0.2, message="a put acked after ZooKeeper came back empty")
    with kazoo_client(pair.zk.connect_string) as client:
        assert json.loads(client.get(pair.paths.epoch(0))[0])["epoch"] == 2
        acl, _ = client.get_acls(pair.paths.epoch(0))
        assert {entry.id.scheme for entry in acl} == {"world", "digest"}, acl  # the group's ACL again
    pair.wait_in_sync_set()
    start, data = slave.disk_log(TOPIC, 0)
    on_slave = [bytes(r.data) for r in iter_records(data, start)]
    assert [p for p in acked + [b"after"] if p not in on_slave] == []
