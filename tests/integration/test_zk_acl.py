"""ZooKeeper digest auth and ACLs against a real ZooKeeper server.

A group's nodes, created with the group's ACL, can be read by anyone but changed, deleted
or added to only by a client holding the group's digest credentials.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, make_acl, make_digest_acl

from metaq.zk.acl import ZkAclError, ZkSecurity, digest_user, super_digest
from metaq.zk.embedded import EmbeddedZooKeeper
from metaq.zk.paths import ZkPaths
from metaq.zk.session import zk_session
from tests.harness import kazoo_client


def connected(server: EmbeddedZooKeeper, **kwargs) -> "contextlib.AbstractContextManager[KazooClient]":  # type: ignore[no-untyped-def]
    return kazoo_client(server.connect_string, **kwargs)


@pytest.fixture
def clients(zk: EmbeddedZooKeeper, zk_root: str) -> Iterator[tuple[ZkSecurity, KazooClient, KazooClient]]:
    """(group 0's security, a client logged in as group 0, an anonymous client)."""
    security = ZkSecurity(zk_root, 0, "group-0-password")
    with connected(zk, **security.client_kwargs()) as broker, connected(zk) as anonymous:
        yield security, broker, anonymous


def build_group(security: ZkSecurity, client: KazooClient) -> ZkPaths:
    paths = security.paths
    security.ensure_tree(client)
    security.create(client, paths.epoch(0), b"1")
    security.create(client, paths.sync_set(0), b"[1]")
    security.create(client, paths.master(0), b"meta://127.0.0.1:1", ephemeral=True)
    security.create(client, paths.topic_pub_node("orders", 0), b'{"numParts":1}', ephemeral=True)
    return paths


def test_group_nodes_are_readable_by_anyone_and_writable_only_by_the_group(clients) -> None:  # type: ignore[no-untyped-def]
    security, broker, anonymous = clients
    paths = build_group(security, broker)
    protected = [paths.epoch(0), paths.sync_set(0), paths.master(0), paths.topic_pub_node("orders", 0), paths.broker(0)]
    for path in protected:
        assert anonymous.get(path)[1] is not None  # reading works
        with pytest.raises(NoAuthError):
            anonymous.set(path, b"forged")
    for path in (paths.epoch(0), paths.sync_set(0), paths.master(0)):
        with pytest.raises(NoAuthError):
            anonymous.delete(path)
    with pytest.raises(NoAuthError):
        anonymous.create(paths.slave(0, 99), b"phantom", ephemeral=True)
    assert anonymous.get(paths.epoch(0))[0] == b"1"
    # The known limit: DELETE is granted per parent, and every group must be able to withdraw
    # its own registration from a shared topic directory, so anyone can withdraw one.
    anonymous.delete(paths.topic_pub_node("orders", 0))
    # The group itself can change and delete its nodes.
    broker.set(paths.sync_set(0), b"[]")
    broker.delete(paths.master(0))


def test_a_broker_of_another_group_cannot_touch_this_group(zk: EmbeddedZooKeeper, clients) -> None:  # type: ignore[no-untyped-def]
    security, broker, _ = clients
    paths = build_group(security, broker)
    other_security = ZkSecurity(security.root, 1, "group-1-password")
    with connected(zk, **other_security.client_kwargs()) as other:
        with pytest.raises(NoAuthError):
            other.set(paths.epoch(0), b"99")
        with pytest.raises(NoAuthError):
            other.delete(paths.master(0))
        # ... but shares the directories: it registers the same topic and its own group.
        other_security.ensure_tree(other)
        other_security.create(other, paths.topic_pub_node("orders", 1), b"{}", ephemeral=True)
        assert sorted(other.get_children(paths.topics_pub("orders"))) == ["0-m", "1-m"]
        with pytest.raises(NoAuthError):
            broker.set(paths.topic_pub_node("orders", 1), b"x")


def test_a_wrong_password_gives_no_rights(zk: EmbeddedZooKeeper, clients) -> None:  # type: ignore[no-untyped-def]
    security, broker, _ = clients
    paths = build_group(security, broker)
    with connected(zk, auth_data=[("digest", f"{digest_user(0)}:guessed")]) as impostor:
        with pytest.raises(NoAuthError):
            impostor.set(paths.epoch(0), b"99")


def test_consumers_write_only_under_consumers(clients) -> None:  # type: ignore[no-untyped-def]
    security, broker, anonymous = clients
    paths = build_group(security, broker)
    offset = paths.offset("g", "orders", "0-0")
    anonymous.create(offset, b"-1-0", makepath=True)
    anonymous.set(offset, b"-1-10")
    assert anonymous.get(offset)[0] == b"-1-10"
    with pytest.raises(NoAuthError):
        anonymous.create(paths.broker(0) + "/mine", b"")


def test_open_nodes_from_before_security_are_tightened(clients) -> None:  # type: ignore[no-untyped-def]
    security, broker, anonymous = clients
    paths = security.paths
    # What a broker without security left behind: world-writable nodes.
    anonymous.create(paths.epoch(0), b"3", makepath=True, acl=OPEN_ACL_UNSAFE)
    security.ensure_tree(broker)
    assert broker.get_acls(paths.epoch(0))[0] == security.acl_for(paths.epoch(0))
    assert broker.get_acls(paths.broker(0))[0] == security.acl_for(paths.broker(0))
    with pytest.raises(NoAuthError):
        anonymous.set(paths.epoch(0), b"4")


def test_a_squatted_group_node_is_refused_with_one_line(zk: EmbeddedZooKeeper, clients) -> None:  # type: ignore[no-untyped-def]
    security, broker, _ = clients
    locked = [make_digest_acl("mallory", "pw", all=True)]
    readable = [make_digest_acl("mallory", "pw", all=True), make_acl("world", "anyone", read=True)]
    with connected(zk, auth_data=[("digest", "mallory:pw")]) as squatter:
        security.ensure_parents(broker, security.paths.broker(0))  # the shared directories exist
        squatter.create(security.paths.broker(0), b"", acl=readable)
        with pytest.raises(ZkAclError, match=r"locked by someone else .*digest:mallory=31, world:anyone=1"):
            security.ensure_tree(broker)
        squatter.set_acls(security.paths.broker(0), locked)
        with pytest.raises(ZkAclError, match=r"locked by someone else .*not readable"):
            security.ensure_tree(broker)
        # A squatted directory: this group cannot create below it.
        squatter.create(security.paths.consumer_group("g"), b"", acl=locked)
        with pytest.raises(ZkAclError, match=r"cannot create ZooKeeper node .*/consumers/g/ids: .*not readable"):
            security.ensure_parents(broker, security.paths.consumer_ids("g") + "/x")


def test_zk_session_logs_in_with_the_group_credentials(zk: EmbeddedZooKeeper, clients) -> None:  # type: ignore[no-untyped-def]
    security, broker, _ = clients
    paths = build_group(security, broker)
    with zk_session(zk.connect_string, security=security) as client:
        client.set(paths.epoch(0), b"2")
        client.create(paths.slave(0, 1), b"x", ephemeral=True)  # default ACL: the group's
        assert client.get_acls(paths.slave(0, 1))[0] == security.acl_for(paths.slave(0, 1))
    with zk_session(zk.connect_string) as client:
        with pytest.raises(NoAuthError):
            client.set(paths.epoch(0), b"3")


def test_super_digest_admin_can_clean_up_a_locked_node(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedZooKeeper(data_dir=tmp_path / "zk", tick_ms=200, super_digest=super_digest("admin-pw")) as server:
        security = ZkSecurity("/meta", 0, "pw")
        with (
            connected(server, **security.client_kwargs()) as broker,
            connected(server, auth_data=[("digest", "super:admin-pw")]) as admin,
            connected(server) as anonymous,
        ):
            build_group(security, broker)
            with pytest.raises(NoAuthError):
                anonymous.delete(security.paths.epoch(0))
            admin.delete(security.paths.epoch(0))
            assert anonymous.exists(security.paths.epoch(0)) is None

