"""``metaq topics create|alter|delete`` against a group with ZooKeeper ACLs.

A secured sync master and slave (real processes, real ZooKeeper): the group's topic
configuration node (``/brokers/topic-config/{id}``) is the group's, like its master and
epoch nodes. The tool writes it only when it logs in to ZooKeeper as the group
(``--group-secret``), and both brokers apply the change; without it the tool stops with
one line and nothing changes; neither an anonymous ZooKeeper client nor a broker of
another group can change or delete it. A second group creates its own node beside it.
"""

from __future__ import annotations

import json

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, Permissions

from metaq.tools.launcher import wait_until
from metaq.zk.acl import ZkSecurity
from metaq.zk.paths import ZkPaths
from tests.harness import kazoo_client

from .trust_support import PASSWORDS, SecuredGroup, metaq, request_as, run

TOPIC = "t"
SYNC = {"replicationMode": "sync", "unflushThreshold": 0, "syncSlaveTimeoutMs": 1000}


def served(broker, topic: str) -> int | None:  # type: ignore[no-untyped-def]
    return run(request_as(broker, "ops", {"op": "topics"}))["topics"].get(topic)


def test_topics_tool_writes_a_secured_groups_configuration_only_as_the_group(broker_factory, zk, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    group = SecuredGroup(tmp_path / "security")
    master = broker_factory(0, {TOPIC: 1}, {**SYNC, **group.system})
    slave = broker_factory(0, {TOPIC: 1}, {"unflushThreshold": 0, **group.system}, {"slaveId": 0})
    paths = ZkPaths(zk_root)
    sync_set = paths.sync_set(0)
    wait_until(
        lambda: zk_client.exists(sync_set) and json.loads(zk_client.get(sync_set)[0])["slaves"] == [0],
        30, message="the slave in the sync set",
    )
    node = paths.topic_config(0)
    password_file = tmp_path / "ops.password"
    password_file.write_text(PASSWORDS["ops"] + "\n")
    tool = ["--zk", zk.connect_string, "--zk-root", zk_root, "--broker-id", "0", "--topic"]
    login = ["--user", "ops", "--password-file", str(password_file)]
    secret = ["--group-secret", str(group.secret_file)]

    # The node is the group's; its directory lets every group add its own node, nobody delete one.
    acl, _ = zk_client.get_acls(node)
    assert {(entry.id.scheme, entry.perms) for entry in acl} == {("world", Permissions.READ), ("digest", Permissions.ALL)}
    directory_acl, _ = zk_client.get_acls(node.rsplit("/", 1)[0])
    assert [(entry.id.scheme, entry.perms) for entry in directory_acl] == [("world", Permissions.READ | Permissions.CREATE)]

    # Without the group's ZooKeeper login: one line naming the option, nothing written.
    before = zk_client.get(node)
    refused = metaq("topics", "alter", *tool, TOPIC, "--partitions", "2", *login)
    err = refused.stderr.decode().strip()
    assert refused.returncode != 0 and "--group-secret" in err and len(err.splitlines()) == 1, err
    assert zk_client.get(node) == before and served(master, TOPIC) == 1

    # As the group: written, and both brokers serve the change.
    done = metaq("topics", "alter", *tool, TOPIC, "--partitions", "2", *login, *secret)
    assert done.returncode == 0 and "applied by every live member" in done.stdout.decode(), done.stdout + done.stderr
    assert served(master, TOPIC) == 2 and served(slave, TOPIC) == 2
    done = metaq("topics", "create", *tool, "audit", "--partitions", "3", *login, *secret)
    assert done.returncode == 0 and served(slave, "audit") == 3, done.stdout + done.stderr
    assert metaq("topics", "delete", *tool, "audit", *login).returncode != 0
    done = metaq("topics", "delete", *tool, "audit", *login, *secret)
    assert done.returncode == 0 and served(master, "audit") is None and served(slave, "audit") is None, done.stdout + done.stderr

    # Other ZooKeeper identities: an anonymous client and a broker of group 1.
    other = ZkSecurity(zk_root, 1, "group-1-password")
    with kazoo_client(zk.connect_string, **other.client_kwargs()) as other_group:
        for client in (zk_client, other_group):
            with pytest.raises(NoAuthError):
                client.set(node, json.dumps({"topics": {"forged": {"numPartitions": "9"}}}).encode())
            with pytest.raises(NoAuthError):
                client.delete(node)
    assert served(master, "forged") is None and served(master, TOPIC) == 2


def test_a_second_secured_group_adds_its_own_topic_configuration(broker_factory, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    first, second = SecuredGroup(tmp_path / "group0"), SecuredGroup(tmp_path / "group1", broker_id=1)
    broker_factory(0, {TOPIC: 1}, first.system)
    other = broker_factory(1, {"other": 2}, second.system)
    paths = ZkPaths(zk_root)
    assert json.loads(zk_client.get(paths.topic_config(1))[0])["topics"]["other"]["numPartitions"] == "2"
    acl, _ = zk_client.get_acls(paths.topic_config(1))
    assert any(entry.id.id.startswith("metaq-group-1:") for entry in acl)
    assert not any(entry.id.id.startswith("metaq-group-0:") for entry in acl)
    assert run(request_as(other, "ops", {"op": "topics"}))["topics"] == {"other": 2}


def test_turning_acls_on_corrects_the_topic_configuration_nodes_of_an_older_version(zk, zk_client, zk_root) -> None:  # type: ignore[no-untyped-def]
    """An older version created the directory with the first group's ACL (locking other groups
    out) and, without security, the group's node open to all: ensure_tree fixes both."""
    paths = ZkPaths(zk_root)
    first, second = ZkSecurity(zk_root, 0, "group-0-password"), ZkSecurity(zk_root, 1, "group-1-password")
    with kazoo_client(zk.connect_string, **first.client_kwargs()) as group0, kazoo_client(zk.connect_string, **second.client_kwargs()) as group1:
        group0.create(paths.topic_config(0), b"{}", makepath=True)  # the directory gets group 0's ACL
        group0.set_acls(paths.topic_config(0), OPEN_ACL_UNSAFE)
        first.ensure_tree(group0)
        second.ensure_tree(group1)
        group1.create(paths.topic_config(1), b"{}", acl=second.acl_for(paths.topic_config(1)))
    with pytest.raises(NoAuthError):
        zk_client.set(paths.topic_config(0), b"forged")
    with pytest.raises(NoAuthError):
        zk_client.delete(paths.topic_config(1))
