"""A real broker process in a real ZooKeeper: the registration layout of docs/zookeeper.md,
deregistration on a clean stop, re-registration after the session expired."""

from __future__ import annotations

import json
import os
import time
import zlib

from kazoo.client import KazooClient

from metaq.zk.paths import ZkPaths
from tests.harness import wait_until

TOPICS = {
    "orders": 4,
    "audit": {"numPartitions": 2, "acceptPublish": "false"},
    "sink": {"numPartitions": 3, "acceptSubscribe": "false"},
}


def children(client: KazooClient, path: str) -> list[str]:
    return sorted(client.get_children(path)) if client.exists(path) else []


def test_registration_matches_the_design_layout_and_goes_on_clean_stop(broker_factory, zk_client, zk_root) -> None:
    paths = ZkPaths(zk_root)
    broker = broker_factory(3, TOPICS)

    data, stat = zk_client.get(f"{zk_root}/brokers/ids/3/master")
    assert data.decode() == f"meta://127.0.0.1:{broker.port}"
    assert stat.ephemeralOwner != 0, "the master node is ephemeral"
    checksum, stat = zk_client.get(f"{zk_root}/brokers/ids/3/master_config_checksum")
    assert checksum.decode() == str(zlib.crc32(broker.config_path.read_bytes())), "CRC32 of the server.ini bytes, decimal"
    assert stat.ephemeralOwner != 0

    # topics-pub: only topics that accept publishing; topics-sub: only those that accept subscribing.
    assert children(zk_client, f"{zk_root}/brokers/topics-pub") == ["orders", "sink"]
    assert children(zk_client, f"{zk_root}/brokers/topics-sub") == ["audit", "orders"]
    expected = {
        ("pub", "orders"): 4, ("pub", "sink"): 3,
        ("sub", "orders"): 4, ("sub", "audit"): 2,
    }
    for (kind, topic), parts in expected.items():
        node = f"{zk_root}/brokers/topics-{kind}/{topic}/3-m"
        assert children(zk_client, f"{zk_root}/brokers/topics-{kind}/{topic}") == ["3-m"]
        data, stat = zk_client.get(node)
        assert json.loads(data) == {"numParts": parts, "broker": "3-m"}, node
        assert stat.ephemeralOwner != 0, f"{node} is ephemeral"
    assert node == paths.topic_sub_node("audit", 3)

    assert broker.stop() == 0
    # Deregistered at once by the clean stop (not by a session timeout, which is 4 s here).
    assert zk_client.exists(f"{zk_root}/brokers/ids/3/master") is None
    assert zk_client.exists(f"{zk_root}/brokers/ids/3/master_config_checksum") is None
    for kind in ("pub", "sub"):
        for topic in children(zk_client, f"{zk_root}/brokers/topics-{kind}"):
            assert children(zk_client, f"{zk_root}/brokers/topics-{kind}/{topic}") == [], (kind, topic)


def test_re_registers_after_its_zk_session_expired(broker_factory, zk_client, zk_root) -> None:
    session_ms = 1200
    broker = broker_factory(5, {"orders": 2}, zookeeper={"zk.zkSessionTimeoutMs": session_ms})
    master = f"{zk_root}/brokers/ids/5/master"
    topic_node = f"{zk_root}/brokers/topics-pub/orders/5-m"
    first_owner = zk_client.exists(master).ephemeralOwner

    # Freeze the broker past its session timeout: ZooKeeper expires the session and
    # deletes its nodes; once thawed, the broker must notice and register again.
    broker.pause()
    try:
        wait_until(lambda: zk_client.exists(master) is None, 10, message="the session to expire")
        assert zk_client.exists(topic_node) is None
    finally:
        broker.resume()

    def registered_again() -> bool:
        found = zk_client.exists(master)
        if found is None or found.ephemeralOwner == first_owner or zk_client.exists(topic_node) is None:
            return False
        # The master node is the election lock and comes first; the checksum node follows
        # once the new session takes writes.
        checksum = zk_client.exists(f"{zk_root}/brokers/ids/5/master_config_checksum")
        return checksum is not None and checksum.ephemeralOwner == found.ephemeralOwner

    wait_until(registered_again, 15, message="re-registration with a new session")
    data, stat = zk_client.get(master)
    assert data.decode() == broker.url
    assert zk_client.get(topic_node)[1].ephemeralOwner == stat.ephemeralOwner
    assert json.loads(zk_client.get(topic_node)[0]) == {"numParts": 2, "broker": "5-m"}
    assert zk_client.exists(f"{zk_root}/brokers/ids/5/master_config_checksum").ephemeralOwner == stat.ephemeralOwner
    time.sleep(0.2)
    assert broker.alive


def test_local_cluster_starts_zk_master_and_slave_and_stops_them_by_pid(tmp_path) -> None:
    from metaq.tools.launcher import LocalCluster
    from tests.harness import zk_session

    cluster = LocalCluster(tmp_path / "cluster", masters=1, slaves=1, topics={"demo": 2}, zk_root="/meta")
    with cluster:
        master, slave = cluster.masters[0], cluster.slaves[0][0]
        assert master.alive and slave.alive and cluster.zk.alive
        assert (slave.dir / "async_slave.properties").read_text() == "slaveId=0\n"
        with zk_session(cluster.zk_connect) as client:
            assert client.get("/meta/brokers/ids/0/master")[0].decode() == master.url
            assert client.get("/meta/brokers/ids/0/slave0")[0].decode() == slave.url
            assert sorted(client.get_children("/meta/brokers/topics-sub/demo")) == ["0-m", "0-s0"]
        pids = [master.pid, slave.pid, cluster.zk.pid]
    assert not master.alive and not slave.alive and not cluster.zk.alive
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"pid {pid} still exists after stop()")


def test_a_founding_master_logs_each_role_decision_once(broker_factory) -> None:
    """An orphan re-evaluates on every ZooKeeper event; the operator reads each verdict once."""
    broker = broker_factory(5, {"orders": 1})
    wait_until(lambda: "leading broker group 5" in broker.log_text(), 10, message="the broker leads")
    text = broker.log_text()
    assert text.count("may take over:") == 1, text
    assert text.count("--eligible--> electing") == 1 and text.count("--won--> leading") == 1, text
