"""The one reader of a broker group's state in ZooKeeper.

A group is ``{root}/brokers/ids/{id}``: the ``master`` and ``slave{k}`` ephemeral nodes
(who is there now), and the persistent ``epoch`` and ``sync_set`` nodes (who led last,
and which slaves hold every acked message). The election, the drill, ``metaq verify``,
``metaq cluster``, the chaos monitor and the client's cluster view all read it here.

Every call is bounded (``timeout``): kazoo's blocking calls wait for a reconnection
forever, and every caller here would rather fail and retry. The functions block: run
them in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from ..errors import MetaqError
from .paths import ZkPaths, decode_epoch, decode_epoch_identity, decode_sync_set, slave_node_id
from .session import ZooKeeperUnreachable, zk_session

#: How long one ZooKeeper call may take.
ZK_CALL_TIMEOUT_S = 5.0


class GroupNotFound(MetaqError):
    """The group is not registered, or has no master right now."""


@dataclass(frozen=True)
class GroupMembers:
    """Who is registered in a group right now."""

    master_url: str | None
    slaves: dict[int, str] = field(default_factory=dict)  # slave id -> url, sorted by id


@dataclass(frozen=True)
class GroupState:
    """What ZooKeeper says about a group's leadership (what an election decides on)."""

    master_url: str | None
    epoch: int
    epoch_version: int  # -1: no epoch node yet (a group that never had a master)
    leader_url: str | None  # the master that took ``epoch``
    sync_set: frozenset[int] | None
    sync_set_epoch: int | None
    leader_identity: str | None = None  # the stable identity of the master that took ``epoch``


def _get(client: KazooClient, path: str, timeout: float | None) -> tuple[bytes, Any] | None:
    """A node's ``(data, stat)``, or None if it does not exist (an ephemeral node may just have gone)."""
    try:
        return client.get_async(path).get(timeout=timeout)
    except NoNodeError:
        return None


def read_members(
    client: KazooClient, paths: ZkPaths, broker_id: int, *,
    timeout: float | None = ZK_CALL_TIMEOUT_S, watch: Callable[..., Any] | None = None,
) -> GroupMembers:
    """The registered master and slaves; NoNodeError if the group was never registered.

    ``watch`` (a kazoo watch function) is set on the group's children, so it fires when a
    master or slave comes or goes.
    """
    base = paths.broker(broker_id)
    children = client.get_children_async(base, watch=watch).get(timeout=timeout)
    master: str | None = None
    slaves: dict[int, str] = {}
    for child in sorted(children):
        slave_id = slave_node_id(child)
        if child != "master" and slave_id is None:
            continue
        found = _get(client, f"{base}/{child}", timeout)
        url = found[0].decode("utf-8", "replace") if found else ""
        if not url:
            continue
        if slave_id is None:
            master = url
        else:
            slaves[slave_id] = url
    return GroupMembers(master, dict(sorted(slaves.items())))


def read_group_state(
    client: KazooClient, paths: ZkPaths, broker_id: int, *, timeout: float | None = ZK_CALL_TIMEOUT_S
) -> GroupState:
    """Master, epoch and sync set; absent nodes are read as "none yet" (never NoNodeError).

    Raises kazoo's errors or a timeout if ZooKeeper is unreachable, ValueError on a
    malformed epoch or sync set value.
    """
    found = _get(client, paths.master(broker_id), timeout)
    master_url = found[0].decode("utf-8") if found else None
    found = _get(client, paths.epoch(broker_id), timeout)
    if found is None:
        epoch, leader, version, identity = 0, None, -1, None
    else:
        (epoch, leader), version = decode_epoch(found[0]), found[1].version
        identity = decode_epoch_identity(found[0])
    found = _get(client, paths.sync_set(broker_id), timeout)
    sync_set, sync_epoch = decode_sync_set(found[0]) if found else (None, None)
    return GroupState(master_url, epoch, version, leader, sync_set, sync_epoch, identity)


def read_live_group(zk_connect: str, zk_root: str, broker_id: int, timeout: float = 10.0) -> GroupMembers:
    """A group with a registered master, read over a short session of its own.

    GroupNotFound if ZooKeeper is unreachable, the group is not registered or has no master.
    """
    paths = ZkPaths(zk_root)
    try:
        with zk_session(zk_connect, timeout) as client:
            members = read_members(client, paths, broker_id, timeout=timeout)
    except ZooKeeperUnreachable as exc:
        raise GroupNotFound(str(exc)) from None
    except NoNodeError:
        raise GroupNotFound(f"no broker {broker_id} in ZooKeeper ({paths.broker(broker_id)} does not exist)") from None
    if members.master_url is None:
        raise GroupNotFound(f"broker {broker_id} has no master registered ({paths.master(broker_id)})")
    return members
