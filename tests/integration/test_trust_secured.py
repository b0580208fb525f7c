"""With ``securityEnabled=true``: a secured sync group against hostile peers.

One sync master and slave with the group secret and a security file, real processes
and a real ZooKeeper:

* the slave authenticates to its master (SCRAM, the group secret) and replicates; acked
  puts need an authenticated user with a produce ACL;
* finding 1/4/5: an unauthenticated peer, or a user (even an admin), cannot report a
  position, read as a replica, ask where an epoch ends, or claim an epoch; only an admin
  reads the epoch history (a read that claims no epoch);
* finding 3: the group's ZooKeeper nodes are read-only to a client without the group's
  credentials (no forged sync set, no deleted master node, no fake master, no phantom);
* finding 9: ``stats config`` and ``stats reset`` need the admin permission, and a text
  ``stats`` (which cannot authenticate) is refused;
* per-topic ACLs: a user may consume only the topics its patterns name.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from kazoo.exceptions import NoAuthError

from metaq.client.connection import AuthenticationFailed
from metaq.security.group import GroupSecret
from metaq.security.handshake import ClientAuthenticator
from metaq.client.connection import BrokerConnection
from metaq.tools.launcher import wait_until
from metaq.zk.paths import ZkPaths

from .trust_support import SecuredGroup, put_as, request_as, run

TOPIC = "t"
SYNC = {"replicationMode": "sync", "onSyncSlaveLoss": "reject", "syncSlaveTimeoutMs": 1000, "unflushThreshold": 0}


@pytest.fixture
def secured_pair(broker_factory, zk_client, zk_root, tmp_path):  # type: ignore[no-untyped-def]
    group = SecuredGroup(tmp_path / "security")
    master = broker_factory(0, {TOPIC: 1, "other": 1}, {**SYNC, **group.system})
    slave = broker_factory(0, {TOPIC: 1, "other": 1}, {"unflushThreshold": 0, **group.system}, {"slaveId": 0})
    path = ZkPaths(zk_root).sync_set(0)

    def members() -> list[int] | None:
        return json.loads(zk_client.get(path)[0])["slaves"] if zk_client.exists(path) else None

    wait_until(lambda: members() == [0], 30, message="the authenticated slave in the sync set")
    return group, master, slave


def test_the_secured_group_replicates_and_acks_only_authenticated_producers(secured_pair) -> None:  # type: ignore[no-untyped-def]
    _group, master, slave = secured_pair
    acked = put_as(master, "app")
    assert acked.code == 200, acked.header  # sync: the authenticated slave has it
    assert put_as(master, None).code == 403
    assert put_as(master, "reader").code == 403, "reader has no produce ACL"
    get = {"op": "get", "topic": TOPIC, "partition": 0, "offset": 0}
    wait_until(lambda: run(request_as(slave, "reader", get)).code == 200, 10, message="the slave to serve the put")
    refused = run(request_as(slave, "reader", {**get, "topic": "other"}))
    assert refused.code == 403 and "no ACL rule" in refused.message
    assert "authenticated as broker 'broker:0:slave0'" in master.log_text()


def test_wrong_password_and_fake_servers_fail_the_handshake(secured_pair) -> None:  # type: ignore[no-untyped-def]
    _group, master, _slave = secured_pair

    async def wrong_password() -> None:
        await BrokerConnection.open(*master.address, authenticator=ClientAuthenticator("app", "guess"))

    with pytest.raises(AuthenticationFailed):
        run(wrong_password())
    assert "authentication from" in master.log_text()


@pytest.mark.parametrize("user", [None, "app", "ops"])
def test_no_user_can_replicate_or_claim_an_epoch(secured_pair, user) -> None:  # type: ignore[no-untyped-def]
    _group, master, _slave = secured_pair
    put_as(master, "app")
    replica = {"slave_id": 0, "epoch": 999, "log_end": 10**9}
    for header in (
        {"op": "position", "topic": TOPIC, "partition": 0, "replica": replica},
        {"op": "get", "topic": TOPIC, "partition": 0, "offset": 0, "replica": replica},
        {"op": "epoch_end", "topic": TOPIC, "partition": 0, "epoch": 1},
    ):
        reply = run(request_as(master, user, header))
        assert reply.code == 403 and not reply.body, (user, header["op"], reply.header)
    # The epoch history is an admin's read (metaq drill): it claims nothing, so it fences nothing.
    history = run(request_as(master, user, {"op": "epochs", "topic": TOPIC, "partition": 0}))
    if user == "ops":
        assert history.code == 200 and history["entries"][-1][0] == 1, history.header
    else:
        assert history.code == 403 and "entries" not in history.header, (user, history.header)
    assert put_as(master, "app").code == 200, "the master is neither fenced nor missing its slave"


def test_stats_config_and_reset_need_admin(secured_pair) -> None:  # type: ignore[no-untyped-def]
    _group, master, _slave = secured_pair
    for item in ("config", "reset"):
        assert run(request_as(master, "app", {"op": "stats", "item": item})).code == 403
        assert run(request_as(master, "ops", {"op": "stats", "item": item})).code == 200
    assert run(request_as(master, "app", {"op": "stats"})).code == 200
    assert run(request_as(master, None, {"op": "stats"})).code == 403
    assert run(request_as(master, None, {"op": "version"})).code == 200
    with socket.create_connection(master.address, timeout=5) as sock:
        sock.sendall(b"stats config\r\n")
        text = sock.recv(4096).decode()
    assert text.startswith("ERROR not authenticated") and "zkConnect" not in text


def test_zookeeper_nodes_of_the_group_are_read_only_without_its_credentials(secured_pair, zk_client, zk_root) -> None:  # type: ignore[no-untyped-def]
    _group, master, _slave = secured_pair
    paths = ZkPaths(zk_root)
    assert zk_client.get(paths.master(0))[0].decode() == master.url  # clients still read
    with pytest.raises(NoAuthError):
        zk_client.set(paths.sync_set(0), json.dumps({"slaves": [0, 5], "epoch": 1, "min": 1}).encode())
    with pytest.raises(NoAuthError):
        zk_client.set(paths.epoch(0), b"99")
    with pytest.raises(NoAuthError):
        zk_client.delete(paths.master(0))
    with pytest.raises(NoAuthError):
        zk_client.create(paths.slave(0, 99), b"meta://127.0.0.1:1", ephemeral=True)
    with pytest.raises(NoAuthError):
        zk_client.delete(paths.slave(0, 0))
    assert put_as(master, "app").code == 200


def test_a_topic_registration_deleted_by_someone_else_comes_back(secured_pair, zk_client, zk_root) -> None:  # type: ignore[no-untyped-def]
    """ZooKeeper lets anyone withdraw an entry from a shared directory; the broker puts it back."""
    _group, master, _slave = secured_pair
    node = ZkPaths(zk_root).topic_pub_node(TOPIC, 0)
    assert zk_client.exists(node)
    zk_client.delete(node)
    wait_until(lambda: zk_client.exists(node) is not None, 10, message="the registration to come back")
    assert "registering it again" in master.log_text()


def test_a_slave_asked_as_a_member_refuses_epoch_end_and_replication_as_not_the_master(secured_pair) -> None:  # type: ignore[no-untyped-def]
    """Only the acting master answers where an epoch ends (a rejoining broker cuts there) and
    serves replication: the slave, asked by a logged-in member of its group, refuses with the
    structured ``not_master`` reason (ha/answerer.py); a user is refused by the ACL first."""
    group, _master, slave = secured_pair
    put_as(_master, "app")
    secret = GroupSecret.load(group.secret_file, 0)

    async def ask_as_member(header: dict) -> Any:  # type: ignore[type-arg]
        authenticator = ClientAuthenticator(secret.username("slave0"), secret.scram_password())
        conn = await BrokerConnection.open(*slave.address, authenticator=authenticator)
        try:
            return await conn.request(header, timeout=30)
        finally:
            conn.close()

    for header in (
        {"op": "epoch_end", "topic": TOPIC, "partition": 0, "epoch": 1},
        {"op": "get", "topic": TOPIC, "partition": 0, "offset": 0, "replica": {"slave_id": 0, "epoch": 1, "log_end": 0}},
    ):
        reply = run(ask_as_member(header))
        assert reply.code == 403 and reply.reason == "not_master", (header["op"], reply.header)
        assert (reply["role"], reply["serving_epoch"]) == ("slave0", 1)
    history = run(ask_as_member({"op": "epochs", "topic": TOPIC, "partition": 0}))
    assert history.code == 200 and (history["role"], history["serving_epoch"]) == ("slave0", 1)
    refused = run(request_as(slave, "ops", {"op": "epoch_end", "topic": TOPIC, "partition": 0, "epoch": 1}))
    assert refused.code == 403 and refused.reason == "acl" and "role" not in refused.header
