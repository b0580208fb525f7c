"""The broker process: store, protocol server and ZooKeeper presence, tied together.

Lifecycle: open the logs (recovering torn tails) -> seed the msg-id generator
above every id already stored -> listen -> register in ZooKeeper. Stop runs
the other way: deregister first (clients move away), then stop listening,
then flush and close the logs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import replace
from typing import Any, Awaitable

from .. import __version__
from ..addresses import parse_host_port
from ..config import BrokerConfig, ConfigError, SlaveConfig, TopicConfig
from ..ha.progress import ReplicationProgress
from ..ha.role import Role
from ..ha.sync import SyncReplication
from ..protocol import commands as c
from ..store.manager import MessageStoreManager
from ..store.msgid import MsgIdGenerator
from .connection import ClientConnection
from .handlers import RequestHandlers
from .stats import BrokerStats
from .waiters import EndWaiters

log = logging.getLogger(__name__)

# A put frame carries at most MAX_BATCH_COUNT messages of max_message_size; the
# frame limit leaves room for the headers and never exceeds 64 MiB.
FRAME_OVERHEAD = 64 * 1024


class Broker:
    def __init__(self, config: BrokerConfig, slave: SlaveConfig | None = None, register_in_zk: bool | None = None) -> None:
        self.config = config
        self.slave = slave
        self.register_in_zk = config.zk.enabled if register_in_zk is None else register_in_zk
        self.stats = BrokerStats()
        self.waiters = EndWaiters()
        self.store = MessageStoreManager(config.topics, config.max_message_size)
        self.handlers = RequestHandlers(self)
        self.ids: MsgIdGenerator | None = None
        self.registry: Any = None
        self.follower: Any = None
        self.epoch = 0
        self._server: asyncio.AbstractServer | None = None
        self._stopped = asyncio.Event()
        self.progress = ReplicationProgress()
        self.sync: SyncReplication | None = None
        # Puts are refused until the broker is registered (and, in sync mode, has
        # published its sync set): no ack may precede the state failover relies on.
        self.ready = False
        self._replica_connections: dict[Any, set[int]] = {}
        self.heartbeats: Any = None  # metaq.ha.heartbeat.HeartbeatResponder (UDP, same port as TCP)
        self.coordinator: Any = None  # metaq.ha.coordinator.HaCoordinator, when in ZooKeeper

    # --- roles (the HA layer refines these) ----------------------------------------

    @property
    def role_name(self) -> str:
        coordinator = self.coordinator
        if coordinator is None:
            return "master" if self.slave is None else f"slave{self.slave.slave_id}"
        state = coordinator.state
        if state is Role.LEADING:
            return "master"
        if state in (Role.FOLLOWING, Role.ORPHANED) and self.registry.slave_id is not None:
            return f"slave{self.registry.slave_id}"
        return state.value

    @property
    def leading(self) -> bool:
        """Acting as the master (possibly fenced): committed offsets are ours to compute."""
        if self.coordinator is None:
            return self.slave is None
        return self.coordinator.state in (Role.LEADING, Role.FENCED)

    def write_refusal(self) -> tuple[int, str] | None:
        """Why this broker must not accept a put right now, or None."""
        coordinator = self.coordinator
        if coordinator is not None and not coordinator.may_ack():
            state = coordinator.state
            if state in (Role.FOLLOWING, Role.ORPHANED):
                master = coordinator.master_url or "(none registered)"
                return c.FORBIDDEN, f"broker {self.config.broker_id} {self.role_name} is a slave; writes go to its master {master}"
            if state is Role.LEADING:
                return c.SERVICE_UNAVAILABLE, "master lease expired: ZooKeeper has not confirmed this master recently; retry"
            return c.SERVICE_UNAVAILABLE, f"broker {self.config.broker_id} is {state.value}; no master here right now, retry"
        if coordinator is None and self.slave is not None:
            return c.FORBIDDEN, f"broker {self.config.broker_id} {self.role_name} is a slave"
        if not self.ready:
            return c.SERVICE_UNAVAILABLE, f"broker {self.config.broker_id} is starting; retry shortly"
        if self.sync is not None:
            return self.sync.refusal()
        return None

    # --- offsets and durability ---------------------------------------------------

    def topic_config(self, topic: str) -> TopicConfig | None:
        return self.config.topics.get(topic)

    def committed(self, topic: str, partition: int, log: Any) -> int:
        """The end of what consumers may read: no failover can take back anything below it."""
        if not self.leading:
            return self.follower.committed(topic, partition, log.log_end) if self.follower is not None else 0
        if self.sync is not None:
            return self.sync.committed(topic, partition)
        return log.flushed_end

    async def update_topics(self, topics: dict[str, TopicConfig]) -> None:
        """Adopt a new topic map (a slave learning its master's topics)."""
        if topics == self.config.topics:
            return
        added = sorted(set(topics) - set(self.config.topics))
        self.config = replace(self.config, topics=dict(topics))
        self.store.update_topics(topics)
        if self.registry is not None:
            await self.registry.update_topics(topics)
        if added:
            log.info("now serving topics %s", ", ".join(added))

    def replica_appended(self, topic: str, partition: int) -> None:
        """A slave appended replicated bytes, or learnt a new committed offset."""
        self.waiters.notify(topic, partition)

    def durability_wait(self, topic: str, partition: int, end: int, count: int) -> Awaitable[None] | None:
        """What a put ending at ``end`` must wait for before its ack, or None to ack now."""
        flusher = self.store.flusher(topic, partition)
        waits: list[Awaitable[None]] = []
        if flusher.group_commit:
            waits.append(flusher.appended(end, count))
        else:
            flusher.note_appended(count)
        if self.sync is not None:
            replicated = self.sync.wait(topic, partition, end)
            if replicated is not None:
                waits.append(replicated)
        if not waits:
            return None
        return waits[0] if len(waits) == 1 else _all_of(waits)

    def appended(self, topic: str, partition: int, end: int, count: int) -> None:
        self.progress.appended(topic, partition, end, count)
        self.waiters.notify(topic, partition)

    def flushed(self, topic: str, partition: int) -> None:
        self.waiters.notify(topic, partition)

    def replica_fetched(
        self, topic: str, partition: int, offset: int, replica: dict[str, Any], origin: Any = None
    ) -> None:
        slave_id, epoch = replica.get("slave_id"), replica.get("epoch", 0)
        if not isinstance(slave_id, int) or not isinstance(epoch, int):
            return
        self.progress.fetched(slave_id, topic, partition, offset, epoch)
        if origin is not None:
            self._replica_connections.setdefault(origin, set()).add(slave_id)
        if self.sync is not None:
            self.sync.slave_position(slave_id, topic, partition, offset)

    def connection_closed(self, origin: Any) -> None:
        """A client connection closed; if a slave replicated over it, it is gone."""
        for slave_id in self._replica_connections.pop(origin, ()):
            if self.sync is not None:
                self.sync.slave_disconnected(slave_id)

    def slave_heard(self, slave_id: int) -> None:
        """A slave's heartbeat arrived (keeps a quiet sync-set member counted)."""
        if self.sync is not None:
            self.sync.slave_heard(slave_id)

    def saw_higher_epoch(self, epoch: int) -> None:
        """A slave knows a newer epoch than ours: someone else leads; stop acking now."""
        if self.coordinator is not None:
            from ..ha.role import Event

            self.coordinator.post(Event.HIGHER_EPOCH)

    def committed_moved(self, topic: str, partition: int) -> None:
        self.waiters.notify(topic, partition)

    async def _publish_sync_set(self, members: frozenset[int]) -> None:
        """Write the sync set to ZooKeeper (persistent: failover reads it after we are gone)."""
        from ..ha.election import publish_sync_set
        from ..zk.paths import ZkPaths

        leader = self.coordinator.my_url if self.coordinator is not None else None
        await asyncio.wait_for(
            asyncio.to_thread(
                publish_sync_set, self.registry.client, ZkPaths(self.config.zk.root), self.config.broker_id,
                self.epoch, leader, members, self.config.min_sync_slaves,
            ),
            self.config.sync_slave_timeout_ms / 1000 + 5,
        )

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        floor = self.store.open_existing()
        self.ids = MsgIdGenerator(config.broker_id, floor)
        self.store.on_flushed = self.flushed
        self.store.start()
        max_body = min(64 * 1024 * 1024, config.max_message_size * 16 + FRAME_OVERHEAD)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(self.handlers, max_body),
            host=config.host_name,
            port=config.server_port,
            reuse_address=True,
            backlog=512,
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("broker %d (%s) listening on %s:%d", config.broker_id, self.role_name, config.host_name, self.port)
        from ..ha.heartbeat import HeartbeatResponder

        self.heartbeats = HeartbeatResponder(self, config.host_name, self.port)
        await self.heartbeats.start()
        if self.register_in_zk:
            from .registry import BrokerRegistry

            # The HA coordinator decides the role (and takes the master lock by election).
            host, port = config.host_name, self.port
            if config.advertised_address:
                host, port = parse_host_port(config.advertised_address)
            self.registry = BrokerRegistry(config.zk, config.broker_id, host, port, config.topics, config.checksum, None)
            await self.registry.start()
            log.info("broker %d connected to ZooKeeper at %s%s", config.broker_id, config.zk.zk_connect, config.zk.root)
            from ..ha.coordinator import HaCoordinator

            self.coordinator = HaCoordinator(self, self.slave)
            await self.coordinator.start()
        elif config.replication_mode == "sync" and self.slave is None:
            raise ConfigError(f"{config.source_path}: replicationMode=sync needs ZooKeeper (zk.zkEnable=false)")
        elif self.slave is not None:
            raise ConfigError(f"{config.source_path}: a slave needs ZooKeeper to find its master (zk.zkEnable=false)")
        self.ready = True

    def ensure_follower(self, slave: SlaveConfig) -> Any:
        """The replication follower (created on first use, when this broker first follows)."""
        if self.follower is None or self.follower.slave.slave_id != slave.slave_id:
            from ..ha.follower import MasterFollower
            from ..zk.paths import ZkPaths

            self.follower = MasterFollower(self, slave, self.registry.client, ZkPaths(self.config.zk.root))
            asyncio.ensure_future(self.follower.start())
        return self.follower

    async def start_sync_replication(self) -> None:
        """On becoming master in sync mode: start the sync set (published before any ack)."""
        config = self.config
        if config.replication_mode != "sync":
            return
        self.sync = SyncReplication(
            config.min_sync_slaves,
            config.sync_slave_timeout_ms,
            config.on_sync_slave_loss,
            self._publish_sync_set,
            log_end=lambda t, p: self.store.get_log(t, p).log_end,
            flushed_end=lambda t, p: self.store.get_log(t, p).flushed_end,
            partitions=lambda: list(self.store.logs()),
            on_committed=self.committed_moved,
        )
        await self.sync.start()
        log.info(
            "sync replication: acks wait for the sync set (minSyncSlaves=%d, syncSlaveTimeoutMs=%d, onSyncSlaveLoss=%s)",
            config.min_sync_slaves,
            config.sync_slave_timeout_ms,
            config.on_sync_slave_loss,
        )

    async def stop(self) -> None:
        self.ready = False
        if self.coordinator is not None:
            await self.coordinator.stop()
        if self.sync is not None:
            await self.sync.stop()
        if self.follower is not None:
            await self.follower.stop()
        if self.registry is not None:
            try:
                await self.registry.stop(sync_time_ms=self.config.zk.sync_time_ms)
            except Exception as exc:  # ZK may be gone; the logs must still be closed cleanly
                log.warning("deregistration failed: %s", exc)
        if self._server is not None:
            self._server.close()
        if self.heartbeats is not None:
            await self.heartbeats.stop()
        self.waiters.notify_all()
        await self.store.stop()
        self.store.close()
        self._stopped.set()
        log.info("broker %d stopped", self.config.broker_id)

    async def run_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        # Before start(): a SIGTERM that arrives while the broker is still registering
        # must lead to a clean stop (deregister, final flush), not the default death.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        log.info("signal received, stopping")
        await self.stop()

    # --- stats ------------------------------------------------------------------------

    def general_pairs(self) -> list[tuple[str, Any]]:
        totals = self.stats.totals()
        return [
            ("pid", os.getpid()),
            ("broker_id", self.config.broker_id),
            ("role", self.role_name),
            ("epoch", self.epoch),
            ("version", f"metaq-py {__version__}"),
            ("uptime", int(self.stats.uptime())),
            ("curr_connections", self.stats.connections),
            ("total_connections", self.stats.total_connections),
            ("topics", len(self.config.topics)),
            ("replication_mode", self.config.replication_mode),
            ("put_messages", totals.put_messages),
            ("put_bytes", totals.put_bytes),
            ("put_failed", totals.put_failed),
            ("get_requests", totals.get_requests),
            ("get_bytes", totals.get_bytes),
            ("get_miss", totals.get_miss),
            ("replica_get_requests", totals.replica_get_requests),
            ("replica_get_bytes", totals.replica_get_bytes),
            ("bad_requests", self.stats.bad_requests),
        ] + (self.coordinator.status_pairs() if self.coordinator is not None else []) + (
            self.sync.status_pairs() if self.sync is not None else []
        ) + self.replication_pairs()

    def replication_pairs(self) -> list[tuple[str, Any]]:
        pairs = self.heartbeats.status_pairs() if self.heartbeats is not None else []
        if not self.leading and self.follower is not None:
            return pairs + self.follower.status_pairs()
        ends = {key: log_.log_end for key, log_ in self.store.logs().items()}
        hb_age = self.progress.heartbeat_ages_ms()
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
            for row in self.progress.lag(ends)
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
                    "committed": self.committed(name, n, log_),
                    "flushed": log_.flushed_end,
                }
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


async def _all_of(waits: list[Awaitable[None]]) -> None:
    """Wait for every one (the flush and the replication wait run at the same time)."""
    await asyncio.gather(*waits)
