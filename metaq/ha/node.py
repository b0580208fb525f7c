"""The broker's HA facade: the one answer to "what is my role, may I ack, what is committed".

Everything in the server that depends on the role asks this object: the put
handler (``write_refusal``, ``replication_wait``), reads (``committed``),
replica fetches (``acting_master``, ``epoch``, ``replica_fetched``), the
heartbeat responder, and stats (``role_name``, ``status_pairs``). There is no
other notion of "am I the master": how the broker was started (``--slave`` or
not) is only a preference for a group that never had a master.

With ZooKeeper the role is the coordinator's state machine (role.py, driven by
coordinator.py, whose parts own the lease and the sync set (leadership.py), the
follower (followership.py) and the epochs (terms.py)). Without ZooKeeper a broker is a standalone master: it acks once the
flush policy allows, and has no epochs, no slaves and no sync set.

A slave's replication position is written once, by ``ReplicationProgress``, into the
partition's replication record (record.py, held by the partition's owner); the sync set
reads it from there.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable

from ..config import SlaveConfig
from ..protocol import commands as c
from .coordinator import ZK_ERRORS, HaCoordinator
from .host import BrokerHost
from .news import Answer, NewsSession
from .stream import StreamHub
from .progress import ReplicationProgress
from .role import ACTING_MASTER, HOLDS_LOCK, Event, Role
from .sync_set import SyncReplication

log = logging.getLogger(__name__)


class HaNode:
    def __init__(self, host: BrokerHost, slave: SlaveConfig | None, in_zookeeper: bool) -> None:
        self.host = host
        self.in_zookeeper = in_zookeeper
        self.progress = ReplicationProgress(host.partitions)
        self.coordinator: HaCoordinator | None = None
        # Puts are refused until the broker is registered; in sync mode a master also
        # refuses them until it has published its term's sync set (SyncReplication.refusal,
        # at every promotion): no ack may precede the state failover relies on.
        self.ready = False
        self._slave = slave
        self._replica_connections: dict[Any, set[int]] = {}
        self._epoch_check_pending = False
        #: Each slave connection's ``news`` session (news.py), gone with the connection.
        self._news: dict[Any, NewsSession] = {}
        #: Slaves' replication streams (stream.py); subscribed to only with replicationStream=true.
        self.streams = StreamHub(host.partitions)

    async def start(self) -> None:
        """Take part in the group's HA (with ZooKeeper), then accept puts."""
        if self.in_zookeeper:
            self.coordinator = HaCoordinator(self.host, self._slave, self.progress)
            await self.coordinator.start()
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        if self.coordinator is not None:
            await self.coordinator.stop()

    # --- the role -----------------------------------------------------------------------

    @property
    def role(self) -> Role:
        if self.coordinator is not None:
            return self.coordinator.state
        if self.in_zookeeper or self._slave is not None:
            return Role.STARTING  # a slave without ZooKeeper never gets past start()
        return Role.LEADING

    @property
    def role_name(self) -> str:
        role = self.role
        if role in HOLDS_LOCK:
            return "master"
        slave_id = self.host.registry.slave_id if self.coordinator is not None else None
        if role in (Role.FOLLOWING, Role.ORPHANED) and slave_id is not None:
            return f"slave{slave_id}"
        return role.value

    @property
    def acting_master(self) -> bool:
        """Leading this term (possibly handing over, fenced or resigning): committed offsets are ours
        to compute, slaves fetch from us."""
        coordinator = self.coordinator
        # The coordinator's state is ``role`` (asked per request: without the property's hop).
        return (coordinator.state if coordinator is not None else self.role) in ACTING_MASTER

    @property
    def epoch(self) -> int:
        """The epoch this broker leads or follows in (0 without ZooKeeper)."""
        return self.coordinator.epochs.serving if self.coordinator is not None else 0

    @property
    def sync_set(self) -> SyncReplication | None:
        return self.coordinator.leadership.sync_set if self.coordinator is not None else None

    @property
    def follower(self) -> Any:
        return self.coordinator.followership.follower if self.coordinator is not None else None

    def write_refusal(self) -> tuple[int, str] | None:
        """Why this broker must not accept a put right now, or None (asked per put: the
        role and the broker id are looked up only for a refusal)."""
        coordinator = self.coordinator
        if coordinator is not None and not coordinator.may_ack():
            broker_id = self.host.config.broker_id
            role = self.role
            if role in (Role.FOLLOWING, Role.ORPHANED):
                master = coordinator.master_url or "(none registered)"
                return c.FORBIDDEN, f"broker {broker_id} {self.role_name} is a slave; writes go to its master {master}"
            if role is Role.LEADING and ((lease := coordinator.leadership.lease) is None or not lease.confirmed_once):
                # Won the election, still taking over (fsync, epoch start, lease, sync set):
                # not an expiry, and a retry in a moment is acked.
                return c.SERVICE_UNAVAILABLE, f"broker {broker_id} is taking over as master of epoch {self.epoch}; nothing stored, retry shortly"
            if role is Role.LEADING:
                return c.SERVICE_UNAVAILABLE, "master lease expired: ZooKeeper has not confirmed this master recently; retry"
            if role is Role.HANDING_OVER:
                return c.SERVICE_UNAVAILABLE, f"broker {broker_id} is handing over to slave {coordinator.leadership.handover_target} (metaq promote); nothing stored, retry"
            return c.SERVICE_UNAVAILABLE, f"broker {broker_id} is {role.value}; no master here right now, retry"
        if not self.ready:
            return c.SERVICE_UNAVAILABLE, f"broker {self.host.config.broker_id} is starting; retry shortly"
        sync_set = self.sync_set
        return sync_set.refusal() if sync_set is not None else None

    # --- offsets and acks ---------------------------------------------------------------

    def committed(self, topic: str, partition: int, log: Any) -> int:
        """The end of what consumers may read. No failover can take back anything below it,
        except on an async master: its flushed end may run ahead of every slave, and a failover
        takes back what lay inside the replication lag (docs/guarantees.md, async reads)."""
        if not self.acting_master:
            deposed = self._deposed_bound(topic, partition)
            if deposed is not None:
                # Our newest epoch of the partition is one we led: what a master told our follower
                # before that term is older than our own record of the term, and would hide its
                # writes the slaves did fetch.
                return min(deposed, log.log_end)
            follower = self.follower
            return follower.committed(topic, partition, log.log_end) if follower is not None else 0
        sync_set = self.sync_set
        if sync_set is not None:
            return sync_set.committed(topic, partition)
        return log.flushed_end

    def _deposed_bound(self, topic: str, partition: int) -> int | None:
        """How far a broker that no longer leads may serve a partition whose newest epoch it led
        (None for a partition whose newest epoch it did not lead: its follower's bound applies).

        Invariant: a deposed master serves none of its own term's writes past the highest
        position a slave reported fetching in that term, until it has truncated against the
        next master. Bytes no slave fetched are not in the next master's log, which writes
        other messages at those offsets: whatever this broker served of them while leading
        is the async read caveat (docs/guarantees.md), but serving them after it was deposed
        would hand consumers messages the group already took back. Truncation ends this: it
        replaces the partition's epoch history with the master's, whose newest epoch is not
        ours. A broker whose newest epoch of the partition it did not lead (a plain slave)
        is not bounded here.
        """
        coordinator = self.coordinator
        if coordinator is None:
            return None
        epochs = coordinator.cache(topic, partition)
        led = epochs.latest_epoch
        if led == 0 or led != coordinator.epochs.led:
            return None
        term_start = epochs.entries[-1][1]  # what we held as a slave when our term began
        record = self.host.partitions.replication(topic, partition)
        shared = record.shared if record is not None else None
        if shared is None or shared[0] != led:
            return term_start  # no slave reported in our term (or we restarted since)
        # Slaves report record ends; a batch stays whole (readable in full or not at all).
        return self.host.partitions.batch_boundary(topic, partition, shared[1], term_start)

    def appended(self, topic: str, partition: int, end: int, count: int) -> None:
        self.progress.appended(topic, partition, end, count)
        if self.streams:
            self.streams.appended((topic, partition), end)

    def replication_wait(self, topic: str, partition: int, end: int) -> Awaitable[None] | None:
        """What a put ending at ``end`` waits for on the slaves (raises SyncWaitFailed to refuse)."""
        sync_set = self.sync_set
        return sync_set.wait(topic, partition, end) if sync_set is not None else None

    def epoch_end(self, topic: str, partition: int, epoch: int) -> tuple[int, int] | None:
        """Where ``epoch`` ends in our log, or None when this broker keeps no epochs."""
        if self.coordinator is None:
            return None
        return self.coordinator.epoch_end(topic, partition, epoch)

    def epoch_entries(self, topic: str, partition: int) -> list[tuple[int, int]]:
        return self.coordinator.epoch_entries(topic, partition) if self.coordinator is not None else []

    # --- slaves ---------------------------------------------------------------------------

    def replica_fetched(self, slave_id: int, epoch: int, topic: str, partition: int, log_end: int, origin: Any) -> None:
        """A slave's fetch or position report (already fenced by epoch) says where it is."""
        self.progress.fetched(slave_id, topic, partition, log_end, epoch)
        if self.acting_master and epoch == self.epoch:
            # ``shared``: ``(epoch, highest log end a slave reported fetching in it)`` for the
            # epoch this broker leads: how much of its own term's writes the group shares.
            record = self.host.partitions.replication(topic, partition)
            if record is not None:
                shared = record.shared
                if shared is None or shared[0] != epoch or log_end > shared[1]:
                    record.shared = (epoch, log_end)
        if origin is not None:
            self._replica_connections.setdefault(origin, set()).add(slave_id)
        sync_set = self.sync_set
        if sync_set is not None:
            sync_set.slave_position(slave_id, topic, partition)

    def news_session(self, origin: Any, slave_id: int, answer: Answer) -> NewsSession:
        """The ``news`` session of a slave's connection (made at its first ``news``); polling
        it is contact from the slave, as a fetch is. One slave per connection."""
        session = self._news.get(origin)
        if session is None:
            session = self._news[origin] = NewsSession(slave_id, self.host.watch, answer)
        elif session.slave_id != slave_id:
            log.warning("refused news for slave%d on the connection of slave%d (%s)",
                        slave_id, session.slave_id, getattr(origin, "peer", "?"))
            raise c.RequestError(c.FORBIDDEN, f"this connection replicates for slave{session.slave_id}, not slave{slave_id}")
        if origin is not None:
            self._replica_connections.setdefault(origin, set()).add(slave_id)
        sync_set = self.sync_set
        if sync_set is not None:
            sync_set.slave_heard(slave_id)
        return session

    def slave_heartbeat(self, slave_id: int, address: str | None, log_ends: dict[tuple[str, int], int], epoch: int) -> None:
        self.progress.heartbeat(slave_id, address, log_ends, epoch)
        sync_set = self.sync_set
        if sync_set is not None:  # a quiet but alive slave stays counted
            sync_set.slave_heard(slave_id)

    def forget_partitions(self, keys: list[tuple[str, int]]) -> None:
        """Partitions no longer served (topic deleted or re-created): every HA record of them goes
        (their replication records, with their streams, went with their owners: ``Partitions.drop``)."""
        if self.coordinator is not None:
            self.coordinator.forget_partitions(keys)

    def connection_closed(self, origin: Any) -> None:
        """A client connection closed; a slave that replicated over it is gone (and forgotten)."""
        session = self._news.pop(origin, None)
        if session is not None:
            session.close()
        self.streams.connection_closed(origin)
        for slave_id in self._replica_connections.pop(origin, ()):
            if any(slave_id in ids for ids in self._replica_connections.values()):
                continue  # it replicates over another connection too
            sync_set = self.sync_set
            if sync_set is not None:
                sync_set.slave_disconnected(slave_id)
            self.progress.forget(slave_id)

    def saw_higher_epoch(self, claimed: int) -> None:
        """A peer claims an epoch newer than ours: ask ZooKeeper, and fence only if it agrees.

        Invariant: a claim never fences a master by itself (any peer can make one); the
        epoch node in ZooKeeper, writable only by the group's brokers, is the word. One
        check at a time, so a peer repeating the claim costs one ZooKeeper read, not many.
        """
        coordinator = self.coordinator
        if coordinator is None or self._epoch_check_pending:
            return
        self._epoch_check_pending = True
        serving = coordinator.epochs.serving

        async def confirm() -> Event:
            try:
                state = await coordinator.view.read_state()
            except ZK_ERRORS:
                return Event.REEVALUATE  # cannot confirm: the lease decides, as without the claim
            finally:
                self._epoch_check_pending = False
            if state.epoch > serving:
                return Event.HIGHER_EPOCH
            log.warning("a peer claimed epoch %d, but ZooKeeper says %d: not fencing", claimed, state.epoch)
            return Event.REEVALUATE

        coordinator.post(confirm)

    def status_pairs(self) -> list[tuple[str, object]]:
        pairs = self.coordinator.status_pairs() if self.coordinator is not None else []
        if self.acting_master:
            # What a producer gets now (``metaq cluster`` marks a refusing master).
            refusal = self.write_refusal()
            pairs.append(("writes", "accepted" if refusal is None else f"refused: {refusal[1]}"))
        if self.host.config.replication_stream:
            pairs += self.streams.status_pairs()
        sync_set = self.sync_set
        return pairs + (sync_set.status_pairs() if sync_set is not None else [])
