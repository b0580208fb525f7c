"""A master node held by a broker's live session is acted on or given back, never waited for.

Found by the chaos campaign (seed 3002, sync, 2 slaves, 3 ZooKeeper nodes): a slave's
session expired and was replaced at once; its election on the new session took the master
lock, but the expiry's SESSION_LOST, queued meanwhile, moved ELECTING to ORPHANED and the
WON behind it was ignored. The broker then logged "the master node still names this broker
... waiting for it to go" for the rest of the run: its own live session's node never goes,
and the group had no master (no write acked for 500 s). Real ZooKeeper, the coordinator's
own ``_evaluate`` (metaq/ha/coordinator.py, leadership.py : give_back_unused_lock).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from kazoo.client import KazooClient

from metaq.ha.coordinator import HaCoordinator
from metaq.ha.progress import ReplicationProgress
from metaq.ha.role import Role
from metaq.zk.embedded import EmbeddedZooKeeper
from metaq.zk.paths import ZkPaths

MY_URL = "meta://127.0.0.1:9001"


def member(client: KazooClient, zk_root: str, state: Role) -> HaCoordinator:
    config = SimpleNamespace(broker_id=0, zk=SimpleNamespace(root=zk_root))
    # The registry's ordered worker (BrokerRegistry.call), as a thread per call: one caller here.
    registry = SimpleNamespace(client=client, url=MY_URL, session_id=client.client_id[0],
                               call=lambda func, *args: asyncio.to_thread(func, *args))
    coordinator = HaCoordinator(SimpleNamespace(config=config, registry=registry), None,  # type: ignore[arg-type]
                                ReplicationProgress())
    coordinator.machine.state = state
    return coordinator


def master_node(client: KazooClient, zk_root: str) -> str:
    path = ZkPaths(zk_root).master(0)
    client.ensure_path(path.rsplit("/", 1)[0])
    client.create(path, MY_URL.encode(), ephemeral=True)
    return path


@pytest.mark.parametrize("state", [Role.ORPHANED, Role.FOLLOWING, Role.RESIGNED])
def test_a_lock_this_session_holds_while_not_leading_is_given_back(zk_client: KazooClient, zk_root: str,
                                                                   state: Role) -> None:
    path = master_node(zk_client, zk_root)
    coordinator = member(zk_client, zk_root, state)
    asyncio.run(coordinator._evaluate())
    assert zk_client.exists(path) is None, f"{state.value}: the node of our own live session must be given back"


def test_a_lock_held_while_electing_is_kept_for_the_won_that_may_be_queued(zk_client: KazooClient,
                                                                         zk_root: str) -> None:
    path = master_node(zk_client, zk_root)
    asyncio.run(member(zk_client, zk_root, Role.ELECTING)._evaluate())
    assert zk_client.exists(path) is not None


def test_a_node_of_a_previous_session_is_waited_for_not_deleted(zk: EmbeddedZooKeeper, zk_client: KazooClient,
                                                                 zk_root: str) -> None:
    path = master_node(zk_client, zk_root)  # the "previous life": another session
    other = KazooClient(hosts=zk.connect_string, timeout=5)
    other.start(timeout=5)
    try:
        asyncio.run(member(other, zk_root, Role.ORPHANED)._evaluate())
        assert zk_client.exists(path) is not None, "another session's node goes only with that session"
    finally:
        other.stop()
        other.close()
