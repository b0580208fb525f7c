"""The slave side of replication: copy every partition of the master it is told to follow.

Which master to follow is the HA coordinator's decision (coordinator.py calls
``follow(url)`` / ``unfollow()``); the follower only replicates from it.

A slave subscribes to its master the way MetaQ's did, as a consumer of every
master topic-partition, with three differences that close the original's holes:
its position is its own log end (no offset store that can disagree with the log),
each fetch reports that position and the slave's epoch to the master (so the
master knows replication progress), and a reply that does not continue the log
byte for byte stops that partition instead of corrupting it (see replica.py).

Topics: the master's topic list comes from its ``topics`` command. With
``autoSyncMasterConfig=true`` the slave also fetches the master's server.ini and
adopts its topic sections (config_sync.py); it re-reads both whenever the
master's ``master_config_checksum`` znode changes, so topics the master adds
later start replicating without a restart.

Cost per partition: a slave keeps a fetch parked only on busy partitions (at most
MAX_PARKED_FETCHES); an idle one is *quiet*: named once in the slave's one ``news``
long-poll (news.py has the master's side) and fetched again when the master says it has
news. Nothing a slave sends per unit of time grows with its idle partitions.

Where the state lives: what the follower keeps of one partition (its replica, its fetch
task, while quiet the future that task waits on and its registration for the next
``news``, while streamed its stream's closer) is one ``ReplicaRun``, in the partition's
replication record (record.py, ``ReplicationRecord.following``): dropping the partition
(``Partitions.drop``) takes it along and cancels its task (``ReplicaRun.dropped``), and no
map of the follower's has to forget it. The follower itself keeps what is not one
partition's: the connection, the news poll, the registrations to send with the next poll
(``_news_outbox``, drained by each poll), the count of partitions quiet or streamed (the
poll asks only while there is one), the heartbeat's bookkeeping. Walks over every record
(``_runs``) are taken only where every partition is touched anyway: following's start
and stop, a new news session or a failed one (every quiet partition then fetches), status.

Threads: kazoo calls its watch functions on its own thread; they only hand the
event to the event loop (``call_soon_threadsafe``). Everything else runs on the
broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import msgpack

from ..addresses import parse_broker_url
from ..client.connection import BrokerConnection, ConnectionClosed
from ..config import ConfigError, SlaveConfig, check_topic_name
from ..protocol import commands as c
from ..protocol.messages import ConfigRequest, NewsRequest, OffsetRequest, StreamRequest, TopicsRequest
from ..protocol.replication_stream import Append, Committed, StreamReceiver, SUBSCRIBING, encode_report
from ..store.manager import UnknownPartition, UnknownTopic
from ..zk.paths import ZkPaths
from .answerer import NotTheMaster
from .heartbeat import SlaveHeartbeat
from .host import BrokerHost
from .peers import open_peer
from .config_sync import adopt_master_topics, save_master_copy, topics_for_master_layout
from .replica import MasterLacksPartition, PartitionReplica, ReplicaDiverged, StaleMaster
from .stream import ModeEvent

if TYPE_CHECKING:
    from kazoo.client import KazooClient

log = logging.getLogger(__name__)

#: A stream report's header: one-way, so no opaque of its own.
STREAM_ACK = {"op": "stream_ack", "opaque": 0}
RETRIABLE = (ConnectionClosed, ConnectionError, asyncio.TimeoutError, OSError)
#: Async mode: after a fetch smaller than this, wait LINGER_S before the next one.
BATCH_BYTES = 256 * 1024
LINGER_S = 0.002
#: At most this many fetches parked on the master at once (busy partitions), and this many
#: that do not park (catching up, or a first look), whatever the partition count: well under
#: the master's maxRequestsInFlight (default 1,000), which at 2,000 long-polls stopped it
#: reading the slave's connection. Every other partition is quiet (``news``).
MAX_PARKED_FETCHES = 256
MAX_PLAIN_FETCHES = 32
#: Partitions whose replication starts at once (each: an epochs request, an offset request
#: for a new log); one at a time, a slave of 10,000 partitions took minutes to start.
START_CONCURRENCY = 32
#: Offset requests in flight at once while the logs of new partitions are laid out (well
#: under the master's maxRequestsInFlight, default 1,000).
OLDEST_OFFSET_REQUESTS = 256


#: Longest wait between fetches of a partition while the broker we follow refuses as not the master.
NOT_MASTER_WAIT_MAX_S = 5.0
#: Longest wait between attempts to adopt a master config that failed to parse.
CONFIG_RETRY_MAX_S = 5.0
#: More partitions than this in a topics reply is not a broker talking.
MAX_PARTITIONS = 10_000


def checked_topics(topics: Any) -> dict[str, int]:
    """A master's ``topics`` reply, every name a valid topic name (ValueError otherwise).

    Names become directories on this broker: a name with a path in it must never get that far.
    """
    if not isinstance(topics, dict):
        raise ValueError(f"the master's topics reply is not a map: {type(topics).__name__}")
    for name, partitions in topics.items():
        check_topic_name(name)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"topic {name!r}: partition count must be 1..{MAX_PARTITIONS}, got {partitions!r}")
    return topics


#: Copies the master's epoch history of one partition over an open connection.
AdoptEpochs = Callable[[BrokerConnection, str, int], Awaitable[None]]


class MasterFollower:
    def __init__(
        self,
        host: BrokerHost,
        slave: SlaveConfig,
        zk: "KazooClient",
        paths: ZkPaths,
        epoch: Callable[[], int],
        adopt_epochs: AdoptEpochs,
        on_stale_master: Callable[[], None],
    ) -> None:
        self.host = host
        self.slave = slave
        self.zk = zk
        self.paths = paths
        self.broker_id = host.config.broker_id
        self._epoch = epoch
        self._adopt_epochs = adopt_epochs
        self._on_stale_master = on_stale_master
        self.master_url: str | None = None
        self.master_config_checksum: str | None = None
        self.master_mode = "async"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: BrokerConnection | None = None
        self._conn_lock = asyncio.Lock()
        self._sync_task: asyncio.Task[None] | None = None
        # Quiet partitions (``news``): how many fetches are out, the partitions to be named in
        # the next ``news``, and how many partitions wait quiet or streamed (each its task's
        # future or stream is on its run).
        self._parked_fetches = 0
        self._plain_fetches = asyncio.Semaphore(MAX_PLAIN_FETCHES)
        self._news_outbox = NewsOutbox()
        self._on_news = 0
        self._news_task: asyncio.Task[None] | None = None
        self._news_kick: asyncio.Future[None] | None = None
        self._news_latest: asyncio.Future[Any] | None = None
        self._news_conn: BrokerConnection | None = None
        #: False once the master answered ``news`` with "unknown command" (an older version):
        #: every partition then keeps a fetch parked, as before.
        self.news_supported = True
        #: The master offers the replication stream (its ``topics`` reply), and knows ``stream``.
        self.master_streams = False
        self.stream_supported = True
        #: Chunks appended from replication streams.
        self.stream_frames = 0
        #: Async mode: times a fetch waited LINGER_S for puts to gather (never in sync mode).
        self.lingers = 0
        #: Bumped each time following stops. Every loop of a task also ends once its generation
        #: is gone: a task whose cancellation is lost (in Python 3.11 ``asyncio.wait_for`` can
        #: swallow a cancel that races its result) must not fetch on forever, nor hold up
        #: ``_stop_following``, and with it the HA coordinator's event worker, for good.
        self._generation = 0
        self._stopped = False
        #: Why the master's config could not be adopted (None: it was); shown in stats.
        self.config_sync_error: str | None = None
        # UDP heartbeats to the current master: lag figures only (roles are ZooKeeper's).
        self.heartbeat = SlaveHeartbeat(
            self.broker_id, slave.slave_id, epoch, key=host.security.heartbeat_key, positions=HeartbeatPositions(self),
        )
        #: Partitions appended since the heartbeat last asked (``HeartbeatPositions.moved``).
        self.appended_since_beat: set[tuple[str, int]] = set()
        #: The heartbeat rotation's list of this follower's partitions; None: build it again
        #: (a replica was added or dropped).
        self.reported_keys: list[tuple[str, int]] | None = None

    @property
    def replicas(self) -> dict[tuple[str, int], PartitionReplica]:
        """This follower's replicas by partition. Each lives in its partition's replication record
        (metaq/ha/record.py, ``following``), so a dropped partition takes its replica along; this
        walks every record (status, heartbeats, checks), the per-fetch paths use ``_replica``."""
        return {key: record.following.replica for key, record in self.host.partitions.replications()
                if record.following is not None and record.following.follower is self}

    def _runs(self) -> list[ReplicaRun]:
        """This follower's runs, one per partition it replicates (a walk over every record)."""
        return [record.following for _key, record in self.host.partitions.replications()
                if record.following is not None and record.following.follower is self]

    def _run(self, key: tuple[str, int]) -> ReplicaRun | None:
        """This follower's run of one partition, or None (one lookup: per fetch, per news)."""
        record = self.host.partitions.replication(*key)
        run = record.following if record is not None else None
        return run if run is not None and run.follower is self else None

    def _replica(self, key: tuple[str, int]) -> PartitionReplica | None:
        """This follower's replica of one partition, or None."""
        run = self._run(key)
        return run.replica if run is not None else None

    def _running(self, key: tuple[str, int]) -> bool:
        """Whether this follower started the partition's fetch task in this following (it stays
        started, even once its task ended, until following stops or the partition is dropped)."""
        run = self._run(key)
        return run is not None and run.task is not None

    def _appended(self, topic: str, partition: int) -> None:
        """A replica appended: its position goes with the next heartbeat; parked fetches wake."""
        self.appended_since_beat.add((topic, partition))
        self.host.notify(topic, partition)

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Watch the master's config checksum; which master to follow is the HA coordinator's call."""
        self._loop = asyncio.get_running_loop()
        checksum_path = self.paths.master_config_checksum(self.broker_id)
        await asyncio.to_thread(self.zk.DataWatch, checksum_path, self._watch(self._on_checksum))

    async def stop(self) -> None:
        self._stopped = True
        await self.heartbeat.stop()
        await self._stop_following()
        # Stopped for good (a new slave id gets a new follower): its runs leave the records.
        for _key, record in self.host.partitions.replications():
            if record.following is not None and record.following.follower is self:
                record.following = None
        self.reported_keys = None

    def _watch(self, handler: Any) -> Any:
        def watcher(data: bytes | None, _stat: Any, *_: Any) -> bool:
            if self._stopped or self._loop is None or self._loop.is_closed():
                return False
            self._loop.call_soon_threadsafe(handler, data)
            return True

        return watcher

    # --- ZooKeeper events -------------------------------------------------------------

    async def follow(self, url: str) -> None:
        """Replicate from the master at ``url`` (the coordinator has truncated our logs against it)."""
        await self._set_master(url)

    async def unfollow(self) -> None:
        """Stop replicating (the master is gone, or we are about to lead); reads stay up."""
        await self._set_master(None)

    async def _set_master(self, url: str | None) -> None:
        if url == self.master_url and (url is None or self._sync_task or any(run.task for run in self._runs())):
            return
        log.info("broker %d %s", self.broker_id, f"follows the master at {url}" if url else "follows no master")
        self.master_url = url
        try:
            self.heartbeat.retarget(parse_broker_url(url) if url else None)
        except ValueError as exc:
            log.warning("no heartbeats to the master: %s", exc)
            self.heartbeat.retarget(None)
        await self._restart_following()

    def resync_topics(self) -> None:
        """Re-read the master's topics now (the group's topic configuration changed)."""
        if self.master_url is not None and not self._stopped:
            self._schedule_topic_sync()

    def forget_partitions(self, keys: list[tuple[str, int]]) -> None:
        """Partitions no longer served (topic deleted or re-created): their runs went with their
        records (``Partitions.drop``, called first: ``ReplicaRun.dropped`` cancelled their
        tasks, and a stopped replica of a deleted topic is no reason to refuse a take-over,
        ``HaCoordinator._consider_election``); the heartbeat's rotation is built again."""
        self.reported_keys = None

    def _on_checksum(self, data: bytes | None) -> None:
        checksum = data.decode("utf-8") if data else None
        changed = checksum is not None and checksum != self.master_config_checksum
        self.master_config_checksum = checksum
        if changed and self.master_url is not None:
            log.info("master config checksum is now %s; re-reading the master's topics", checksum)
            self._schedule_topic_sync()

    # --- following ----------------------------------------------------------------------

    async def _restart_following(self) -> None:
        await self._stop_following()
        if self.master_url is not None and not self._stopped:
            self._schedule_topic_sync()

    async def _stop_following(self) -> None:
        self._generation += 1
        tasks = []
        for run in self._runs():
            if run.task is not None:
                tasks.append(run.task)
                run.task = None
        if self._sync_task is not None:
            tasks.append(self._sync_task)
        if self._news_task is not None:
            tasks.append(self._news_task)
        self._sync_task = self._news_task = None
        self._news_outbox.clear()
        self._news_conn = None
        self.news_supported = True
        self.stream_supported = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _schedule_topic_sync(self) -> None:
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = asyncio.ensure_future(self._sync_topics_until_done(self._generation))

    async def _sync_topics_until_done(self, generation: int) -> None:
        """Read (and adopt) the master's topics until it works; nothing the master sends ends this task."""
        delay = 0.05
        waiting_for: str | None = None
        while not self._stopped and self.master_url is not None and generation == self._generation:
            try:
                await self._sync_topics()
                self.config_sync_error = None
                return
            except NotTheMaster as exc:  # its epochs (follower start): ZooKeeper is asked who leads
                self._master_refused(exc, generation)
                max_delay = NOT_MASTER_WAIT_MAX_S
            except MasterLacksPartition as exc:
                # The master has not applied a topic's re-create (or we have not): said once.
                if str(exc) != waiting_for:
                    log.info("%s; asking again", exc)
                waiting_for = str(exc)
                max_delay = max(self.slave.slave_max_delay_ms, 50) / 1000
            except RETRIABLE as exc:
                log.warning("cannot read the master's topics yet: %s", exc)
                max_delay = max(self.slave.slave_max_delay_ms, 50) / 1000
            except (UnknownTopic, UnknownPartition) as exc:
                # The topic configuration changed while we read the master's: read it again.
                log.debug("topics changed while syncing them: %s", exc)
                max_delay = max(self.slave.slave_max_delay_ms, 50) / 1000
            except (ConfigError, ValueError, KeyError, TypeError) as exc:
                # A config (or topic list) we cannot use: keep replicating what we have,
                # say so in stats, and try again (the master may fix its file).
                if str(exc) != self.config_sync_error:
                    log.error("cannot adopt the master's config, retrying: %s", exc)
                self.config_sync_error = str(exc)
                max_delay = CONFIG_RETRY_MAX_S
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)

    async def _connection(self) -> BrokerConnection:
        async with self._conn_lock:
            if self._conn is not None and self._conn.is_open:
                return self._conn
            if self.master_url is None:
                raise ConnectionClosed("no master registered")
            # Authenticated as a broker of our group (security on) before we fetch a byte.
            self._conn = await open_peer(self.host, self.master_url, self.slave.slave_id)
            return self._conn

    async def _sync_topics(self) -> None:
        conn = await self._connection()
        reply = await conn.request(TopicsRequest().to_header(), timeout=10)
        if not reply.ok:
            raise ConnectionError(f"master answered topics with {reply.code}: {reply.message}")
        master_topics = checked_topics(reply.get("topics"))
        self.master_mode = reply.get("replication_mode", "async")
        self.master_streams = reply.get("replication_stream") is True
        own = self.host.config
        if self.slave.auto_sync_master_config:
            config_reply = await conn.request(ConfigRequest().to_header(), timeout=10)
            if not config_reply.ok:
                raise ConnectionError(f"master answered config with {config_reply.code}: {config_reply.message}")
            topics = adopt_master_topics(own, bytes(config_reply.body))
            save_master_copy(own, bytes(config_reply.body))
        else:
            topics = topics_for_master_layout(own, master_topics)
        await self.host.update_topics(topics)
        theirs = reply.get("incarnations")
        theirs = theirs if isinstance(theirs, dict) else {}
        other_lives = []
        starting: list[tuple[str, int]] = []
        for topic, partitions in sorted(master_topics.items()):
            served = self.host.config.topics.get(topic)
            if served is not None and served.incarnation and theirs.get(topic, served.incarnation) != served.incarnation:
                other_lives.append(topic)  # its offsets and epochs are of another log than ours
                continue
            # Only partitions this broker serves too: the master may still serve a topic the
            # group's configuration deleted (it applies the change a moment later), or not yet
            # serve one it added.
            starting += [(topic, partition)
                         for partition in range(min(partitions, served.num_partitions if served is not None else 0))
                         if not self._running((topic, partition))]
        await self._start_partitions(conn, starting)
        # A topic created at run time (it has an incarnation) that we serve and the master does
        # not list: it has not applied the creation or re-creation yet. Asked again until it
        # does; nothing else would bring us back (campaign seed 3042: the master's config
        # checksum went A -> B -> A over a delete and re-create, its watch saw no change, and
        # the re-created partition was never replicated).
        not_yet = sorted(name for name, topic in self.host.config.topics.items()
                         if topic.incarnation and name not in master_topics)
        # The same for partitions added at run time: the master lists fewer than we serve
        # (campaign seed 3048: a slave started after an add-partitions, the master not yet
        # serving it, copied only the old partitions, and nothing asked again).
        fewer = sorted(f"{name}-{master_topics[name]}..{topic.num_partitions - 1}"
                       for name, topic in self.host.config.topics.items()
                       if topic.incarnation and name in master_topics and name not in other_lives
                       and master_topics[name] < topic.num_partitions)
        if other_lives or not_yet or fewer:
            raise MasterLacksPartition(
                "; ".join(part for part in (
                    f"the master serves another incarnation of {', '.join(other_lives)} (deleted and re-created;"
                    " one of us has not applied it yet)" if other_lives else "",
                    f"the master does not serve {', '.join(not_yet)} yet (created or re-created; it has not applied it"
                    " yet)" if not_yet else "",
                    f"the master does not serve partitions {', '.join(fewer)} yet (added; it has not applied it yet)"
                    if fewer else "",
                ) if part))

    async def _start_partitions(self, conn: BrokerConnection, keys: list[tuple[str, int]]) -> None:
        """Start replicating ``keys``, START_CONCURRENCY at a time (the first failure is raised
        once all have been tried: the topic sync retries, and started ones stay started)."""
        if not keys:
            return
        began = time.monotonic()
        await self._create_missing_logs(conn, keys)
        slots = asyncio.Semaphore(START_CONCURRENCY)

        async def start(key: tuple[str, int]) -> None:
            async with slots:
                if not self._running(key):
                    await self._start_partition(conn, *key)

        results = await asyncio.gather(*(start(key) for key in keys), return_exceptions=True)
        failed = [result for result in results if isinstance(result, BaseException)]
        started = len(keys) - len(failed)
        log.info("broker %d started replicating %d partitions from %s in %.1f s (%d replicating)",
                 self.broker_id, started, self.master_url, time.monotonic() - began,
                 sum(1 for run in self._runs() if run.task is not None))
        if failed:
            raise failed[0]

    async def _oldest_offset(self, conn: BrokerConnection, topic: str, partition: int) -> int:
        """Where an empty replica of the partition starts: the master's oldest retained offset,
        so its offsets are the master's from the first byte (MetaQ's handleMassageFiles)."""
        reply = await conn.request(OffsetRequest(topic=topic, partition=partition, offset=0).to_header(), timeout=10)
        return int(reply.get("min_offset", 0)) if reply.ok else 0

    async def _create_missing_logs(self, conn: BrokerConnection, keys: list[tuple[str, int]]) -> None:
        """Lay out the logs of every partition in ``keys`` this broker has none of, in one
        ``create_logs`` batch (its fsyncs bounded however many there are): an empty slave of a
        topic of 10,000 partitions creates them at once, not START_CONCURRENCY at a time. A
        partition whose offset request failed is left to ``_start_partition``."""
        store = self.host.store
        missing = [key for key in keys if not self._running(key) and not store.has_log(*key)]
        if not missing:
            return
        slots = asyncio.Semaphore(OLDEST_OFFSET_REQUESTS)

        async def wanted(topic: str, partition: int) -> tuple[str, int, int]:
            async with slots:
                return topic, partition, await self._oldest_offset(conn, topic, partition)

        results = await asyncio.gather(*(wanted(*key) for key in missing), return_exceptions=True)
        try:
            await store.create_logs([result for result in results if not isinstance(result, BaseException)])
        except (OSError, UnknownTopic, UnknownPartition) as exc:
            # Each partition then tries its own (and says why it cannot start).
            log.warning("could not lay out the logs of %d new partitions at once: %s", len(missing), exc)

    async def _start_partition(self, conn: BrokerConnection, topic: str, partition: int) -> None:
        store = self.host.store
        if not store.has_log(topic, partition):
            # Not laid out with the others (its offset request failed, or the topic changed).
            start = await self._oldest_offset(conn, topic, partition)
            await store.create_log(topic, partition, start_offset=start)  # batched with the others starting
        await self._adopt_epochs(conn, topic, partition)
        record = self.host.partitions.replication(topic, partition)
        if record is None:
            return  # dropped meanwhile (its topic deleted while this partition started)
        run = record.following if record.following is not None and record.following.follower is self else None
        if run is None:
            replica = PartitionReplica(
                topic,
                partition,
                self.host.partitions.get(topic, partition),
                store.flusher(topic, partition),
                self._replica_info,
                self._appended,
                self.slave.slave_max_delay_ms,
                incarnation=store.topic_config(topic).incarnation,
            )
            replica.status.extra["started_at"] = time.time()
            run = record.following = ReplicaRun(self, replica)  # an earlier follower's run, if any, is replaced
            self.reported_keys = None
        replica = run.replica
        if replica.stopped:
            return
        replica.report_positions = self.master_mode == "sync"  # acks wait on our position
        replica.durable_positions = replica.report_positions and replica.flusher.group_commit
        replica.status.state = "following"
        run.task = asyncio.ensure_future(self._replicate(run, self._generation))
        if self._news_task is None or self._news_task.done():
            self._news_task = asyncio.ensure_future(self._poll_news(self._generation))

    def _replica_info(self) -> dict[str, Any]:
        return {"slave_id": self.slave.slave_id, "epoch": self._epoch()}

    async def _replicate(self, run: ReplicaRun, generation: int) -> None:
        """Fetch until following stops or the partition is forgotten; back off (up to
        slaveMaxDelayInMills) only after errors.

        A partition keeps a fetch parked on the master while it is busy (its last fetch
        appended, or news woke it) and a slot is free (MAX_PARKED_FETCHES); otherwise it
        fetches without waiting. A fetch that finds nothing makes it quiet: it waits for the
        master's ``news`` instead (``_quiet_until_news``), so idle partitions cost nothing per partition.
        """
        replica = run.replica
        max_delay = max(self.slave.slave_max_delay_ms, 10) / 1000
        delay = 0.0
        key = (replica.topic, replica.partition)
        busy = False
        while not self._stopped and generation == self._generation and self._run(key) is run:
            try:
                conn = await self._connection()
                appended = replica.log.log_end
                await self._fetch(replica, conn, park=busy or not self.news_supported)
                delay = 0.0
                busy = replica.log.log_end > appended
                if self._may_stream(replica):
                    await self._stream_until_closed(run, conn)
                    busy = True  # fetch from the log end at once: the stream may have closed mid-put
                elif busy:
                    if self.master_mode != "sync" and replica.log.log_end - appended < BATCH_BYTES:
                        # Async: nobody waits for our position, so let a busy master's puts
                        # gather for a moment instead of fetching them one small reply at a time.
                        self.lingers += 1
                        await asyncio.sleep(LINGER_S)
                elif self.news_supported:
                    busy = await self._quiet_until_news(run, conn)
            except ReplicaDiverged as exc:
                replica.stop(str(exc))
                return
            except NotTheMaster as exc:
                self._master_refused(exc, generation)
                delay = min(max(delay * 2, max_delay), NOT_MASTER_WAIT_MAX_S)  # until ZooKeeper is read again
                await asyncio.sleep(delay)
            except StaleMaster as exc:
                log.warning("%s; re-checking who leads", exc)
                self._on_stale_master()
                await asyncio.sleep(max_delay)
            except RETRIABLE as exc:
                delay = min(max(delay * 2, max_delay / 10), max_delay)
                log.debug("%s: fetch failed (%s); retrying in %.0f ms", replica.name, exc, delay * 1000)
                await asyncio.sleep(delay)

    #: The generation of following in which the master we follow refused as not the master.
    _refused_in = -1

    def _master_refused(self, exc: NotTheMaster, generation: int) -> None:
        """The broker we follow says it is not the master (``403 reason: not_master``), or answered
        as another role or epoch: said once per following (not per partition, nor per retry), and
        the coordinator reads ZooKeeper's master node again. Whom we follow is ZooKeeper's word,
        never this peer's: until the coordinator decides, every partition backs off (doubling up
        to NOT_MASTER_WAIT_MAX_S)."""
        if self._refused_in == generation:
            return
        self._refused_in = generation
        log.warning("%s; asking ZooKeeper who leads", exc)
        self._on_stale_master()

    async def _fetch(self, replica: PartitionReplica, conn: BrokerConnection, park: bool) -> None:
        """One fetch of ``replica``: parked if asked and a slot is free, else a plain one."""
        if park and (self._parked_fetches < MAX_PARKED_FETCHES or not self.news_supported):
            self._parked_fetches += 1
            try:
                await replica.fetch_once(conn, wait=True)
            finally:
                self._parked_fetches -= 1
            return
        async with self._plain_fetches:
            await replica.fetch_once(conn, wait=False)

    # --- the replication stream (metaq/ha/stream.py) ----------------------------------------

    def _may_stream(self, replica: PartitionReplica) -> bool:
        """Caught up with a sync master that offers the stream, positions reported as appended
        (a slave that reports only fsynced positions keeps fetching)."""
        return (self.master_streams and self.stream_supported and replica.report_positions
                and not replica.durable_positions and not replica.stopped
                and replica.log.log_end >= replica.status.master_log_end)

    async def _stream_until_closed(self, run: ReplicaRun, conn: BrokerConnection) -> None:
        """Subscribe to the stream of ``run``'s replica and append what it carries, in the
        connection's protocol callback, until either side has a doubt (then the caller fetches)."""
        replica = run.replica
        ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        epoch = self._epoch()
        receiver = StreamReceiver(0, epoch)
        replica.mode.apply(ModeEvent.CAUGHT_UP)

        def end(reason: str) -> None:
            conn.streams.pop(receiver.stream_id, None)
            if run.close_stream is end:
                run.close_stream = None
            receiver.close(reason)
            replica.mode.apply(ModeEvent.DOUBT)
            if not ended.done():
                ended.set_result(reason)

        def on_frame(header: dict[str, Any] | None, body: bytearray | None) -> None:
            if header is None or body is None:
                end("the connection to the master was lost")
            elif receiver.state == SUBSCRIBING:
                self._subscribed(replica, receiver, header, end)
            else:
                self._streamed(replica, receiver, conn, header, body, end)

        header = StreamRequest(
            topic=replica.topic, partition=replica.partition,
            replica={**self._replica_info(), "log_end": replica.log.log_end, **replica._incarnation_field()},
        ).to_header()
        receiver.stream_id, reply = conn.subscribe(header, on_frame)
        reply.add_done_callback(_ignore_outcome)
        run.close_stream = end
        # A streamed partition sends nothing while idle: the (then empty) news poll keeps the
        # master hearing from us every slaveMaxDelayInMills, as the sync set counts on.
        self._on_news += 1
        self._kick_news()
        try:
            reason = await ended
            log.info("%s: replication stream closed (%s); fetching", replica.name, reason)
        finally:
            self._on_news -= 1
            end("replication of the partition stopped")

    def _subscribed(self, replica: PartitionReplica, receiver: StreamReceiver, header: dict[str, Any],
                    end: Callable[[str], None]) -> None:
        ok = header.get("code") == c.OK
        message = str(header.get("msg", ""))
        receiver.accepted(ok, message)
        if not ok:
            if header.get("code") == c.BAD_REQUEST and "unknown command" in message:
                self.stream_supported = False  # an older master: fetching only
            replica.mode.apply(ModeEvent.REFUSED)
            end(f"subscription refused: {message}")
            return
        replica.mode.apply(ModeEvent.ACCEPTED)
        committed = header.get("committed")
        if isinstance(committed, int):
            replica.note_committed(committed)

    def _streamed(self, replica: PartitionReplica, receiver: StreamReceiver, conn: BrokerConnection,
                  header: dict[str, Any], body: bytearray, end: Callable[[str], None]) -> None:
        """One frame of an open stream: append and report, take the committed offset, or end."""
        result = receiver.frame(header, body, replica.log.log_end)
        if isinstance(result, Committed):
            replica.note_committed(result.offset)
            return
        if not isinstance(result, Append):
            end(result.reason)
            return
        committed = header.get("committed")
        if isinstance(committed, int) and committed > replica.status.master_committed:
            replica.status.master_committed = committed  # consumers are woken by the append below
        try:
            count = replica.append_streamed(result.end - len(result.data), result.data)
        except OSError as exc:
            log.error("%s: appending a streamed chunk failed: %s", replica.name, exc)
            end(f"append failed: {exc}")
            return
        if count is None:
            end("a chunk whose records are not whole and valid")
            return
        try:
            # The report right after the append, before any bookkeeping: the master releases
            # sync waiters on it.
            conn.send_oneway(STREAM_ACK, encode_report(receiver.stream_id, receiver.epoch, result.end))
        except ConnectionClosed:
            end("the connection to the master is closed")
        self.stream_frames += 1
        replica.streamed(result.end, len(result.data), count)

    # --- quiet partitions (news) -----------------------------------------------------------

    async def _quiet_until_news(self, run: ReplicaRun, conn: BrokerConnection) -> bool:
        """Wait, fetching nothing, until the master has news for ``run``'s partition; True: it has
        (the partition is busy again), False: look again (the news session was lost, or refused)."""
        replica = run.replica
        if conn is not self._news_conn and self._news_conn is not None:
            # The news request still runs on an older connection, whose registrations the
            # master dropped with it: it learns of the new one, and this partition waits.
            self._news_conn = None
            self._kick_news()
        woken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        run.woken = woken
        self._news_outbox.add(run, [replica.topic, replica.partition, replica.log.log_end,
                                    replica.status.master_committed, replica.incarnation])
        self._on_news += 1
        self._kick_news()
        try:
            return await woken
        finally:
            self._on_news -= 1
            if run.woken is woken:
                run.woken = None  # its registration, if not sent yet, is dropped by the next poll

    def _wake(self, key: tuple[str, int], news: bool) -> None:
        run = self._run(key)
        if run is not None:
            _wake_run(run, news)

    def corruption_found(self, topic: str, partition: int) -> None:
        """Bytes of a partition were found corrupt (metaq/store/scrub.py): a quiet or streaming
        replica fetches now, which cuts them and copies them again
        (``PartitionReplica._repair_corruption``), instead of at the partition's next news."""
        run = self._run((topic, partition))
        if run is None:
            return
        _wake_run(run, news=True)
        if run.close_stream is not None:
            run.close_stream("corrupt bytes found: repairing by fetching")

    def _wake_all(self) -> None:
        """Every quiet partition looks again (it fetches once, then registers again if still
        idle). A walk over every record: only on a new news session or a failed one, which
        costs a fetch of every quiet partition anyway."""
        for run in self._runs():
            if run.woken is not None:
                _wake_run(run, news=False)
        self._news_outbox.clear()

    def _kick_news(self) -> None:
        kick = self._news_kick
        if kick is not None and not kick.done():
            kick.set_result(None)

    async def _poll_news(self, generation: int) -> None:
        """The one ``news`` request of this slave: names partitions that went quiet, and wakes
        those the master has news for. A newer request answers the older one on the master, so
        a registration never waits for the parked poll to end."""
        loop = asyncio.get_running_loop()
        # Parked as long as a fetch would be: the master hears from an idle slave as often as
        # it did when every partition long-polled (syncSlaveTimeoutMs counts on it).
        wait_ms = max(self.slave.slave_max_delay_ms, 10)
        max_delay = wait_ms / 1000
        while not self._stopped and generation == self._generation and self.news_supported:
            self._news_kick = kick = loop.create_future()
            try:
                conn = await self._connection()
                if conn is not self._news_conn:
                    # A new connection: the master forgot what the old one registered.
                    self._news_conn = conn
                    self._wake_all()
                if not self._on_news:
                    await kick  # nothing quiet or streamed: no need to ask
                    continue
                entries = self._news_outbox.drain()
                header = NewsRequest(replica=self._replica_info(), max_wait_ms=wait_ms).to_header()
                answer = self._news_latest = conn.send(header, msgpack.packb(entries))
                answer.add_done_callback(lambda done, conn=conn: self._news_answered(conn, done))
                await asyncio.wait_for(asyncio.shield(kick), timeout=max_delay + 30)
            except RETRIABLE as exc:
                log.debug("news request failed (%s); retrying", exc)
                self._wake_all()
                await asyncio.sleep(max_delay / 10)

    def _news_answered(self, conn: BrokerConnection, answer: "asyncio.Future[Any]") -> None:
        latest = answer is self._news_latest
        if answer.cancelled() or answer.exception() is not None:
            if latest:
                self._news_conn = None  # the next poll wakes every quiet partition
                self._kick_news()
            return
        reply = answer.result()
        if reply.ok:
            try:
                news = msgpack.unpackb(reply.body)
                for topic, partition in news:
                    self._wake((topic, partition), news=True)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                log.warning("master's news reply is not a list of partitions (%s); every quiet partition looks again", exc)
                self._wake_all()
        else:
            if reply.code == c.BAD_REQUEST and "unknown command" in reply.message:
                log.info("the master at %s does not know 'news' (an older version): a fetch stays parked on every partition",
                         self.master_url)
                self.news_supported = False
            else:
                # Refused (epoch, role, registration): each partition's own fetch hears why.
                log.info("master refused news (%d %s); every quiet partition looks again", reply.code, reply.message)
            self._wake_all()
        if latest:
            self._kick_news()

    # --- status -------------------------------------------------------------------------

    def committed_seen(self, topic: str, partition: int) -> int:
        """The highest committed offset a master we followed has told us for this partition."""
        replica = self._replica((topic, partition))
        return replica.status.master_committed if replica is not None else 0

    def committed(self, topic: str, partition: int, log_end: int) -> int:
        """What consumers of this slave may read of a partition."""
        replica = self._replica((topic, partition))
        if replica is None:
            return log_end if self.master_url is None else 0
        # Invariant: a slave serves no more than the last committed offset a master told it,
        # also while it follows no master (orphaned, electing, truncating against the next
        # one). Its log is a prefix of the master it followed, but its tail past that
        # offset may be missing from another sync-set slave, which the election may promote
        # and which then writes other records there: a read of that tail would be taken back
        # (sync mode promises none). A deposed master's own term is bounded by
        # HaNode._deposed_bound as well. In async mode a master acks what no slave holds and
        # the next master may lack any tail (guarantees A1/A3): a masterless slave serves what
        # it holds, as it always did.
        if self.master_url is None and self.master_mode != "sync":
            return log_end
        return replica.committed()

    def _master_end(self, topic: str, partition: int, replica: PartitionReplica) -> int:
        """The master's log end of a partition: the freshest of what the last fetch and the last heartbeat said."""
        hb = self.heartbeat.master
        return max(replica.status.master_log_end, hb.log_ends.get((topic, partition), 0) if hb else 0)

    def never_caught_up(self) -> list[str]:
        """The partitions (``topic-partition``) behind the master whose replica never reached
        the master's log end since this process started (the election rules ask)."""
        return sorted(r.name for (t, p), r in self.replicas.items()
                      if not r.stopped and not r.status.caught_up_at and self._master_end(t, p, r) > r.log.log_end)

    def lag_bytes(self) -> int:
        """Bytes behind the master over every followed partition, as this follower last knew."""
        return sum(max(0, self._master_end(t, p, r) - r.log.log_end) for (t, p), r in self.replicas.items())

    def status_pairs(self) -> list[tuple[str, object]]:
        pairs: list[tuple[str, object]] = [("master", self.master_url or "-")]
        if self.config_sync_error is not None:
            pairs.append(("config_sync_error", self.config_sync_error))
        pairs += self.heartbeat.status_pairs()
        pairs.append(("replication_stream_frames", self.stream_frames))
        pairs.append(("replication_lingers", self.lingers))
        hb_age = self.heartbeat.heartbeat_age_ms()
        now = time.time()
        for (topic, partition), replica in sorted(self.replicas.items()):
            st = replica.status
            log_end = replica.log.log_end
            master_end = self._master_end(topic, partition, replica)
            lag = max(0, master_end - log_end)
            since = st.caught_up_at or st.extra.get("started_at", now)
            lag_ms = 0.0 if lag == 0 else max(0.0, now - since) * 1000
            row: dict[str, object] = {
                "state": st.state,
                "log_end": log_end,
                "master_log_end": master_end,
                "lag_bytes": lag,
                "lag_ms": round(lag_ms),
                "heartbeat_age_ms": -1 if hb_age is None else round(hb_age),
                "appended_messages": st.appended_messages,
                "divergences": st.divergences,
                "mode": replica.mode.mode.value,
            }
            if st.error:
                row["error"] = st.error
            pairs.append((f"replica {topic}-{self.broker_id}-{partition}", row))
        return pairs


class ReplicaRun:
    """One partition as one follower copies it: the slave side of its replication record
    (``ReplicationRecord.following``), written only by that follower (``follower``).

    ``replica``: the ``PartitionReplica``; ``task``: its fetch task in this following (None
    before it starts and once following stops); ``woken``: while quiet, the future that task
    waits on for news; ``registration``: what the next ``news`` names of it (set exactly
    while it is in the follower's ``NewsOutbox``); ``close_stream``: while streamed, the
    stream's closer. Cost: six slots per partition, no task of its own beyond the fetch task."""

    __slots__ = ("follower", "replica", "task", "woken", "registration", "close_stream")

    def __init__(self, follower: MasterFollower, replica: PartitionReplica) -> None:
        self.follower = follower
        self.replica = replica
        self.task: asyncio.Task[None] | None = None
        self.woken: asyncio.Future[bool] | None = None
        self.registration: list[Any] | None = None
        self.close_stream: Callable[[str], None] | None = None

    def dropped(self) -> None:
        """Its partition is no longer served (``ReplicationRecord.close``): the fetch task is
        cancelled, at its next await (appends are synchronous: none runs after this); its quiet
        wait or stream ends with it."""
        task, self.task = self.task, None
        if task is not None:
            task.cancel()


class NewsOutbox:
    """What the follower's next ``news`` request names: the runs of partitions that went quiet
    since the last one. Invariant: a run is in it at most once, exactly while its
    ``registration`` is set (``add`` appends only a run without one), so it never holds more
    runs than the follower has partitions; every poll drains it, naming only the runs still quiet."""

    def __init__(self) -> None:
        self._runs: list[ReplicaRun] = []

    def add(self, run: ReplicaRun, registration: list[Any]) -> None:
        if run.registration is None:
            self._runs.append(run)
        run.registration = registration

    def drain(self) -> list[list[Any]]:
        """The registrations of the runs still quiet, each once; the outbox is then empty."""
        runs, self._runs = self._runs, []
        entries = []
        for run in runs:
            entry, run.registration = run.registration, None
            if entry is not None and run.woken is not None:
                entries.append(entry)
        return entries

    def clear(self) -> None:
        """Nothing registered is sent (following stopped, or every quiet partition looks again)."""
        runs, self._runs = self._runs, []
        for run in runs:
            run.registration = None


def _wake_run(run: ReplicaRun, news: bool) -> None:
    woken, run.woken = run.woken, None
    if woken is not None and not woken.done():
        woken.set_result(news)


def _ignore_outcome(future: "asyncio.Future[Any]") -> None:
    """A subscription's reply is handled by its stream callback; its future only ends."""
    if not future.cancelled():
        future.exception()


class HeartbeatPositions:
    """What the follower's heartbeat reports (heartbeat.py, ``ReplicaPositions``), without a
    walk over every partition per beat: the partitions that appended since the last beat,
    and the rotation's list of partitions, built again only when a replica came or went.
    Idle cost: a beat at 10,000 idle partitions looks at its slice of ~170 of them."""

    def __init__(self, follower: MasterFollower) -> None:
        self.follower = follower

    def keys(self) -> list[tuple[str, int]]:
        follower = self.follower
        if follower.reported_keys is None:
            follower.reported_keys = list(follower.replicas)
        return follower.reported_keys

    def moved(self) -> set[tuple[str, int]]:
        follower = self.follower
        moved, follower.appended_since_beat = follower.appended_since_beat, set()
        return moved

    def report(self, key: tuple[str, int]) -> tuple[int, str] | None:
        follower = self.follower
        replica = follower._replica(key)
        if replica is None:
            return None
        position = replica.position()
        if position < replica.log.log_end:
            # Reported once fsynced (durable positions): asked again next beat until it is.
            follower.appended_since_beat.add(key)
        return position, replica.incarnation
