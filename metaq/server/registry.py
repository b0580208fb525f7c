"""The broker's presence in ZooKeeper: its ids node, config checksum and topic nodes.

kazoo is threaded and the broker runs asyncio, so every ZooKeeper call runs on one
worker thread owned by the registry (one thread keeps registration steps in order), and
the ``async`` methods just wait for that worker. Callbacks for the HA layer are delivered
on the broker's event loop.

One idea does all the writing: the registry knows which ephemeral nodes should exist
(``desired``) and which it has created in the current session (``registered``), and
``_sync`` makes ZooKeeper match. Start, topic changes, checksum changes, re-registration
after a session expiry and deregistration are all that one step with different inputs.

With security on (``ZkSecurity``) the session logs in with the group's digest
credentials, ``ensure_tree`` runs once per session (the shared directories and the
group node with their ACLs), and every node is created with the ACL of its kind, its
missing parents too: only the group's brokers can write the group's nodes.

The registry also watches which slaves are registered (``slave_ids``): the master
accepts replication progress only from those (server/handlers.py), and answers their
heartbeats only at the addresses they registered from (``slave_hosts``, ha/heartbeat.py).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.protocol.states import EventType, WatchedEvent
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError

from metaq.addresses import broker_url, parse_broker_url
from metaq.config import TopicConfig, ZkConfig
from metaq.owned_tasks import OwnedTasks
from metaq.zk.acl import ZkSecurity, client_kwargs
from metaq.zk.tls import describe_connect_failure, make_kazoo_client
from metaq.zk.paths import ZkPaths, slave_node_id, topic_node_data

log = logging.getLogger(__name__)

#: How long a stopping broker waits for each ZooKeeper step of its stop (deleting its nodes,
#: closing the session, the callbacks in flight): a slow or unreachable ZooKeeper must not
#: hold a SIGTERM'd broker (docs/operations.md, "Stopping"); what is left undone, the
#: session's close or expiry does.
STOP_ZK_WAIT_S = 3.0

T = TypeVar("T")
MASTER = "master"
# After a failed re-registration (e.g. connection lost half-way), try again this soon.
REREGISTER_RETRY_S = 1.0
# After a run-time registration update ZooKeeper refused otherwise (an ACL, say), try again this soon.
SYNC_RETRY_S = 2.0


#: What the registry is before the HA layer decides a role (it registers no node then).
UNDECIDED = "nothing (role undecided)"


class RegistryError(RuntimeError):
    """ZooKeeper could not be reached or a node could not be registered."""


class RegistrationConflict(RegistryError):
    """Another live session holds one of our nodes (and kept it past the session timeout)."""

    def __init__(self, message: str, paths: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        #: The nodes another session holds.
        self.paths = paths


class SessionMoved(RegistryError):
    """The session changed while a registration step ran: the new session's registration
    (``_register_session``) decides what it holds, not the step that was under way."""


def _validate_role(role: str | int | None) -> str | int | None:
    if role is None or role == MASTER:
        return role
    if isinstance(role, int) and not isinstance(role, bool) and role >= 0:
        return role
    raise ValueError(f"role must be 'master' or a slave id >= 0, got {role!r}")


class BrokerRegistry:
    """Registers one broker (a master, or slave ``k`` of broker ``broker_id``) in ZooKeeper.

    Callbacks (plain functions or coroutine functions, run on the event loop that called
    ``start()``): ``on_session_suspended()`` when the connection drops (the session may
    still be alive), ``on_session_lost()`` when the session expired (our ephemeral nodes
    are gone: a master must stop acking at once), ``on_connected(new_session: bool)``
    when connected again, after re-registration when the session is new.
    """

    def __init__(
        self,
        zk: ZkConfig,
        broker_id: int,
        host: str,
        port: int,
        topics: Callable[[], Mapping[str, TopicConfig]],
        config_checksum: int,
        role: str | int | None = MASTER,
        *,
        paths: ZkPaths | None = None,
        security: ZkSecurity | None = None,
        on_slaves_changed: Callable[[frozenset[int]], Any] | None = None,
    ) -> None:
        self.zk = zk
        self.broker_id = broker_id
        self.host = host
        self.port = port
        #: The role the HA coordinator gave (``set_role``, its one writer; the constructor's
        #: for a registry without one). What is registered follows from it: see ``role``.
        self._assigned = _validate_role(role)
        #: The session in which the master role was registered: the master node is the
        #: election lock of that session, and no other session may take it back by itself.
        self._master_session: int | None = None
        self.paths = paths or ZkPaths(zk.root)
        self.url = broker_url(host, port)
        #: The topic map to register, read at each sync (the broker's ``LiveConfig``: never copied
        #: here); ``publish_topics`` says when it changed. Nothing once deregistering (``_withdrawn``).
        self._topics = topics
        self._withdrawn = False
        self._checksum = config_checksum
        self.security = security
        #: The slave ids registered under our group node now (a ZooKeeper children watch).
        self.slave_ids: frozenset[int] = frozenset()
        #: slave id -> the IP addresses of the host in its registered url (read with slave_ids; None: unreadable).
        self.slave_hosts: dict[int, frozenset[str] | None] = {}
        #: Which ``_watch_slaves`` call is current (one per session): older watches stop themselves.
        self._slaves_watch = 0
        self.on_slaves_changed = on_slaves_changed

        self.on_session_lost: Callable[[], Any] | None = None
        self.on_session_suspended: Callable[[], Any] | None = None
        self.on_connected: Callable[[bool], Any] | None = None

        session_timeout_s = zk.session_timeout_ms / 1000
        self._connect_timeout_s = zk.connection_timeout_ms / 1000
        # A stale node from our previous incarnation disappears at most one session
        # timeout (plus the server's expiry tick) after that process died.
        self._stale_node_wait_s = session_timeout_s + max(2.0, session_timeout_s / 2)
        self._client = make_kazoo_client(
            zk.zk_connect,
            tls=zk.tls,
            timeout=session_timeout_s,
            # Reconnect quickly and forever: a broker must not give up on ZooKeeper.
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=1.5, max_delay=1.0),
            **client_kwargs(security),
        )
        # Retries single operations over connection loss, but lets an expiry through:
        # a new session means a full re-registration, not a retried call.
        self._op_retry = KazooRetry(
            max_tries=-1, delay=0.05, backoff=1.5, max_delay=0.5,
            deadline=self._connect_timeout_s, ignore_expire=False,
        )
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"zk-registry-{broker_id}")
        #: Callbacks of the HA layer that returned a coroutine, run on the event loop (awaited by ``stop``).
        self._callbacks = OwnedTasks(f"registry {broker_id} callbacks")
        self._state_lock = threading.Lock()
        self._registered: dict[str, bytes] = {}
        #: Nodes another live session held past the wait at run time, each with a deletion watch
        #: that tries again: later steps do not wait for them again (``_ensure_ephemeral``).
        self._held_elsewhere: set[str] = set()
        self._registered_session: int | None = None
        #: The session whose nodes ``_registered`` lists (set as its registration starts).
        self._node_session: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._stopping = False

    # --- public properties -----------------------------------------------------------

    @property
    def client(self) -> KazooClient:
        """The registry's kazoo client; other components may share its session."""
        return self._client

    @property
    def role(self) -> str | int | None:
        """What this registry registers: the coordinator's role, except a master role of an
        expired session, which is nothing (its lock died with that session; only a new
        election, and then the coordinator's ``set_role``, makes this broker master again)."""
        if self._assigned == MASTER and self._master_session not in (None, self._node_session):
            return None
        return self._assigned

    @property
    def _registers_master(self) -> bool:
        """Whether our nodes are a master's: what the HA coordinator last set, not the role itself."""
        return self.role == MASTER

    @property
    def slave_id(self) -> int | None:
        return None if self.role is None or self.role == MASTER else int(self.role)

    @property
    def session_id(self) -> int | None:
        client_id = self._client.client_id
        return client_id[0] if client_id else None

    @property
    def connected(self) -> bool:
        return self._client.connected

    @property
    def registered_nodes(self) -> dict[str, bytes]:
        """The ephemeral nodes this registry created in the current session."""
        return dict(self._registered)

    # --- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Connect and register; raises RegistryError if ZooKeeper cannot be reached in time."""
        self._loop = asyncio.get_running_loop()
        self._client.add_listener(self._on_state_change)
        try:
            await self._run(self._client.start, self._connect_timeout_s)
            while True:
                try:
                    await self._run(self._register_session)
                    break
                except SessionMoved:
                    continue  # expired while registering: register the new session from the start
        except KazooTimeoutError:
            await self._run(self._close_client)
            raise RegistryError(await self._run(
                describe_connect_failure, self.zk.zk_connect, f"no session within {self.zk.connection_timeout_ms} ms",
                self.zk.tls, "cannot connect to ZooKeeper")) from None
        except BaseException:
            # Closing the session removes whatever was registered before the failure.
            await self._run(self._close_client)
            raise
        self._started = True
        if self.role is not None:  # else nothing is registered yet: the HA layer's decision says it
            log.info("broker %s registered in ZooKeeper as %s (%s)", self.broker_id, self._role_name(), self.url)

    async def set_role(self, role: str | int | None) -> None:
        """Register as master, as slave ``k``, or (None) as nothing; old-role nodes go first.

        The master node itself is the election lock: the HA coordinator creates it
        in its election transaction, and this only adopts it (it is ours already).
        """
        role = _validate_role(role)
        if role == self.role:
            return
        previous = self._role_name()
        await self._run(self._sync_role_change, role)
        was = "" if previous == UNDECIDED else f" (was {previous})"
        log.info("broker %s is now registered in ZooKeeper as %s%s", self.broker_id, self._role_name(), was)

    def _sync_role_change(self, role: str | int | None) -> None:
        self._assigned = role
        # A master role belongs to the session that registers it (None before any: bound
        # when the first session registers).
        self._master_session = self._node_session if role == MASTER else None
        self._ensure_broker_parent()
        self._sync()

    async def publish_topics(self) -> None:
        """The topic map changed: register what it says now (returns once ZooKeeper has it)."""
        await self._run(self._sync_or_defer)

    async def set_checksum(self, crc: int) -> None:
        with self._state_lock:
            self._checksum = crc
        await self._run(self._sync_or_defer)

    async def stop(self, sync_time_ms: int | None = None) -> None:
        """Delete our nodes, wait ``sync_time_ms`` (default zk.zkSyncTimeMs) so that clients
        move away while we still serve (as MetaQ does), then close the session."""
        if self._stopping:
            return
        self._stopping = True
        try:
            if self._client.connected:
                # Bounded: kazoo's blocking calls wait forever for a ZooKeeper that is gone, and a
                # slow one (seen: 10 s at load 30) must not hold the stop either.
                await asyncio.wait_for(self._run(self._deregister), min(self._connect_timeout_s, STOP_ZK_WAIT_S))
        except (KazooException, asyncio.TimeoutError) as exc:
            # Closing the session below removes the ephemeral nodes anyway (or its expiry does).
            log.warning("deregistering broker %s failed (%r); closing the session instead", self.broker_id, exc)
        delay_ms = self.zk.sync_time_ms if sync_time_ms is None else sync_time_ms
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        # Not on the registry's worker: it may still be stuck in a call that closing ends.
        try:
            await asyncio.wait_for(asyncio.to_thread(self._close_client), STOP_ZK_WAIT_S)
        except asyncio.TimeoutError:
            log.warning("closing the ZooKeeper session of broker %s took over %.0f s; stopping without waiting"
                        " (its nodes go when the session expires)", self.broker_id, STOP_ZK_WAIT_S)
        self._worker.shutdown(wait=False)
        await self._callbacks.stop(min(self._connect_timeout_s, STOP_ZK_WAIT_S))

    # --- what should exist ---------------------------------------------------------------

    def _role_name(self) -> str:
        if self.role is None:
            return UNDECIDED
        return MASTER if self._registers_master else f"slave{self.role}"

    def _desired_nodes(self) -> dict[str, bytes]:
        """Our ephemeral nodes and their data, in registration order: the broker's own node
        first, so that a client that finds a topic node can always resolve the broker."""
        with self._state_lock:
            topics = {} if self._withdrawn else dict(self._topics())
            checksum = self._checksum
        slave_id = self.slave_id
        nodes: dict[str, bytes] = {}
        if self.role is None:
            return nodes
        if self._registers_master:
            nodes[self.paths.master(self.broker_id)] = self.url.encode()
        else:
            nodes[self.paths.slave(self.broker_id, slave_id)] = self.url.encode()
        for name, topic in sorted(topics.items()):
            data = topic_node_data(topic.num_partitions, self.broker_id, slave_id)
            # Only a master takes writes.
            if topic.accept_publish and self._registers_master:
                nodes[self.paths.topic_pub_node(name, self.broker_id)] = data
            if topic.accept_subscribe:
                nodes[self.paths.topic_sub_node(name, self.broker_id, slave_id)] = data
        if self._registers_master:
            # Last, so that its presence means the master is fully registered (and
            # taking writes: the HA coordinator registers a master once it is ready).
            nodes[self.paths.master_config_checksum(self.broker_id)] = str(checksum).encode()
        return nodes

    # --- worker-thread steps (all kazoo calls happen here) -------------------------------

    def _register_session(self, session: int | None = None) -> bool:
        """Register everything if the current session has not been; True if it did."""
        session = session if session is not None else self.session_id
        if session is not None and session == self._registered_session:
            return False
        # Nodes of an expired session are gone: start from nothing.
        if self._assigned == MASTER and self._master_session is None:
            self._master_session = session  # the first session registers the constructor's master role
        self._registered, self._node_session = {}, session
        if self.security is not None:
            # Retried like every call here (ensure_tree is idempotent): a ZooKeeper ensemble
            # still electing at start answered ConnectionLoss and the broker died with a
            # traceback (chaos campaign seed 3029, loaded machine).
            self._retry(self.security.ensure_tree, self._client)
        self._ensure_broker_parent()
        self._watch_slaves()
        try:
            self._sync()
        except RegistrationConflict as exc:
            if not self._started:
                raise  # at start: most likely another broker runs with our id; refuse to start
            self._defer_conflict(exc)
        self._registered_session = session
        return True

    def _watch_slaves(self) -> None:
        """Keep ``slave_ids`` equal to the ``slave{k}`` children of our group node.

        Armed again on every new session: kazoo re-arms a watch across reconnects, but a
        watch whose node was deleted stops for good, and a ZooKeeper that lost its data
        deletes the group node; a master that kept that watch never saw its slaves again
        and refused their replication (403 "not registered"). The group node exists here
        (``_ensure_broker_parent`` ran first); the previous watch stops at its next event.
        """
        self._slaves_watch += 1
        generation = self._slaves_watch

        def update(children: list[str]) -> bool:
            if generation != self._slaves_watch:
                return False  # superseded by a newer session's watch
            ids = frozenset(k for k in map(slave_node_id, children) if k is not None)
            self.slave_hosts = {k: self._registered_hosts(self.paths.slave(self.broker_id, k)) for k in ids}
            self.slave_ids = ids
            self._notify(self.on_slaves_changed, self.slave_ids)
            return True

        self._client.ChildrenWatch(self.paths.broker(self.broker_id), update)

    def _registered_hosts(self, path: str) -> frozenset[str] | None:
        """The IP addresses of the host in the url at ``path`` (kazoo's thread: a blocking read is fine here);
        None when ZooKeeper could not be read (not known, rather than no host)."""
        try:
            host, _port = parse_broker_url(self._client.get(path)[0].decode("utf-8", "replace"))
        except (NoNodeError, ValueError):
            return frozenset()
        except KazooException as exc:
            log.warning("cannot read %s: %s", path, exc)
            return None
        try:
            return frozenset({host} | {str(info[4][0]) for info in socket.getaddrinfo(host, None)})
        except OSError as exc:
            log.warning("cannot resolve %s, registered at %s: %s", host, path, exc)
            return frozenset({host})

    def _ensure_broker_parent(self) -> None:
        parent = self.paths.broker(self.broker_id)
        if self.security is not None:
            self._retry(self.security.ensure_parents, self._client, parent + "/x")
        else:
            self._retry(self._client.ensure_path, parent)
        if self._registers_master:
            # MetaQ writes the master url here too, for clients older than 1.4.
            self._retry(self._client.set, parent, self.url.encode())

    def _sync(self) -> None:
        """Make ZooKeeper hold ``desired``; raises RegistrationConflict for the nodes another
        live session held past the wait, after registering every other one."""
        desired = self._desired_nodes()
        # Withdraw first, in reverse order (topics before the broker node).
        for path in reversed(list(self._registered)):
            if path not in desired:
                self._delete_own(path)
                del self._registered[path]
        conflicts: list[RegistrationConflict] = []
        for path, data in desired.items():
            if self._registered.get(path) != data:
                try:
                    self._ensure_ephemeral(path, data)
                except RegistrationConflict as exc:
                    # One node held by another session must not keep the others (other topics,
                    # the config checksum) from being registered: campaign seed 3048.
                    conflicts.append(exc)
                    continue
                self._registered[path] = data
        # Keep the registration order of `desired` for a later reverse-order withdrawal.
        held = {path for exc in conflicts for path in exc.paths}
        self._registered = {path: desired[path] for path in desired if path not in held}
        if conflicts:
            raise RegistrationConflict("; ".join(str(exc) for exc in conflicts), tuple(sorted(held)))

    def _sync_or_defer(self) -> None:
        """``_sync`` at run time: nothing it meets ends the broker or its caller's step."""
        try:
            self._sync()
        except (ConnectionLoss, SessionExpiredError, OperationTimeoutError, RetryFailedError, SessionMoved) as exc:
            # Not lost: the state is kept, and the next (re)connection applies it.
            log.warning("ZooKeeper unavailable (%s); broker %s registration will be updated on reconnect",
                        type(exc).__name__, self.broker_id)
        except RegistrationConflict as exc:
            # Raising here ended the topic applier's step half-way, and nothing tried again
            # (campaign seed 3048).
            self._defer_conflict(exc)
        except KazooException as exc:
            # Any other refusal: said, and tried again. Raising ended the topic applier's step
            # before its follower was told of the new partitions, and nothing tried again
            # (campaign seed 7104, a BadVersionError ``_ensure_ephemeral`` now reads through).
            log.error("broker %s: updating its registration in ZooKeeper failed (%r); trying again in %.0f s",
                      self.broker_id, exc, SYNC_RETRY_S)
            self._later(SYNC_RETRY_S, self._submit_sync)

    def _later(self, delay_s: float, step: Callable[[], None]) -> None:
        """Submit ``step`` (one that hands its work to the worker) after ``delay_s``."""
        timer = threading.Timer(delay_s, step)
        timer.daemon = True
        timer.start()

    def _defer_conflict(self, exc: RegistrationConflict) -> None:
        """A node another session holds at run time (a deposed master's session that lives on,
        a broker run twice with one id): everything else is registered, and this one is tried
        again when that node goes."""
        fresh = [path for path in exc.paths if path not in self._held_elsewhere]
        if fresh:
            log.error("broker %s: %s; registering it when it is deleted", self.broker_id, exc)
        for path in fresh:
            self._retry_when_deleted(path)

    def _retry_when_deleted(self, path: str) -> None:
        """Run ``_sync_or_defer`` again once ``path`` is gone (at once if it is gone already)."""
        def deleted(event: WatchedEvent) -> None:
            if event.type == EventType.DELETED:
                self._held_elsewhere.discard(path)
                self._submit_sync()

        self._held_elsewhere.add(path)
        try:
            if self._retry(self._client.exists, path, watch=deleted) is None:
                self._held_elsewhere.discard(path)
                self._submit_sync()
        except KazooException:
            self._held_elsewhere.discard(path)  # ZooKeeper away: the reconnection registers everything again

    def _submit_sync(self) -> None:
        if self._stopping:
            return
        try:
            self._worker.submit(self._sync_or_defer)
        except RuntimeError:
            pass  # worker shut down: we are stopping

    def _deregister(self) -> None:
        with self._state_lock:
            self._withdrawn = True
        for path in reversed(list(self._registered)):
            self._delete_own(path)
        self._registered = {}
        if self._registers_master:
            parent = self.paths.broker(self.broker_id)
            try:
                self._retry(self._client.delete, parent)
            except NotEmptyError:
                # Slaves or the epoch node live below: keep the parent, drop the stale url.
                self._retry(self._client.set, parent, b"")
            except NoNodeError:
                pass

    def _ensure_ephemeral(self, path: str, data: bytes) -> None:
        """Create ``path`` as our ephemeral node; if a node of another session (our previous
        incarnation, killed before its session expired) holds it, wait for it to go."""
        deadline: float | None = None
        while not self._stopping:
            current = self.session_id
            if current is not None and current != self._node_session:
                raise SessionMoved(f"the session changed while waiting to register {path}")
            try:
                self._create_ephemeral(path, data)
                return
            except NodeExistsError:
                pass
            try:
                value, stat = self._retry(self._client.get, path)
            except NoNodeError:
                continue  # it just vanished: create it now
            if stat.ephemeralOwner == self.session_id:
                # Ours already (a create retried over connection loss, or a data change).
                if value == data:
                    return
                try:
                    self._retry(self._client.set, path, data, version=stat.version)
                    return
                except (BadVersionError, NoNodeError):
                    # Our node changed under the version read: only this session writes it,
                    # so an earlier write of ours landed after its reply was lost (a set
                    # retried over connection loss lands twice: the retry meets the version
                    # the first made; a write left pending when ZooKeeper lost its quorum is
                    # committed once the quorum is back). Read it again. Raising here ended
                    # the topic applier's step half-way: a slave that never replicated a
                    # partition added meanwhile (campaign seed 7104).
                    continue
            now = time.monotonic()
            if deadline is None and path in self._held_elsewhere:
                deadline = now  # waited for once already; its deletion watch tries again
            if deadline is None:
                deadline = now + self._stale_node_wait_s
                log.warning(
                    "%s is held by session 0x%x (data %r), waiting up to %.1fs for it to expire",
                    path, stat.ephemeralOwner, value, self._stale_node_wait_s,
                )
            if now >= deadline:
                raise RegistrationConflict(
                    f"{path} is still held by session 0x{stat.ephemeralOwner:x} (data {value!r}) "
                    f"after {self._stale_node_wait_s:.1f}s: is another broker running with id {self.broker_id}?",
                    (path,),
                )
            gone = threading.Event()
            if self._retry(self._client.exists, path, watch=lambda event: gone.set()) is not None:
                gone.wait(min(0.5, deadline - now))

    def _create_ephemeral(self, path: str, data: bytes) -> None:
        if self.security is None:
            self._retry(self._client.create, path, data, ephemeral=True, makepath=True)
        else:
            # Each missing parent gets the ACL of its kind (makepath would lock shared ones to us).
            self._retry(self.security.create, self._client, path, data, ephemeral=True)
        stat = self._retry(self._client.exists, path, watch=self._node_event)
        # Invariant: every node this registry's session holds is in ``_registered``. A step
        # decides its nodes for the session it started in (``_node_session``: the role, say,
        # is a master's only in the session that won the election); a create that lands in a
        # newer session would outlive that decision, unlisted, and hold the node against the
        # broker that owns it now. Campaign seed 3048: a deposed master, waiting for a topic
        # node, lost its session, then created the node in its new one as soon as the new
        # master let go of it; the new master could never register that topic again.
        if stat is not None and stat.ephemeralOwner != self._node_session:
            try:
                self._retry(self._client.delete, path, version=stat.version)
            except NoNodeError:
                pass
            raise SessionMoved(f"{path} was created in session 0x{stat.ephemeralOwner:x}, after the session"
                               f" this step registers for (0x{self._node_session or 0:x}) ended; deleted it")

    def _node_event(self, event: WatchedEvent) -> None:
        """One of our nodes was deleted: by us (nothing to do), or by another client (ZooKeeper
        lets any client withdraw an entry of a shared directory). Runs on kazoo's thread, so
        the check runs on the registry's worker, after whatever step deleted it."""
        if event.type != EventType.DELETED or self._stopping:
            return
        try:
            self._worker.submit(self._restore, event.path)
        except RuntimeError:
            pass  # worker shut down: we are stopping

    def _restore(self, path: str) -> None:
        """Register ``path`` again if it is still ours to have and someone else removed it."""
        if self._stopping or path not in self._registered:
            return  # withdrawn by us (the step that deleted it also forgot it)
        if self.session_id is None or self.session_id != self._registered_session:
            # Invariant: only a node deleted while the session that registered it lives is
            # restored. An expired session's nodes are gone with it, and ZooKeeper's deletions
            # of them can reach us late (queued on the old connection of a paused broker): the
            # reconnection registers everything again, with the role it decides (a master's
            # nodes only once the HA coordinator wins an election again).
            return
        try:
            if self._retry(self._client.exists, path) is not None:
                return
        except KazooException:
            return  # ZooKeeper away: the reconnection re-registers everything
        log.warning("%s was deleted by another ZooKeeper client; registering it again", path)
        del self._registered[path]
        self._sync_or_defer()

    def _delete_own(self, path: str) -> None:
        """Delete ``path`` only if this session owns it: never remove another broker's node."""
        try:
            _, stat = self._retry(self._client.get, path)
            if stat.ephemeralOwner == self.session_id:
                self._retry(self._client.delete, path, version=stat.version)
        except NoNodeError:
            pass

    def _close_client(self) -> None:
        self._client.remove_listener(self._on_state_change)
        self._client.stop()
        self._client.close()

    def _retry(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._op_retry.copy()(func, *args, **kwargs)

    # --- session events ------------------------------------------------------------

    def _on_state_change(self, state: str) -> None:
        # Runs on kazoo's connection thread: it must not block, so no ZooKeeper calls here.
        if self._stopping or not self._started:
            return
        if state == KazooState.LOST:
            log.warning("broker %s lost its ZooKeeper session; its nodes are gone", self.broker_id)
            self._notify(self.on_session_lost)
        elif state == KazooState.SUSPENDED:
            log.warning("broker %s lost its ZooKeeper connection; the session may still be alive", self.broker_id)
            self._notify(self.on_session_suspended)
        elif state == KazooState.CONNECTED:
            self._submit_reconnect()

    def _submit_reconnect(self) -> None:
        try:
            self._worker.submit(self._after_reconnect)
        except RuntimeError:
            pass  # worker shut down: we are stopping

    def _after_reconnect(self) -> None:
        if self._stopping:
            return
        # The session is judged once, here. On a flapping link the connection can drop
        # again before this runs; kazoo then reports no session at all, and taking that for
        # a new session dropped the master role and told the coordinator its lock was gone
        # (its own live session still held it: the broker then waited for it forever). No
        # session now: nothing to judge; the next CONNECTED brings us back.
        session = self.session_id
        if session is None:
            return
        try:
            # A master role of the expired session registers nothing in the new one (``role``).
            new_session = self._register_session(session)
            if not new_session:
                # Same session: apply changes that could not be written while disconnected.
                try:
                    self._sync()
                except RegistrationConflict as exc:
                    self._defer_conflict(exc)
        except (KazooException, RegistryError) as exc:
            log.error("re-registering broker %s failed (%s); retrying", self.broker_id, exc)
            self._later(REREGISTER_RETRY_S, self._submit_reconnect)
            return
        if new_session:
            log.info("broker %s re-registered in ZooKeeper with session 0x%x", self.broker_id, self.session_id or 0)
        self._notify(self.on_connected, new_session)

    def _notify(self, callback: Callable[..., Any] | None, *args: Any) -> None:
        loop = self._loop
        if callback is None or loop is None:
            return

        def invoke() -> None:
            result = callback(*args)
            if inspect.isawaitable(result):
                self._callbacks.spawn(result)

        try:
            loop.call_soon_threadsafe(invoke)
        except RuntimeError:
            pass  # the loop is closed: nobody is left to tell

    async def call(self, func: Callable[..., T], *args: Any) -> T:
        """Run a blocking ZooKeeper step on the registry's worker, in order with every other.

        The HA layer's reads, watches and writes (ha/group_view.py, ha/candidacy.py) come
        here too: one thread makes every ZooKeeper call of the broker, so a registration
        step and an election never race each other from two threads. Raises RuntimeError
        once the registry has stopped (the HA layer stops first)."""
        return await self._run(func, *args)

    async def _run(self, func: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, lambda: func(*args))
