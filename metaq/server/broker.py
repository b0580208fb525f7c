"""The broker process: store, protocol server and ZooKeeper presence, tied together.

The broker is the composition root: it builds the store, the request handlers,
the heartbeat responder, the ZooKeeper registry and the HA facade (metaq.ha.node)
and wires them; it keeps no HA state of its own. The HA layer sees it only
through ``metaq.ha.host.BrokerHost`` (config, store, registry, ``notify``,
``update_topics``).

Lifecycle: open the logs (recovering torn tails) -> seed the msg-id generator
above every id already stored -> listen -> register in ZooKeeper -> take part
in HA (puts are accepted from here). Stop runs the other way: leave HA,
deregister (clients move away), stop listening, then flush and close the logs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
from typing import Any, Awaitable, Callable

from .. import __version__
from ..addresses import parse_host_port
from ..config import BrokerConfig, ConfigError, SlaveConfig, TopicConfig, topic_settings
from ..ha.heartbeat import HeartbeatResponder
from ..ha.joining import check_join
from ..ha.node import HaNode
from ..ha.repair import repair_from_slaves
from ..owned_tasks import OwnedTasks
from ..security.settings import load_broker_security
from ..store.datadirs import broker_identity, check_data_dirs
from ..store.manager import MessageStoreManager
from ..store.msgid import MsgIdGenerator
from ..store.refused import RefusedLog
from ..store.scrub import Scrubber
from ..store.timeindex import REBUILDS as time_index_rebuilds
from ..topic_change import TopicChange
from ..zk.data_loss import reconnect_after_data_loss
from ..zk.monitor import OutageReporter
from .admission import ConnectionSlots, RequestBudget
from .authz import Authz
from .connection import ClientConnection, ConnectionLimits
from .group_topics import GroupTopicsApplier, forget_partitions
from .handlers import RequestHandlers
from .metrics import BrokerMetrics, InstrumentedHandlers
from .metrics import metrics_login as metrics_login_of
from . import open_files
from .registry import BrokerRegistry
from .replica_health import ReplicaCoverage
from .live_config import LiveConfig
from .reload import apply_logging, follow_logging, reload_config
from .stats import BrokerStats
from .partitions import Partitions
from .producer_ids import RESEED_SKIP, ProducerIdAllocator, highest_counter_in, local_blocks, raise_zookeeper_counter, zookeeper_blocks
from .transactional_ids import LocalMapping, MappingStore, TransactionalIds, ZooKeeperMapping
from .transactions import TransactionService
from .waiters import EndWaiters

log = logging.getLogger(__name__)

#: After a SIGTERM'd broker stopped (logs flushed and closed), how long its worker threads
#: (``asyncio.to_thread`` calls: a scrub read, a ZooKeeper call) may take to return before
#: the process exits without them. Without a bound the interpreter's exit waits for each.
STOP_THREADS_GRACE_S = 3.0
#: How long a SIGHUP reload in progress may take to finish when the broker stops (then cancelled).
RELOAD_STOP_GRACE_S = 5.0


class Broker:
    def __init__(self, config: BrokerConfig, slave: SlaveConfig | None = None, register_in_zk: bool | None = None) -> None:
        #: The configuration's one owner: a reload and ``update_topics`` swap it, readers take ``config``.
        self.live_config = LiveConfig(config)
        self.live_config.subscribe(follow_logging)
        self.slave = slave
        self.register_in_zk = config.zk.enabled if register_in_zk is None else register_in_zk
        # Shared by every connection: what they may hold together (admission.py).
        self.slots = ConnectionSlots(config.max_connections, config.max_connections_per_address)
        self.request_budget = RequestBudget(config.max_buffered_request_bytes)
        # Read every security file now: a wrong one stops the broker before it listens.
        self.security = load_broker_security(config)
        #: Every authorization decision (connections, handlers, the transaction coordinator).
        self.authz = Authz(self.security)
        #: The topic map is LiveConfig's: the store reads it from there and applies each change.
        self.store = MessageStoreManager(self._served_topics, config.max_message_size)
        #: Re-verifies sealed segments' CRCs; what it finds is never served (metaq/store/scrub.py).
        self.scrubber = Scrubber(self.store.logs, config.scrub_interval_ms, config.scrub_bytes_per_second)
        self.scrubber.on_corrupt = self._repair_corrupt
        self._repairs: dict[tuple[str, int, int, int], asyncio.Task[bool]] = {}
        #: Every partition's one owner: its log's appends and truncations, epoch history, transaction state.
        self.partitions = Partitions(
            self.store, leader=self, max_batches=config.txn.producer_state_max_batches, expiry_ms=config.txn.producer_expiry_ms
        )
        #: The broker's counters; each partition's are held by its owner (``Partition.counters``).
        self.stats = BrokerStats(self.partitions)
        #: Long-polls: each partition's parked fetches are held by its owner (``Partition.parked``).
        self.waiters = EndWaiters(self.partitions)
        #: Local and XA transactions: the coordinator, its journal, markers and timeouts.
        self.transactions = TransactionService(self)
        #: Ids for idempotent producers (``init_producer``); set in start.
        self.producer_ids: ProducerIdAllocator | None = None
        #: Transactional id -> (producer id, epoch) (``init_producer`` with a name); set in start.
        self.transactional_ids: TransactionalIds | None = None
        self.ha = HaNode(self, slave, in_zookeeper=self.register_in_zk)
        self.handlers = RequestHandlers(self)
        self.ids: MsgIdGenerator | None = None
        self.group_topics: GroupTopicsApplier | None = None
        self.metrics: BrokerMetrics | None = None
        self.registry: BrokerRegistry | None = None
        self.heartbeats: HeartbeatResponder | None = None  # UDP, same port as TCP
        self._server: asyncio.AbstractServer | None = None
        self._stopped = asyncio.Event()
        self._tls_reload: asyncio.Future[None] | None = None
        #: SIGHUP reloads in progress (each awaited by ``stop``).
        self._reloads = OwnedTasks("SIGHUP reload")
        #: Which served partitions each registered slave does not replicate (a master's check).
        self.replica_coverage = ReplicaCoverage(self)
        self.live_config.on_topic_change(self._apply_topic_change)

    def _repair_corrupt(self, topic: str, partition: int, start: int, end: int) -> None:
        """A master puts a corrupt range back from its slaves (a slave's replica re-fetches its own)."""
        key = (topic, partition, start, end)
        if not self.ha.acting_master:
            follower = self.ha.follower
            if follower is not None:
                follower.corruption_found(topic, partition)  # a quiet replica fetches (and cuts) now
            return
        if self.registry is None or key in self._repairs:
            return
        task = asyncio.get_running_loop().create_task(repair_from_slaves(self, topic, partition, start, end))
        self._repairs[key] = task
        task.add_done_callback(lambda _task: self._repairs.pop(key, None))

    # --- what the HA layer and the handlers use ---------------------------------------

    @property
    def config(self) -> BrokerConfig:
        """The configuration now (read it each time: a reload or a topic change replaces it)."""
        return self.live_config.current

    def topic_config(self, topic: str) -> TopicConfig | None:
        return self.live_config.current.topics.get(topic)  # ``config``, without its property (asked per request)

    @property
    def local_topics(self) -> dict[str, TopicConfig]:
        """The topic sections of server.ini as last loaded (the group's configuration may differ;
        one writer: ``LiveConfig``)."""
        return self.live_config.local_topics

    def notify(self, topic: str, partition: int) -> None:
        """A partition's log end, flushed end or committed offset moved: wake parked fetches."""
        self.waiters.notify(topic, partition)

    def notify_committed(self, topic: str, partition: int) -> None:
        """Only a partition's committed offset or flushed end moved: wake the fetches that wait
        for it (consumers'; a slave's fetch waits for the log end), and tell streaming slaves."""
        self.waiters.notify_committed(topic, partition)
        if self.ha.streams:
            self.ha.streams.committed_moved((topic, partition))

    def _committed_of(self, key: tuple[str, int]) -> int | None:
        log = self.store.open_log(*key)
        return None if log is None or isinstance(log, RefusedLog) else self.ha.committed(key[0], key[1], log)

    def watch(self, topic: str, partition: int, woken: Callable[[], None]) -> Callable[[], None]:
        """Call ``woken()`` once at the partition's next notify of either kind (a slave's quiet
        partition, metaq/ha/news.py: it needs both its bytes and the committed offset)."""
        return self.waiters.watch(topic, partition, woken, on_commit=True)

    def _served_topics(self) -> dict[str, TopicConfig]:
        """The topic map served now (the store and the registry read it here, never a copy)."""
        return self.live_config.current.topics

    async def update_topics(self, topics: dict[str, TopicConfig]) -> None:
        """Adopt a new topic map (a slave learning its master's topics, a reload, the group's
        topic configuration): checked, published by ``LiveConfig`` as one ``TopicChange`` that
        every owner applies (``_apply_topic_change``), then registered in ZooKeeper."""
        if self.group_topics is not None:
            topics = self.group_topics.overlay(topics)  # the group's configuration wins
        if topics == self.config.topics:
            return
        self._check_open_files(topics)
        change = self.live_config.set_topics(topics)
        # Last: a client finds a topic's node only once every owner serves it (and a removed
        # topic's nodes go once nothing serves it any more).
        if self.registry is not None:
            await self.registry.publish_topics()
        if change.added and (self.group_topics is None or not self.group_topics.group.exists):
            log.info("now serving topics %s", ", ".join(sorted(change.added)))  # else the applier says what changed

    def _apply_topic_change(self, change: TopicChange) -> None:
        """Every owner of per-topic state applies ``change`` (LiveConfig's one topic applier), in
        one step with no ``await``, in this order, each step needing the one before:

        1. the store (``apply_topic_change``): partitions no longer served leave its map and
           their directories move aside (a re-created topic then opens empty in their place);
           altered topics' segment and flush settings and every retention schedule follow;
        2. only then, the dropped partitions' other owners forget them (``forget_partitions``:
           their owner ``Partitions``, which takes their stats, parked fetches (woken and
           answered "unknown topic") and replication records along; queued transaction
           markers; the HA layer's tasks), so nothing uses a dropped
           partition's state once its log is gone, nor carries it over to a re-created topic;
        3. the store closes and deletes their files in the background (``dispose``);
        4. partitions with files that are new to the map (a topic re-added, partitions added)
           load their transaction state in a worker thread now, not at their first put
           (``Partitions.open_added``).

        ``update_topics`` registers the new map in ZooKeeper after all four.
        """
        # Files go only when the group's configuration ended the topic (``metaq topics delete``,
        # a re-create); a server.ini section removed without one keeps them (docs/operations.md).
        in_group = self.group_topics is not None and self.group_topics.group.exists
        dropped = self.store.apply_topic_change(change, delete_dropped=in_group)
        if dropped:
            forget_partitions(self, [(d.topic, d.partition) for d in dropped])
            self.store.dispose(dropped)
        self.partitions.open_added()

    def _check_open_files(self, topics: dict[str, TopicConfig]) -> None:
        """Refuse a topic map whose partitions cannot fit the open-file limit (metaq/server/open_files.py)."""
        known = {key: len(getattr(log_, "segments", ())) for key, log_ in self.store.logs().items()}
        refusal = open_files.does_not_fit(topics, self.config.max_connections, open_files.current_limit(), known)
        if refusal is not None:
            raise open_files.TopicsDoNotFit(refusal)

    def open_files_pairs(self) -> list[tuple[str, Any]]:
        """``stats``: the open-file limit and what the partitions served need of it (``metaq topics
        create|alter`` refuses a change that would pass it)."""
        known = {key: len(getattr(log_, "segments", ())) for key, log_ in self.store.logs().items()}
        return [
            ("open_files_limit", open_files.current_limit()),
            ("open_files_needed", open_files.needed(self.config.topics, self.config.max_connections, known)),
        ]

    def _slave_registered(self, slave_id: int) -> bool:
        """Does ZooKeeper name ``slave{slave_id}`` in our group (heartbeats from others are ignored)?"""
        return self.registry is not None and slave_id in self.registry.slave_ids

    def topic_incarnations(self) -> dict[str, str]:
        """Each served topic's life, for topics created at run time (a slave's fetch, heartbeat
        and topic sync count only for the same one)."""
        return {name: topic.incarnation for name, topic in self.config.topics.items() if topic.incarnation}

    def _slave_hosts(self, slave_id: int) -> frozenset[str] | None:
        """The addresses ``slave{slave_id}`` registered from: its heartbeats are answered only there."""
        return self.registry.slave_hosts.get(slave_id, frozenset()) if self.registry is not None else frozenset()

    def slaves_changed(self, slave_ids: frozenset[int]) -> None:
        """ZooKeeper's slave list changed: forget the progress of slaves that left (bounded state)."""
        for slave_id in list(self.ha.progress.slaves):
            if slave_id not in slave_ids:
                self.ha.progress.forget(slave_id)

    def durability_wait(self, topic: str, partition: int, end: int, count: int) -> Awaitable[None] | None:
        """What a put ending at ``end`` must wait for before its ack, or None to ack now."""
        flusher = self.store.flusher(topic, partition)
        flushed: Awaitable[None] | None = None
        if flusher.group_commit:
            flushed = flusher.appended(end, count)
        else:
            flusher.note_appended(count)
        replicated = self.ha.replication_wait(topic, partition, end)
        if flushed is None or replicated is None:
            return replicated if flushed is None else flushed
        return _all_of([flushed, replicated])

    def appended(self, topic: str, partition: int, end: int, count: int) -> None:
        self.ha.appended(topic, partition, end, count)
        self.waiters.notify(topic, partition)  # ``notify``, without its hop (per put)

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        apply_logging(config)
        if not self.register_in_zk:
            if config.replication_mode == "sync" and self.slave is None:
                raise ConfigError(f"{config.source_path}: replicationMode=sync needs ZooKeeper (zk.zkEnable=false)")
            if self.slave is not None:
                raise ConfigError(f"{config.source_path}: a slave needs ZooKeeper to find its master (zk.zkEnable=false)")
        # Before anything else: a broker that cannot keep logs must never hold the master lock.
        check_data_dirs(config.data_path, config.topics.values(), str(config.source_path))
        nofile = open_files.raise_limit()  # logged once listening: a start refused before says one line only
        self._check_open_files(config.topics)  # the group's topics are checked as they are applied
        floor = self.store.open_existing()
        # Before serving: each log's transaction state, and no batch half in a log.
        self.partitions.open_all()
        self.transactions.open()
        self.ids = MsgIdGenerator(config.broker_id, floor)
        self.store.on_flushed = self.notify_committed
        self.ha.streams.committed_of = self._committed_of
        served: Any = self.handlers
        metrics_login = None
        if config.metrics_port is not None:
            metrics_login = metrics_login_of(config)  # before listening: a bad password file stops the start
            self.metrics = BrokerMetrics(self)
            self.store.on_fsync_seconds = self.metrics.fsync_seconds.observe
            served = InstrumentedHandlers(self.handlers, self.metrics)
        self.store.start()
        self.scrubber.start()
        self.partitions.start()
        self.transactions.start()
        max_body = config.max_request_body
        loop = asyncio.get_running_loop()
        limits = ConnectionLimits.from_config(config)
        tls = self.security.tls
        try:
            self._server = await loop.create_server(
                lambda: ClientConnection(served, max_body, limits, self.security, self.slots, self.request_budget, self.authz,
                                         self.waiters),
                host=config.host_name,
                port=config.server_port,
                reuse_address=True,
                backlog=512,
                ssl=tls.context if tls is not None else None,
                # A TLS handshake comes before any login: it gets no longer than the login itself.
                ssl_handshake_timeout=config.login_timeout_ms / 1000 if tls is not None else None,
            )
        except socket.gaierror as exc:  # else the line would not say which name failed to resolve
            raise ConfigError(f"{config.source_path}: [system] hostName: {config.host_name!r} does not resolve: {exc.strerror}") from None
        if tls is not None and config.security.tls_reload_interval_ms > 0:
            self._tls_reload = asyncio.ensure_future(self._reload_certificates(config.security.tls_reload_interval_ms / 1000))
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("broker %d (%s) listening on %s:%d; %s", config.broker_id, self.ha.role_name, config.host_name, self.port,
                 self.security.describe())
        log.info("open-file limit (RLIMIT_NOFILE): soft %d, hard %d", *nofile)
        if self.metrics is not None:
            assert config.metrics_port is not None
            metrics_tls = tls.context if config.metrics_tls and tls is not None else None
            metrics_port = self.metrics.start(config.metrics_host, config.metrics_port, login=metrics_login, tls=metrics_tls)
            log.info("metrics on %s://%s:%d/metrics%s", "https" if metrics_tls else "http", config.metrics_host, metrics_port,
                     " (login required)" if metrics_login else "")
        self.heartbeats = HeartbeatResponder(
            config.broker_id, self.ha, self.store.logs, config.host_name, self.port,
            key=self.security.heartbeat_key, known_slave=self._slave_registered, slave_hosts=self._slave_hosts,
            incarnations=self.topic_incarnations,
        )
        await self.heartbeats.start()
        if self.register_in_zk:
            # The HA coordinator decides the role (and takes the master lock by election).
            host, port = config.host_name, self.port
            if config.advertised_address:
                host, port = parse_host_port(config.advertised_address)
            self.registry = BrokerRegistry(
                config.zk, config.broker_id, host, port, self._served_topics, config.checksum, None,
                security=self.security.zookeeper, on_slaves_changed=self.slaves_changed,
            )
            await self.registry.start()
            self.registry.client.add_listener(OutageReporter())
            reconnect_after_data_loss(self.registry.client, config.zk.session_timeout_ms)
            log.info("broker %d connected to ZooKeeper at %s%s", config.broker_id, config.zk.zk_connect, config.zk.root)
            try:
                identity = await asyncio.to_thread(broker_identity, config.data_path)
                joins_another_master = await check_join(self, self.slave, identity)
            except BaseException:
                await self.registry.stop(sync_time_ms=0)
                raise
            # A broker started without --slave seeds the group's topics from its server.ini,
            # unless another broker leads the group (ha/joining.py: it never changes them then).
            self.group_topics = GroupTopicsApplier(self, seeds=not joins_another_master)
            await self.group_topics.start()
        self.producer_ids = ProducerIdAllocator(config.broker_id, self._producer_id_blocks())
        self.transactional_ids = TransactionalIds(self.producer_ids, self._transactional_id_mapping(),
                                                  self.config.txn.max_transactional_ids_per_user,
                                                  self.security.principal_tags)
        await self.ha.start()
        if self.registry is not None:
            self.replica_coverage.start()
        if self.ha.coordinator is None and self.ha.acting_master:
            self.on_leading(self.ha.epoch)  # without ZooKeeper: master from the start, in epoch 0

    def on_leading(self, epoch: int) -> None:
        """This broker leads ``epoch`` now (``Leadership.open_for_writes``, or at start without ZooKeeper)."""
        self.transactions.on_leading(epoch)

    def on_resigned(self) -> None:
        """This broker stopped leading (``Leadership.stop``)."""
        self.transactions.on_resigned()

    async def restore_after_zookeeper_loss(self) -> None:
        """This broker re-seeded its group after ZooKeeper lost its data (metaq/ha/election.py).

        The producer id counter went with it: start it again past every id in our logs
        (the new master holds every acked batch), so no id is handed out twice.
        """
        registry = self.registry
        assert registry is not None
        states = await asyncio.to_thread(self.partitions.all)
        seen = (pid for state in states.values() for pid in state.producers.producers)
        floor = highest_counter_in(seen, self.config.broker_id) + RESEED_SKIP
        value = await asyncio.to_thread(
            raise_zookeeper_counter, registry.client, registry.paths, self.config.broker_id, floor, self._create_group_node(),
        )
        log.info("producer id counter of broker group %d restarted at %d (past every id in this broker's logs)",
                 self.config.broker_id, value)

    def _producer_id_blocks(self) -> Any:
        """Where producer id blocks come from: the group's ZooKeeper counter, or a local file."""
        registry = self.registry
        if registry is None:
            return local_blocks(self.config.data_path)
        return zookeeper_blocks(registry.client, registry.paths, self.config.broker_id, self._create_group_node())

    def _transactional_id_mapping(self) -> MappingStore:
        """Where transactional id -> (producer id, epoch) lives: under the group's node, or a local file."""
        registry = self.registry
        if registry is None:
            return LocalMapping(self.config.data_path)
        return ZooKeeperMapping(registry.client, registry.paths, self.config.broker_id, self._create_group_node())

    def _create_group_node(self) -> Callable[[str, bytes], Any]:
        """``create(path, value)`` for a persistent node under the group's node, with the group's ACL."""
        registry = self.registry
        assert registry is not None
        client, security = registry.client, registry.security
        if security is not None:
            return lambda path, value: security.create(client, path, value)
        return lambda path, value: client.create(path, value, makepath=True)

    async def _reload_certificates(self, interval_s: float) -> None:
        """New handshakes present renewed certificate files without a restart."""
        assert self.security.tls is not None
        while True:
            await asyncio.sleep(interval_s)
            self.security.tls.maybe_reload()  # logs; a half-written renewal keeps the old pair

    async def stop(self) -> None:
        self.replica_coverage.stop()
        if self.group_topics is not None:
            self.group_topics.stop()
        if self._tls_reload is not None:
            self._tls_reload.cancel()
        # Every task the broker started ends before what it uses stops: a reload in progress
        # finishes, a repair from the slaves and the certificate reload are cancelled.
        await self._reloads.stop(RELOAD_STOP_GRACE_S)
        repairs = [*self._repairs.values(), *([self._tls_reload] if self._tls_reload is not None else [])]
        for task in repairs:
            task.cancel()
        await asyncio.gather(*repairs, return_exceptions=True)
        await self.ha.stop()
        if self.registry is not None:
            try:
                await self.registry.stop(sync_time_ms=self.config.zk.sync_time_ms)
            except Exception as exc:  # ZK may be gone; the logs must still be closed cleanly
                log.warning("deregistration failed: %s", exc)
        if self._server is not None:
            self._server.close()
        self.slots.close_all()
        if self.heartbeats is not None:
            await self.heartbeats.stop()
        self.waiters.notify_all()
        await self.partitions.stop()
        await self.transactions.stop()
        await self.scrubber.stop()
        await self.store.stop()
        self.partitions.close()
        self.store.close()
        if self.metrics is not None:
            self.metrics.stop()
        self._stopped.set()
        log.info("broker %d stopped", self.config.broker_id)

    async def run_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        # Before start(): a SIGTERM that arrives while the broker is still registering
        # must lead to a clean stop (deregister, final flush), not the default death.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        started = False
        # SIGHUP reloads server.ini (metaq/server/reload.py) instead of killing the broker.
        loop.add_signal_handler(
            signal.SIGHUP,
            lambda: self._reloads.spawn(reload_config(self)) if started else log.warning("reload ignored: still starting"),
        )
        await self.start()
        started = True
        await stop.wait()
        log.info("signal received, stopping")
        await self.stop()
        await _end_worker_threads(STOP_THREADS_GRACE_S)

    # --- stats ------------------------------------------------------------------------

    def config_text(self) -> str:
        """``stats config``: the server.ini as loaded, then the topics served now (comments)."""
        text = self.config.raw.decode("utf-8", "replace")
        group = self.group_topics.group if self.group_topics is not None else None
        source = (
            f"broker group {self.config.broker_id}'s topic configuration in ZooKeeper (version {group.version})"
            if group is not None and group.exists else "this server.ini and what the master's config sync adopted"
        )
        lines = [f"; ---- topics served now, from {source} ----"]
        for name, topic in sorted(self.config.topics.items()):
            settings = " ".join(f"{key}={value}" for key, value in topic_settings(topic).items())
            lines.append(f"; [topic={name}] {settings} dataPath={topic.data_path}")
        return text.rstrip("\n") + "\n" + "\n".join(lines) + "\n"

    def general_pairs(self) -> list[tuple[str, Any]]:
        totals = self.stats.totals()
        return [
            ("pid", os.getpid()),
            ("broker_id", self.config.broker_id),
            ("role", self.ha.role_name),
            ("epoch", self.ha.epoch),
            ("version", f"metaq-py {__version__}"),
            ("uptime", int(self.stats.uptime())),
            ("curr_connections", self.stats.connections),
            ("total_connections", self.stats.total_connections),
            ("topics", len(self.config.topics)),
            ("replication_mode", self.config.replication_mode),
            ("put_messages", totals.put_messages),
            ("put_bytes", totals.put_bytes),
            ("put_failed", totals.put_failed),
            ("put_duplicates", totals.put_duplicates),
            ("get_requests", totals.get_requests),
            ("get_bytes", totals.get_bytes),
            ("get_miss", totals.get_miss),
            ("replica_get_requests", totals.replica_get_requests),
            ("replica_get_bytes", totals.replica_get_bytes),
            ("bad_requests", self.stats.bad_requests),
            ("connections_not_logged_in", self.slots.not_logged_in),
            ("buffered_request_bytes", self.request_budget.held),
            *self.stats.refusal_pairs(),
            ("scrub_bytes", self.scrubber.stats.bytes_checked),
            ("scrub_corrupt_ranges", self.scrubber.stats.corrupt_ranges),
            ("time_index_rebuilds", time_index_rebuilds.total),
            *self.open_files_pairs(),
            *self.replica_coverage.status_pairs(),
        ] + self.ha.status_pairs() + self.replication_pairs()

    def replication_pairs(self) -> list[tuple[str, Any]]:
        pairs = self.heartbeats.status_pairs() if self.heartbeats is not None else []
        follower = self.ha.follower
        if not self.ha.acting_master and follower is not None:
            return pairs + follower.status_pairs()
        progress = self.ha.progress
        ends = {key: log_.log_end for key, log_ in self.store.logs().items()}
        hb_age = progress.heartbeat_ages_ms()
        return pairs + [
            (
                f"slave{row.slave_id} {row.topic}-{self.config.broker_id}-{row.partition}",
                {
                    "log_end": row.log_end,
                    "lag_bytes": row.bytes,
                    "lag_messages": row.messages,
                    "lag_ms": round(row.millis),
                    "approx": not row.exact,
                    "last_fetch_ms_ago": round(row.last_fetch_ms_ago),
                    "heartbeat_age_ms": round(hb_age.get(row.slave_id, -1)),
                },
            )
            for row in progress.lag(ends)
        ]

    def offset_pairs(self, only_topic: str | None = None) -> list[tuple[str, Any]]:
        pairs: list[tuple[str, Any]] = []
        for name, topic in sorted(self.config.topics.items()):
            if only_topic is not None and name != only_topic:
                continue
            for n in range(topic.num_partitions):
                log_ = self.store.get_log(name, n)
                row = {
                    "min_offset": log_.min_offset,
                    "max_offset": log_.log_end,
                    "committed": self.ha.committed(name, n, log_),
                    "flushed": log_.flushed_end,
                }
                corrupt_from = log_.first_corrupt_offset()
                if corrupt_from is not None:  # only then: healthy rows stay as they were
                    row["corrupt_from"] = corrupt_from  # where the first range never served starts
                pairs.append((f"{name}-{self.config.broker_id}-{n}", row))
        return pairs


def run_broker(config: BrokerConfig, slave: SlaveConfig | None = None) -> int:
    try:
        import uvloop  # type: ignore[import-not-found]

        use_uvloop = os.environ.get("METAQ_EVENT_LOOP", "uvloop") == "uvloop"
    except ImportError:
        use_uvloop = False
    broker = Broker(config, slave)
    if use_uvloop:
        uvloop.run(broker.run_until_signalled())
    else:
        asyncio.run(broker.run_until_signalled())
    return 0


async def _end_worker_threads(grace_s: float) -> None:
    """Shut the loop's worker threads down within ``grace_s``, or exit the process without them.

    Called once the broker has stopped: its logs are flushed and closed, so a thread still
    running holds nothing that must reach the disk. Shutdown is bounded whatever one is doing.
    """
    loop = asyncio.get_running_loop()
    # Not wait_for: cancelling shutdown_default_executor joins its thread on the event loop,
    # that is, waits for the busy worker after all (a frozen ZooKeeper's close: 17 s).
    shutdown = asyncio.ensure_future(loop.shutdown_default_executor())
    done, _pending = await asyncio.wait({shutdown}, timeout=grace_s)
    if not done:
        busy = sorted(t.name for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon)
        log.warning("worker threads still busy %.0f s after the broker stopped (%s); exiting without them",
                    grace_s, ", ".join(busy) or "-")
        logging.shutdown()
        os._exit(0)


async def _all_of(waits: list[Awaitable[None]]) -> None:
    """Wait for every one (the flush and the replication wait run at the same time)."""
    await asyncio.gather(*waits)
