"""BrokerRegistry against a real ZooKeeper: the nodes and values of the ZooKeeper layout (docs/zookeeper.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NoAuthError
from kazoo.protocol.states import EventType, KeeperState, WatchedEvent

from metaq.config import TopicConfig, ZkConfig
from metaq.server.registry import BrokerRegistry, RegistrationConflict, RegistryError
from metaq.zk.embedded import EmbeddedZooKeeper, free_port
from metaq.zk.paths import ZkPaths

BROKER_ID = 0
HOST = "127.0.0.1"
PORT = 8123
URL = f"meta://{HOST}:{PORT}"
CHECKSUM = 3735928559

TOPICS = {
    "orders": TopicConfig("orders", num_partitions=2),
    "audit": TopicConfig("audit", num_partitions=1, accept_publish=False),
    "sink": TopicConfig("sink", num_partitions=3, accept_subscribe=False),
}


def zk_config(zk: EmbeddedZooKeeper, root: str, session_timeout_ms: int = 4000) -> ZkConfig:
    return ZkConfig(
        zk_connect=zk.connect_string,
        session_timeout_ms=session_timeout_ms,
        connection_timeout_ms=10000,
        sync_time_ms=0,
        root=root,
    )


class Served:
    """The topic map the registry registers, read at each sync (a broker's ``LiveConfig``)."""

    def __init__(self, topics: dict[str, TopicConfig]) -> None:
        self.topics = dict(topics)

    def __call__(self) -> dict[str, TopicConfig]:
        return self.topics


def make_registry(zk: EmbeddedZooKeeper, root: str, role: str | int = "master", served: Served | None = None,
                  **kwargs: Any) -> BrokerRegistry:
    return BrokerRegistry(zk_config(zk, root, **kwargs), BROKER_ID, HOST, PORT, served or Served(TOPICS), CHECKSUM, role)


async def eventually(predicate: Callable[[], Any], timeout: float = 15.0, message: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message}")
        await asyncio.sleep(0.05)
    return result


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())


def read(client: KazooClient, path: str) -> tuple[bytes, Any]:
    return client.get(path)


def children(client: KazooClient, path: str) -> list[str]:
    """Children of ``path``; [] when the node was never created."""
    return sorted(client.get_children(path)) if client.exists(path) else []


def expire_session(zk: EmbeddedZooKeeper, registry: BrokerRegistry) -> None:
    """The classic trick: a second client joins the session and closes it, which makes
    the server expire it for the first client as well."""
    session_id, password = registry.client.client_id
    intruder = KazooClient(hosts=zk.connect_string, client_id=(session_id, password), timeout=4)
    intruder.start(timeout=10)
    intruder.stop()
    intruder.close()


def test_master_registers_metaq_nodes(zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient) -> None:
    paths = ZkPaths(zk_root)

    async def scenario() -> None:
        registry = make_registry(zk, zk_root)
        await registry.start()
        session = registry.session_id
        try:
            assert read(zk_client, paths.broker(BROKER_ID))[0] == URL.encode()
            data, stat = read(zk_client, paths.master(BROKER_ID))
            assert data == URL.encode() and stat.ephemeralOwner == session
            data, stat = read(zk_client, paths.master_config_checksum(BROKER_ID))
            assert data == b"3735928559" and stat.ephemeralOwner == session

            assert sorted(zk_client.get_children(paths.topics_pub())) == ["orders", "sink"]
            assert sorted(zk_client.get_children(paths.topics_sub())) == ["audit", "orders"]
            data, stat = read(zk_client, paths.topic_pub_node("orders", BROKER_ID))
            assert data == b'{"numParts":2,"broker":"0-m"}' and stat.ephemeralOwner == session
            assert read(zk_client, paths.topic_sub_node("orders", BROKER_ID))[0] == b'{"numParts":2,"broker":"0-m"}'
            assert read(zk_client, paths.topic_sub_node("audit", BROKER_ID))[0] == b'{"numParts":1,"broker":"0-m"}'
            assert read(zk_client, paths.topic_pub_node("sink", BROKER_ID))[0] == b'{"numParts":3,"broker":"0-m"}'
            assert children(zk_client, paths.topics_pub("audit")) == []
            assert children(zk_client, paths.topics_sub("sink")) == []
        finally:
            await registry.stop()

    run(scenario)


def test_slave_registers_without_publish_nodes(zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient) -> None:
    paths = ZkPaths(zk_root)

    async def scenario() -> None:
        registry = make_registry(zk, zk_root, role=1)
        await registry.start()
        try:
            assert zk_client.get_children(paths.broker(BROKER_ID)) == ["slave1"]
            assert read(zk_client, paths.slave(BROKER_ID, 1))[0] == URL.encode()
            # The parent carries the url only for a master.
            assert read(zk_client, paths.broker(BROKER_ID))[0] == b""
            assert zk_client.exists(paths.topics_pub()) is None
            data = read(zk_client, paths.topic_sub_node("orders", BROKER_ID, slave_id=1))[0]
            assert json.loads(data) == {"numParts": 2, "broker": "0-s1"}
            assert zk_client.exists(paths.topic_sub_node("sink", BROKER_ID, slave_id=1)) is None
        finally:
            await registry.stop()

    run(scenario)


def test_stop_deregisters_but_keeps_a_parent_with_children(
    zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient
) -> None:
    paths = ZkPaths(zk_root)

    async def scenario() -> None:
        master = make_registry(zk, zk_root)
        slave = make_registry(zk, zk_root, role=0)
        await master.start()
        await slave.start()
        await master.stop(sync_time_ms=0)
        # The slave still lives below ids/0: the parent stays, without a master url.
        assert zk_client.get_children(paths.broker(BROKER_ID)) == ["slave0"]
        assert read(zk_client, paths.broker(BROKER_ID))[0] == b""
        assert children(zk_client, paths.topics_pub("orders")) == []
        assert children(zk_client, paths.topics_sub("orders")) == ["0-s0"]
        assert not master.client.connected
        await slave.stop(sync_time_ms=0)
        assert zk_client.get_children(paths.broker(BROKER_ID)) == []
        assert children(zk_client, paths.topics_sub("orders")) == []

    run(scenario)


def test_lone_master_stop_removes_its_ids_node(zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient) -> None:
    paths = ZkPaths(zk_root)

    async def scenario() -> None:
        registry = make_registry(zk, zk_root)
        await registry.start()
        started = time.monotonic()
        await registry.stop(sync_time_ms=300)
        # MetaQ's pause after deregistering, so clients can move away first.
        assert time.monotonic() - started >= 0.3
        assert zk_client.exists(paths.broker(BROKER_ID)) is None

    run(scenario)


def test_master_does_not_retake_its_lock_after_session_expiry(zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient) -> None:
    paths = ZkPaths(zk_root)

    async def scenario() -> None:
        registry = make_registry(zk, zk_root)
        events: list[Any] = []
        registry.on_session_lost = lambda: events.append("lost")
        registry.on_session_suspended = lambda: events.append("suspended")

        async def connected(new_session: bool) -> None:  # coroutine callbacks work too
            events.append(("connected", new_session))

        registry.on_connected = connected
        await registry.start()
        try:
            old_session = registry.session_id
            await asyncio.get_running_loop().run_in_executor(None, expire_session, zk, registry)
            await eventually(lambda: ("connected", True) in events, message="re-registration")
            assert "lost" in events
            new_session = registry.session_id
            assert new_session != old_session
            # A master's node was its election lock: after an expiry the registry does
            # not take it back by itself (the HA coordinator must win an election).
            assert registry.role is None
            for path in (
                paths.master(BROKER_ID),
                paths.master_config_checksum(BROKER_ID),
                paths.topic_pub_node("orders", BROKER_ID),
            ):
                assert zk_client.exists(path) is None, path
            await registry.set_role("master")
            for path in (
                paths.master(BROKER_ID),
                paths.master_config_checksum(BROKER_ID),
                paths.topic_pub_node("orders", BROKER_ID),
                paths.topic_sub_node("audit", BROKER_ID),
            ):
                assert read(zk_client, path)[1].ephemeralOwner == new_session, path
        finally:
            await registry.stop()

    run(scenario)


def test_update_topics_and_checksum(zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient) -> None:
    paths = ZkPaths(zk_root)

    async def scenario() -> None:
        served = Served(TOPICS)
        registry = make_registry(zk, zk_root, served=served)
        await registry.start()
        try:
            served.topics = {
                "orders": TopicConfig("orders", num_partitions=5),
                "fresh": TopicConfig("fresh", num_partitions=1),
            }
            await registry.publish_topics()
            assert read(zk_client, paths.topic_pub_node("orders", BROKER_ID))[0] == b'{"numParts":5,"broker":"0-m"}'
            assert read(zk_client, paths.topic_sub_node("fresh", BROKER_ID))[0] == b'{"numParts":1,"broker":"0-m"}'
            assert children(zk_client, paths.topics_sub("audit")) == []
            assert children(zk_client, paths.topics_pub("sink")) == []
            await registry.set_checksum(42)
            assert read(zk_client, paths.master_config_checksum(BROKER_ID))[0] == b"42"
            assert set(registry.registered_nodes) == {
                paths.master(BROKER_ID),
                paths.master_config_checksum(BROKER_ID),
                paths.topic_pub_node("orders", BROKER_ID),
                paths.topic_sub_node("orders", BROKER_ID),
                paths.topic_pub_node("fresh", BROKER_ID),
                paths.topic_sub_node("fresh", BROKER_ID),
            }
        finally:
            await registry.stop()

    run(scenario)


@contextlib.asynccontextmanager
async def first_set_failing(zk: EmbeddedZooKeeper, root: str, served: Served, error: Exception,
                            lands: bool) -> AsyncIterator[tuple[BrokerRegistry, list[str]]]:
    """A started master registry whose first ZooKeeper ``set`` raises ``error``, after writing
    (``lands``: a reply lost) or not (a refusal); yields it and the paths it failed on."""
    registry = make_registry(zk, root, served=served)
    await registry.start()
    real_set = registry.client.set
    failed: list[str] = []

    def set_failing_once(path: str, value: bytes, version: int = -1) -> Any:
        if failed:
            return real_set(path, value, version=version)
        failed.append(path)
        if lands:
            real_set(path, value, version=version)
        raise error

    registry.client.set = set_failing_once  # type: ignore[method-assign]
    try:
        yield registry, failed
    finally:
        registry.client.set = real_set  # type: ignore[method-assign]
        await registry.stop()


def test_a_topic_node_update_whose_first_write_landed_unanswered_is_not_an_error(
    zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient
) -> None:
    """Campaign seed 7104: a slave's topic node update was sent as ZooKeeper lost its quorum;
    the write landed, its reply did not, and the retried version-checked write met the version
    the first had made (BadVersionError). That ended the topic applier's step before the
    follower was told of a partition added meanwhile: never replicated, the slave out of the
    sync set for good. Here the first write lands and its reply is lost (ConnectionLoss), as
    there; the update must still finish, the node holding the new map."""
    paths = ZkPaths(zk_root)

    async def scenario() -> None:
        served = Served(TOPICS)
        async with first_set_failing(zk, zk_root, served, ConnectionLoss(), lands=True) as (registry, failed):
            served.topics = {**TOPICS, "orders": TopicConfig("orders", num_partitions=3)}
            await registry.publish_topics()
            assert failed, "the update wrote no node"
            assert read(zk_client, paths.topic_pub_node("orders", BROKER_ID))[0] == b'{"numParts":3,"broker":"0-m"}'
            assert read(zk_client, paths.topic_sub_node("orders", BROKER_ID))[0] == b'{"numParts":3,"broker":"0-m"}'

    run(scenario)


def test_a_topic_node_update_zookeeper_refuses_once_is_said_and_tried_again(
    zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Any other refusal of a run-time update ends neither the caller's step (the topic
    applier's, which tells the follower of new partitions after it) nor the update: one
    error line, and the update is written again a moment later."""
    paths = ZkPaths(zk_root)

    async def scenario() -> None:
        served = Served(TOPICS)
        async with first_set_failing(zk, zk_root, served, NoAuthError(), lands=False) as (registry, failed):
            served.topics = {**TOPICS, "orders": TopicConfig("orders", num_partitions=4)}
            await registry.publish_topics()  # returns: the caller's step goes on
            assert failed, "the update wrote no node"
            node = paths.topic_pub_node("orders", BROKER_ID)
            await eventually(lambda: read(zk_client, node)[0] == b'{"numParts":4,"broker":"0-m"}',
                             timeout=10, message="the refused update written again")
            errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
            assert len(errors) == 1 and "NoAuthError" in errors[0] and "trying again" in errors[0], errors

    run(scenario)


def test_waits_for_a_stale_node_of_a_previous_incarnation(
    zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient
) -> None:
    """After kill -9 and a quick restart, the old session's master node is still there."""
    paths = ZkPaths(zk_root)
    previous = KazooClient(hosts=zk.connect_string, timeout=4)
    previous.start(timeout=10)
    previous.create(paths.master(BROKER_ID), URL.encode(), ephemeral=True, makepath=True)

    async def scenario() -> None:
        registry = make_registry(zk, zk_root)
        starting = asyncio.create_task(registry.start())
        await asyncio.sleep(1.0)
        assert not starting.done(), "registered over a node another session holds"
        # The previous incarnation's session ends (here: closed; in life: expired).
        await asyncio.get_running_loop().run_in_executor(None, previous.stop)
        await asyncio.wait_for(starting, 10)
        try:
            assert read(zk_client, paths.master(BROKER_ID))[1].ephemeralOwner == registry.session_id
        finally:
            await registry.stop()

    try:
        run(scenario)
    finally:
        previous.stop()
        previous.close()


def test_live_conflicting_node_is_an_error(zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient) -> None:
    paths = ZkPaths(zk_root)
    other = KazooClient(hosts=zk.connect_string, timeout=4)
    other.start(timeout=10)
    other.create(paths.master(BROKER_ID), b"meta://10.0.0.9:8123", ephemeral=True, makepath=True)

    async def scenario() -> None:
        # A 1 s session: the registry gives a live holder 1 s + 2 s before it gives up.
        registry = make_registry(zk, zk_root, session_timeout_ms=1000)
        with pytest.raises(RegistrationConflict, match="another broker"):
            await registry.start()
        assert not registry.client.connected

    try:
        run(scenario)
        assert read(zk_client, paths.master(BROKER_ID))[0] == b"meta://10.0.0.9:8123"
    finally:
        other.stop()
        other.close()


def test_unreachable_zookeeper_is_a_clear_error() -> None:
    config = ZkConfig(zk_connect=f"127.0.0.1:{free_port()}", connection_timeout_ms=500, session_timeout_ms=2000)

    async def scenario() -> None:
        registry = BrokerRegistry(config, BROKER_ID, HOST, PORT, Served(TOPICS), CHECKSUM)
        with pytest.raises(RegistryError, match="cannot connect to ZooKeeper"):
            await registry.start()

    run(scenario)


def test_survives_a_short_zookeeper_stall(tmp_path) -> None:
    """SIGSTOP the server for less than the session timeout: the registry sees a suspended
    connection, then the same session again, and a topic change made meanwhile lands."""
    server = EmbeddedZooKeeper(data_dir=tmp_path / "zk", tick_ms=200).start()
    paths = ZkPaths("/meta")

    async def scenario() -> None:
        served = Served(TOPICS)
        registry = make_registry(server, "/meta", served=served, session_timeout_ms=6000)
        events: list[Any] = []
        registry.on_session_suspended = lambda: events.append("suspended")
        registry.on_session_lost = lambda: events.append("lost")
        registry.on_connected = lambda new_session: events.append(("connected", new_session))
        await registry.start()
        session = registry.session_id
        try:
            server.pause()
            await eventually(lambda: "suspended" in events, message="a suspended connection")
            served.topics = {"later": TopicConfig("later", num_partitions=7)}
            updating = asyncio.create_task(registry.publish_topics())
            await asyncio.sleep(0.5)
            server.resume()
            await asyncio.wait_for(updating, 15)
            await eventually(lambda: ("connected", False) in events, message="the same session again")
            assert "lost" not in events and registry.session_id == session

            def check(client: KazooClient) -> None:
                data, stat = client.get(paths.topic_pub_node("later", BROKER_ID))
                assert data == b'{"numParts":7,"broker":"0-m"}' and stat.ephemeralOwner == session
                assert client.exists(paths.topic_pub_node("orders", BROKER_ID)) is None

            check(registry.client)
        finally:
            server.resume()
            await registry.stop()

    try:
        run(scenario)
    finally:
        server.stop()


def test_a_deletion_seen_late_after_a_session_expiry_restores_nothing(zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient) -> None:
    """Found by the chaos run's topic operations (seed 44). A master paused past its session
    finds, when it runs again, ZooKeeper's deletions of its expired session's nodes queued on
    its old connection: each reads as "deleted by another client, register it again". Handled
    once its new session is up but before the reconnection had dropped the master role, that
    put master nodes (a topic's ``topics-sub/T/0-m``) back under the new session of a broker
    that no longer led, where they stayed while it followed, so the real master could not
    register them. Here the worker is held while the late deletion event and the expiry
    arrive, in that order, as on the paused broker."""
    paths = ZkPaths(zk_root)
    audit = paths.topic_sub_node("audit", BROKER_ID)

    async def scenario() -> None:
        registry = make_registry(zk, zk_root)
        await registry.start()
        try:
            old_session = registry.session_id
            hold = threading.Event()
            registry._worker.submit(hold.wait, 30)  # the broker is not running yet (SIGSTOP)
            registry._node_event(WatchedEvent(EventType.DELETED, KeeperState.CONNECTED, audit))
            await asyncio.get_running_loop().run_in_executor(None, expire_session, zk, registry)
            await eventually(lambda: registry.session_id not in (None, old_session), message="a new session")
            hold.set()
            await eventually(lambda: registry.role is None and zk_client.exists(paths.master(BROKER_ID)) is None,
                             message="the reconnection dropping the master role")
            await asyncio.sleep(0.5)
            assert zk_client.exists(audit) is None, "a broker that no longer leads registered a topic as master"
        finally:
            await registry.stop()

    run(scenario)


def test_a_connection_loss_while_securing_the_tree_at_start_is_retried(zk: EmbeddedZooKeeper, zk_root: str) -> None:
    """Chaos campaign seed 3029: with security on, a ConnectionLoss from an ensemble still
    electing (the request done, its answer lost) ended the broker's start with a traceback.
    Securing the tree is retried like every registration call, and it is idempotent."""
    from kazoo.exceptions import ConnectionLoss

    from metaq.zk.acl import ZkSecurity

    calls: list[int] = []

    class AnswerLostOnce(ZkSecurity):
        def ensure_tree(self, client: KazooClient) -> None:
            calls.append(1)
            super().ensure_tree(client)
            if len(calls) == 1:
                raise ConnectionLoss()

    security = AnswerLostOnce(zk_root, BROKER_ID, "group-0-password")

    async def scenario() -> None:
        registry = BrokerRegistry(zk_config(zk, zk_root), BROKER_ID, HOST, PORT, Served(TOPICS), CHECKSUM, "master", security=security)
        await registry.start()
        try:
            assert len(calls) == 2
            assert registry.client.exists(ZkPaths(zk_root).topic_pub_node("orders", BROKER_ID)) is not None
        finally:
            await registry.stop()

    run(scenario)


#: TOPICS and one more, whose publish node another session holds in the tests below.
WITH_FRESH = {**TOPICS, "fresh": TopicConfig("fresh", num_partitions=1)}


@pytest.fixture
def held_by_another_session(zk: EmbeddedZooKeeper, zk_root: str) -> Iterator[tuple[str, KazooClient]]:
    """``topics-pub/fresh/0-m`` held by another live session (a deposed master's, or a second
    broker with our id): (that path, the other session's client, to stop when it lets go)."""
    path = ZkPaths(zk_root).topic_pub_node("fresh", BROKER_ID)
    other = KazooClient(hosts=zk.connect_string, timeout=4)
    other.start(timeout=10)
    other.create(path, b'{"numParts":1,"broker":"0-m"}', ephemeral=True, makepath=True)
    try:
        yield path, other
    finally:
        other.stop()
        other.close()


def test_a_topic_node_held_by_another_session_at_run_time_is_registered_once_it_goes(
    zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient, held_by_another_session: tuple[str, KazooClient]
) -> None:
    """Campaign seed 3048: a topic's node held past the wait by another live session ended the
    topic change half-way (the caller got RegistrationConflict, the nodes after it were never
    written) and nothing tried again once it was gone. Now the rest is registered and that
    node is taken as soon as its holder lets go."""
    paths = ZkPaths(zk_root)
    fresh_pub, other = held_by_another_session

    async def scenario() -> None:
        served = Served(TOPICS)
        registry = make_registry(zk, zk_root, served=served, session_timeout_ms=1000)
        await registry.start()
        try:
            await registry.set_checksum(7)
            served.topics = WITH_FRESH
            await registry.publish_topics()  # raised before
            assert read(zk_client, paths.topic_sub_node("fresh", BROKER_ID))[1].ephemeralOwner == registry.session_id
            assert read(zk_client, paths.master_config_checksum(BROKER_ID))[0] == b"7"
            assert fresh_pub not in registry.registered_nodes
            await asyncio.get_running_loop().run_in_executor(None, other.stop)
            await eventually(lambda: fresh_pub in registry.registered_nodes, timeout=10,
                             message="the freed topic node registered by its broker")
            assert read(zk_client, fresh_pub)[1].ephemeralOwner == registry.session_id
        finally:
            await registry.stop()

    run(scenario)


def test_a_node_is_never_created_for_a_session_other_than_the_one_its_step_registers(
    zk: EmbeddedZooKeeper, zk_root: str, zk_client: KazooClient, held_by_another_session: tuple[str, KazooClient]
) -> None:
    """Campaign seed 3048: a master waiting for a topic node another session held lost its
    session; when the holder let go, it created the node in its new session, in which it was
    no master, and forgot it (a new session starts from nothing). The node stayed for the
    rest of the run and the real master could never register that topic."""
    paths = ZkPaths(zk_root)
    fresh_pub, other = held_by_another_session

    async def scenario() -> None:
        served = Served(TOPICS)
        registry = make_registry(zk, zk_root, served=served, session_timeout_ms=1000)
        events: list[Any] = []
        registry.on_connected = lambda new_session: events.append(("connected", new_session))
        await registry.start()
        try:
            old_session = registry.session_id
            # As on the deposed master: the topic change is queued on the registry's worker
            # before the expiry, and runs once the new session is up, before its registration.
            hold = threading.Event()
            registry._worker.submit(hold.wait, 30)
            served.topics = WITH_FRESH
            change = asyncio.ensure_future(registry.publish_topics())
            await asyncio.sleep(0.1)
            await asyncio.get_running_loop().run_in_executor(None, expire_session, zk, registry)
            await eventually(lambda: registry.session_id not in (None, old_session), message="a new session")
            hold.set()
            await asyncio.sleep(0.5)
            await asyncio.get_running_loop().run_in_executor(None, other.stop)  # the holder lets go
            await asyncio.wait_for(change, 10)
            await eventually(lambda: ("connected", True) in events, message="the new session's registration")
            await asyncio.sleep(0.3)
            assert registry.role is None  # the master role was the expired session's
            stat = zk_client.exists(fresh_pub)
            assert stat is None, f"{fresh_pub} held by session 0x{stat.ephemeralOwner:x} of a broker that no longer leads"
        finally:
            await registry.stop()

    run(scenario)
