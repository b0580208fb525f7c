"""metaq/zk/group.py against a real ZooKeeper: the one reader of a broker group's state."""

from __future__ import annotations

import threading

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from metaq.zk.group import GroupMembers, GroupNotFound, read_group_state, read_live_group, read_members
from metaq.zk.paths import ZkPaths, encode_epoch, encode_sync_set


def test_members_of_a_group(zk_client: KazooClient, zk_root: str) -> None:
    paths = ZkPaths(zk_root)
    zk_client.create(paths.master(0), b"meta://127.0.0.1:1", makepath=True, ephemeral=True)
    zk_client.create(paths.slave(0, 2), b"meta://127.0.0.1:3", ephemeral=True)
    zk_client.create(paths.slave(0, 1), b"meta://127.0.0.1:2", ephemeral=True)
    zk_client.create(paths.epoch(0), encode_epoch(4, "meta://127.0.0.1:1"))
    members = read_members(zk_client, paths, 0)
    assert members == GroupMembers("meta://127.0.0.1:1", {1: "meta://127.0.0.1:2", 2: "meta://127.0.0.1:3"})
    assert list(members.slaves) == [1, 2]


def test_unregistered_group_raises_no_node(zk_client: KazooClient, zk_root: str) -> None:
    with pytest.raises(NoNodeError):
        read_members(zk_client, ZkPaths(zk_root), 7)


def test_watch_fires_when_a_slave_leaves(zk_client: KazooClient, zk_root: str) -> None:
    paths = ZkPaths(zk_root)
    zk_client.create(paths.slave(0, 1), b"meta://127.0.0.1:2", makepath=True, ephemeral=True)
    fired = threading.Event()
    assert read_members(zk_client, paths, 0, watch=lambda *_: fired.set()).slaves == {1: "meta://127.0.0.1:2"}
    zk_client.delete(paths.slave(0, 1))
    assert fired.wait(5)


def test_state_of_a_group_that_never_had_a_master(zk_client: KazooClient, zk_root: str) -> None:
    state = read_group_state(zk_client, ZkPaths(zk_root), 0)
    assert (state.master_url, state.epoch, state.epoch_version, state.leader_url, state.sync_set) == (None, 0, -1, None, None)


def test_state_reads_epoch_leader_and_sync_set(zk_client: KazooClient, zk_root: str) -> None:
    paths = ZkPaths(zk_root)
    zk_client.create(paths.epoch(0), encode_epoch(3, "meta://h:1"), makepath=True)
    zk_client.create(paths.sync_set(0), encode_sync_set(frozenset({2, 1}), 3, 1))
    state = read_group_state(zk_client, paths, 0)
    assert (state.epoch, state.epoch_version, state.leader_url) == (3, 0, "meta://h:1")
    assert (state.sync_set, state.sync_set_epoch) == (frozenset({1, 2}), 3)


def test_malformed_epoch_is_a_value_error(zk_client: KazooClient, zk_root: str) -> None:
    paths = ZkPaths(zk_root)
    zk_client.create(paths.epoch(0), b"{not json", makepath=True)
    with pytest.raises(ValueError, match="bad epoch node value"):
        read_group_state(zk_client, paths, 0)


def test_live_group_needs_a_master(zk, zk_client: KazooClient, zk_root: str) -> None:  # type: ignore[no-untyped-def]
    paths = ZkPaths(zk_root)
    with pytest.raises(GroupNotFound, match="no broker 0"):
        read_live_group(zk.connect_string, zk_root, 0, timeout=5)
    zk_client.create(paths.slave(0, 1), b"meta://127.0.0.1:2", makepath=True, ephemeral=True)
    with pytest.raises(GroupNotFound, match="no master registered"):
        read_live_group(zk.connect_string, zk_root, 0, timeout=5)
    zk_client.create(paths.master(0), b"meta://127.0.0.1:1", ephemeral=True)
    assert read_live_group(zk.connect_string, zk_root, 0, timeout=5).master_url == "meta://127.0.0.1:1"
