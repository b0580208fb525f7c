"""``python -m chaos run``: workload + seeded fault schedule + final snapshot + the checker.

One run:

1. start the topology (chaos/cluster.py) in ``{out}/cluster``;
2. start the workload: raw producers (``r0``, ``r1``: ``BrokerConnection`` puts to the
   master registered in ZooKeeper; their acks carry the broker's ``epoch`` and url;
   chaos/raw_producer.py), one producer through the real client (``c0``:
   ``AsyncMessageProducer``), and one reader
   per group reading every partition from every replica (master and slaves, through the
   proxies), and one probe per group reading the newest acked message of each partition
   back from the current master every 0.25 s (what the liveness check awaits); every put
   is recorded invoke -> ok / fail (definitely not written) / info (unknown); every read
   with the replica it came from. By default no producer resends an unknown outcome
   (``retry_unknown_outcome=False``), so nothing is duplicated; ``--retry-unknown`` makes
   every producer resend unknown outcomes (at least once: duplicates are counted, and
   expected), ``--idempotent`` makes them idempotent producers that resend unknown outcomes
   (exactly once: a duplicate is a violation); with ``--consumer-group`` (on in ``random``)
   also consumer processes of one group, killed, stopped and restarted
   (chaos/group_consumer.py), whose polls feed the checker's consumer checks; with
   ``--transactions`` (on in ``random``) transactional producers (local ``x0``, ``x1``, XA ``xa0``,
   the zombie ``z0``; chaos/transactions.py) whose every transaction spreads its messages
   over two topics (the workload's and ``txn-b``), and one read-committed reader per group
   reading both topics from every replica (master and slaves); with
   ``--topic-ops`` (on in ``random``) each group's side topic created, grown, altered, deleted
   and re-created beside the faults, each operation's state checked on every member
   (chaos/topic_ops.py);
3. a monitor thread watches ZooKeeper and records every failover (with the old master's
   unreplicated tail: bytes and messages past the new master's epoch start, for async);
4. the fault schedule (chaos/scenarios.py) runs for ``--seconds``: inject, hold, heal, wait
   for the cluster to settle, a gap of plain load; each recorded as a fault with its step
   number, the groups it touches and what liveness expects of it. A fault that never heals
   (a member lost for good) ends the schedule; the load goes on until ``--seconds`` are up,
   and at least the liveness bound + 2 s;
5. stop the load, heal everything, wait until settled (one master per group, every broker
   registered, slaves in the sync set and caught up), let one consumer read the group to
   the end (``--consumer-group``), snapshot every replica's log from disk,
   write ``history.json``, ``check.json`` and ``report.txt``, run the checker.

Exit 0 iff the checker passes the history (``chaos.checker.check``: safety, liveness, progress
of every workload, a failover after every master fault held past the session timeout, and
what the runner recorded in ``meta["run_problems"]``: the cluster settled, no workload task
crashed, no commit the broker should have refused and, with ``--rogue``, no forgery accepted
and no broker's memory grown past the bound, chaos/hostile.py). The run, ``python -m chaos
check`` of its history and the campaign give that one verdict.
Exit 3 (nothing ran) when ``--hosts netns`` cannot make network namespaces here, with one
line on stderr saying why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import math
import random
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

from metaq.client import AsyncMessageSessionFactory, Message, MetaClientConfig, TransactionError, TransactionRolledBack
from metaq.client.connection import BrokerConnection, ConnectionClosed
from metaq.ha.epochs import EpochCache, EpochCacheError
from metaq.protocol import commands as c
from metaq.protocol.messages import EpochsRequest, GetRequest, OffsetRequest
from metaq.protocol.replies import aborted_spans
from metaq.record import RecordError, damaged_first_record, iter_records
from metaq.txn.reader import committed_records

from .anomalies import READ_COMMITTED
from .checker import check, duplicates_line, resends_line
from .cluster import HOSTS_MODES, ON_SYNC_SLAVE_LOSS, TXN_PARTITIONS, ChaosCluster
from .group_consumer import GROUP, ConsumerGroupLoad
from .history import History, group_of, record_value, value_of
from .hostile import HostileLoad
from .hosts import nft_unavailable
from .hosts import unavailable as hosts_unavailable
from .liveness import default_bound, render_table
from .raw_producer import ProducerSettings, RawProducer
from .topic_ops import SideTopicLoad
from .time_reads import TimeReadProber
from .scenarios import FAULTS, Step, inject, scenario_names, schedule, writes_expected
from .transactions import TXN_TIMEOUT_S, TransactionLoad, roll_back, send_values

log = logging.getLogger("chaos.runner")

#: ``--hosts netns`` where network namespaces cannot be made: nothing ran (not a pass, not a failure).
EXIT_SKIPPED = 3


def can_cut(hosts: str) -> bool:
    """Whether partitions can be injected: always through the proxy; on hosts of their own
    only where nftables works (without it ``random`` leaves them out, with one log line)."""
    if hosts != "netns":
        return True
    why_not = nft_unavailable()
    if why_not is not None:
        log.warning("--hosts netns: no partition faults (%s)", why_not)
    return why_not is None


class Monitor(threading.Thread):
    """Polls ZooKeeper: the current master per group (for the producers), failovers (history)."""

    def __init__(self, cluster: ChaosCluster, history: History) -> None:
        super().__init__(daemon=True, name="chaos-monitor")
        self.cluster = cluster
        self.history = history
        self.masters: dict[int, str | None] = {}
        self.replicas: dict[int, list[str]] = {}
        self._last: dict[int, str] = {}
        self._halt = threading.Event()
        self.failovers = 0

    def poll(self) -> None:
        for group in range(self.cluster.num_groups):
            view = self.cluster.view(group)
            if not self.cluster.zk.connected:
                # ZooKeeper unreachable (no quorum): the view is empty, not the group. Keep
                # the last one, so that readers and probes go on asking the same master.
                return
            self.masters[group] = view.master
            self.replicas[group] = [u for u in [view.master, *view.slaves.values()] if u]
            old = self._last.get(group)
            if view.master and old and view.master != old:
                self._failover(group, old, view.master, view.epoch)
            if view.master:
                self._last[group] = view.master

    def _failover(self, group: int, old_url: str, new_url: str, epoch: int) -> None:
        self.failovers += 1
        seen_at = self.history.now()  # measuring the lag below may take seconds
        old, new = self.cluster.by_url(old_url), self.cluster.by_url(new_url)
        lag: dict[str, dict[str, int]] = {}
        # The old master's logs are read first: it may come back, follow and truncate while
        # the new master is asked where its epoch began.
        # Every topic's partitions: a committed transaction's messages on the second topic
        # are acked writes that async_loss_bound judges by this lag too.
        partitions = self.cluster.partition_names(group)
        old_logs = {name: _log_or_none(old, topic, n) for topic, n, name in partitions} if old else {}
        starts = self._epoch_starts(new_url, new, [(topic, n) for topic, n, _name in partitions], epoch)
        for topic, n, name in partitions:
            start = starts[(topic, n)]
            if old is None or start is None:
                continue
            old_log = old_logs[name]
            if old_log is None:
                continue
            lag[name] = {"bytes": max(0, len(old_log) - start),
                         "messages": sum(1 for _ in iter_records(old_log[start:], start, verify=False))}
        self.history.failover(group, old_url, new_url, epoch, lag, at=seen_at,
                              old_broker=old.name if old else None, new_broker=new.name if new else None)
        log.info("failover in group %d: %s -> %s (epoch %d) lag %s", group, old_url, new_url, epoch, lag)

    def _epoch_starts(self, new_url: str, new: Any, keys: list[tuple[str, int]], epoch: int) -> dict[tuple[str, int], int | None]:
        """Where the new master's epoch began in each partition: asked of it, every partition
        at once (a just-elected master on a loaded machine may answer slowly: asked again, at
        most 2 + 4 + 8 s in all, whatever the number of partitions), else read from its epoch
        checkpoint on disk, else its log end now. The last is an over-estimate (it may have
        appended since), which makes the lag, and so async_loss_bound, too small: campaign
        seed 3026 recorded a lag of 0 for a failover that took back one ack."""
        starts: dict[tuple[str, int], int | None] = dict.fromkeys(keys)

        def connect(timeout: float) -> Awaitable[BrokerConnection]:
            # Logged in with --secure: an anonymous ``epochs`` is refused there, and every
            # failover's start then came from the checkpoint on disk (campaign seed 7104's
            # "op 'epochs' before login" lines, three rounds of one per partition).
            return self.cluster.connect(new_url, timeout)

        for timeout in (2.0, 4.0, 8.0):
            unknown = [key for key in keys if starts[key] is None]
            if not unknown:
                break
            starts.update(_epoch_starts(connect, unknown, epoch, timeout))
        if new is not None:
            for topic, partition in [key for key in keys if starts[key] is None]:
                starts[(topic, partition)] = self._epoch_start_on_disk(new, topic, partition, epoch)
        return starts

    def _epoch_start_on_disk(self, new: Any, topic: str, partition: int, epoch: int) -> int:
        try:
            entries = EpochCache.load(new.data_dir() / f"{topic}-{partition}").entries
        except (OSError, EpochCacheError):
            entries = []
        for entry_epoch, start in entries:
            if entry_epoch == epoch:
                return start
        log.warning("failover in group %d: epoch %d's start in %s-%d unknown; its log end now stands in",
                    new.group, epoch, topic, partition)
        return new.disk_end(topic, partition)

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.poll()
            except Exception as exc:  # ZooKeeper node down etc.: try again
                log.debug("monitor poll failed: %s", exc)
            self._halt.wait(0.1)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def _log_or_none(broker: Any, topic: str, partition: int) -> bytes | None:
    """A broker's partition log from offset 0 as on disk now; None when it cannot be read whole
    (a lag left out of a failover's record makes async_loss_bound count it as 0: stricter)."""
    try:
        return broker.disk_log(topic, partition)
    except (OSError, RuntimeError) as exc:
        log.warning("cannot read %s's %s-%d for a failover's lag: %s", broker.name, topic, partition, exc)
        return None


def _epoch_starts(connect: Callable[[float], Awaitable[BrokerConnection]], keys: list[tuple[str, int]], epoch: int,
                  timeout: float = 2.0) -> dict[tuple[str, int], int | None]:
    """Ask the broker that ``connect(timeout)`` reaches where ``epoch`` began in each partition,
    all at once (None for a partition it did not answer for in ``timeout``)."""
    async def ask(topic: str, partition: int) -> int | None:
        try:
            conn = await connect(timeout)
            try:
                reply = await conn.request(EpochsRequest(topic=topic, partition=partition).to_header(), timeout=timeout)
            finally:
                conn.close()
        except Exception:
            return None
        for entry_epoch, start in reply.get("entries", []) or []:
            if entry_epoch == epoch:
                return int(start)
        return None

    async def ask_all() -> list[int | None]:
        return await asyncio.gather(*(ask(topic, partition) for topic, partition in keys))

    try:
        return dict(zip(keys, asyncio.run(ask_all())))
    except Exception:
        return dict.fromkeys(keys)


class Workload:
    def __init__(self, cluster: ChaosCluster, history: History, monitor: Monitor, seed: int, rate: float,
                 producers: ProducerSettings = ProducerSettings(), resend_budget_s: float = 20.0,
                 transactions: bool = False, time_reads: bool = False) -> None:
        self.cluster = cluster
        self.time_reads = time_reads
        self.transactions = transactions
        self.producers = producers
        self.resend_budget_s = resend_budget_s
        self.history = history
        self.monitor = monitor
        self.seed = seed
        self.rate = rate
        self.stopping = asyncio.Event()
        self.conns: dict[str, BrokerConnection] = {}
        self.newest_acked: dict[str, tuple[int, str]] = {}  # partition -> (offset, value) of the newest ack
        self.crashes: list[str] = []  # workload tasks that raised: "name: exception"
        self.txn_load = TransactionLoad(self)

    def acked(self, partition: str | None, offset: int | None, value: str) -> None:
        if partition is None or offset is None:
            return
        known = self.newest_acked.get(partition)
        if known is None or offset > known[0]:
            self.newest_acked[partition] = (offset, value)

    async def producer_conn(self, url: str) -> BrokerConnection:
        """The raw producers' shared connection to the master registered as ``url``."""
        return await self._cached_conn(self.conns, url)

    async def _cached_conn(self, conns: dict[str, BrokerConnection], url: str) -> BrokerConnection:
        """An open connection to the broker registered as ``url`` (through its client proxy)."""
        conn = conns.get(url)
        if conn is None or not conn.is_open:
            conn = conns[url] = await self.cluster.connect(url, 1.0)
        return conn

    def client_config(self) -> MetaClientConfig:
        """The real client's settings, through the proxies (and logged in, with ``--secure``)."""
        return MetaClientConfig(zk_connect=self.cluster.zk_connect, zk_root=self.cluster.zk_root,
                                zk_session_timeout_ms=10_000,
                                retry_unknown_outcome=self.producers.retry_unknown,
                                idempotence=self.producers.idempotent, request_timeout_s=3.0,
                                send_timeout_s=self.resend_budget_s if self.producers.retry_unknown else 5.0,
                                send_max_attempts=200 if self.producers.retry_unknown else 20,
                                send_retry_max_wait_s=0.3, connect_timeout_s=1.0,
                                address_map=self.cluster.client_address_map, credentials=self.cluster.credentials)

    async def client_producer(self, name: str) -> None:
        topic = self.cluster.topic
        async with AsyncMessageSessionFactory(self.client_config()) as factory:
            producer = factory.create_producer()
            seq = 0
            while not self.stopping.is_set():
                value = f"{name}-{seq}"
                seq += 1
                op = self.history.invoke(name, "put", value, None)
                result = await producer.send_message(Message(topic, value.encode()))
                part = f"{topic}/{result.partition}" if result.partition is not None else None
                # The client does not say why it retried: attempts > 1 may include a resend
                # after an unknown outcome (the checker counts it so, see check_duplicates).
                if result.success:
                    offset = result.offset if result.offset >= 0 else None
                    self.history.ok(op, offset, partition=part, msg_id=result.msg_id, attempts=result.attempts)
                    self.acked(part, offset, value)
                elif result.outcome_unknown:
                    self.history.info(op, result.error_message or "unknown", partition=part, attempts=result.attempts)
                    await asyncio.sleep(0.1)
                else:
                    self.history.fail(op, result.error_message or "failed", partition=part, attempts=result.attempts)
                    await asyncio.sleep(0.05)
                await asyncio.sleep(1 / self.rate)
            await producer.close()

    async def transactional_producer(self, name: str, group: int) -> None:
        """Local transactions of 2-4 messages over both topics' partitions (each topic at
        least once; the client's routing within a topic), three in four committed, one in
        four rolled back. Each is one ``txn``
        operation: ``ok`` committed (with ``commit_time``, when commit was invoked), ``fail``
        rolled back (by us, or by the broker at commit), ``info`` unknown; ``sends`` lists
        every message tried, with its acked offset (None when its send failed). One in ten
        is left open past its timeout (``TransactionLoad.timed_out``). Its transactions run
        in broker group ``group`` (a transaction stays in one group: with two groups, ``x1``
        takes the second, so both groups' topics get transactions)."""
        rng = random.Random(f"workload/{name}/{self.seed}")
        async with AsyncMessageSessionFactory(self.client_config()) as factory:
            producer = factory.create_transactional_producer(broker_id=group)
            for number in itertools.count():
                if self.stopping.is_set():
                    break
                if rng.random() < 0.1:
                    await self.txn_load.timed_out(producer, name, f"{name}-t{number}", rng)
                else:
                    await self._transaction(producer, name, f"{name}-t{number}", rng)
                await asyncio.sleep(1 / self.rate)

    async def _transaction(self, producer: Any, process: str, txn: str, rng: random.Random) -> None:
        """One transaction, recorded as one ``txn`` operation."""
        op = self.history.invoke(process, "txn", txn=txn, timeout_s=TXN_TIMEOUT_S)
        sends: list[list[Any]] = []
        committing = False
        try:
            await producer.begin_transaction(timeout_s=TXN_TIMEOUT_S)
            await send_values(producer, self.txn_load.targets(rng, 2, 4), txn, sends)
            if rng.random() < 0.25:
                await producer.rollback()
                self.history.fail(op, "rolled back", sends=sends)
            else:
                committing, commit_time = True, self.history.now()
                await producer.commit()
                self.history.ok(op, sends=sends, commit_time=commit_time)
        except TransactionRolledBack as exc:
            self.history.fail(op, f"rolled back by the broker: {exc}", sends=sends)
        except Exception as exc:  # a step gave up: roll back what we can
            if not committing and await roll_back(producer):
                self.history.fail(op, f"rolled back after: {exc}", sends=sends)
            else:
                self.history.info(op, f"unknown: {exc}", sends=sends)
            await asyncio.sleep(0.1)

    async def reader(self, group: int, committed_only: bool = False) -> None:
        """Reads every partition from every replica of the group, each at its own position:
        raw (``reader-g{group}``: every record up to the last stable offset, control records
        and aborted transactions' messages included), the workload's topic; or, with
        ``committed_only`` (``committed-reader-g{group}``, with ``--transactions``), as a
        read-committed consumer does (no control record, no aborted message: the reply's
        aborted spans), both topics the transactions write, so that the read-committed
        checks (aborted-read, precommitted-read, intermediate-read, G1c) see what masters and
        slaves served of each."""
        topics = self.cluster.topics if committed_only else {self.cluster.topic: self.cluster.partitions}
        process = f"{'committed-reader' if committed_only else 'reader'}-g{group}"
        positions: dict[tuple[str, str, int], int] = {}
        conns: dict[str, BrokerConnection] = {}
        while not self.stopping.is_set():
            for url in list(self.monitor.replicas.get(group, [])):
                for topic, n in ((t, n) for t, count in topics.items() for n in range(count)):
                    if self.stopping.is_set():
                        return
                    key = (url, topic, n)
                    offset = positions.get(key, 0)
                    try:
                        conn = await self._cached_conn(conns, url)
                        get = GetRequest(topic=topic, partition=n, offset=offset, max_size=256 * 1024)
                        reply = await conn.request(get.to_header(), timeout=2.0)
                        if reply.ok and damaged_first_record(reply.body):
                            positions[key] = await self._realigned(conn, topic, n, offset, f"{process}: {topic}/{group}-{n} on {url}")
                            continue
                    except (ConnectionClosed, asyncio.TimeoutError, OSError):
                        conns.pop(url, None)
                        continue
                    if reply.code == c.MOVED:
                        positions[key] = int(reply["offset"])
                        continue
                    if not reply.ok:
                        committed = reply.get("committed")
                        if isinstance(committed, int) and offset > committed and "beyond the log end" in reply.message:
                            positions[key] = committed  # this replica was truncated below our position
                        continue
                    pairs, positions[key] = _read_pairs(bytes(reply.body), offset, reply.header, committed_only)
                    if pairs:
                        self.history.read(process, f"{topic}/{group}-{n}", pairs, replica=url,
                                          isolation=READ_COMMITTED if committed_only else None)
            await asyncio.sleep(0.3)
        for conn in conns.values():
            conn.close()

    async def _realigned(self, conn: BrokerConnection, topic: str, n: int, offset: int, where: str) -> int:
        """Where a reader resumes (``where``: the reader, partition and replica) when the replica's
        log holds no record starting at its position ``offset``: a position from records an
        async failover took back (on the old master, truncated and following, or on a new
        master) may fall inside a record of the log the replica serves now. As the client consumer does (docs/client.md, "Realigning a position"), it
        asks that replica (``offset`` with ``realign``) and moves there, with one WARNING. Bounded:
        a replica that says a record does start there serves damaged bytes, a finding (RecordError:
        the task crashes and the run fails); an answer it cannot give now leaves the position for
        the next round."""
        header = OffsetRequest(topic=topic, partition=n, offset=offset, realign=True).to_header()
        reply = await conn.request(header, timeout=2.0)
        if not reply.ok:
            return offset
        moved = int(reply["offset"])
        if moved == offset:
            raise RecordError(f"{where}: no whole valid record starts at {offset}, "
                              f"though the replica says one does (damaged bytes)")
        log.warning("%s: no record starts at %d (the log changed under this position, e.g. an async failover "
                    "took back records); resuming at %d (%s%s)", where, offset, moved,
                    reply.get("realign"), f" {reply.get('epoch')}" if reply.get("epoch") is not None else "")
        return moved

    async def prober(self, group: int, every: float = 0.25) -> None:
        """Reads the newest acked message of every partition of the group back from its
        current master, every ``every`` seconds; each success is recorded as a read. This is
        what the liveness check awaits after a fault: acked messages readable again."""
        topic = self.cluster.topic
        conns: dict[str, BrokerConnection] = {}
        while not self.stopping.is_set():
            url = self.monitor.masters.get(group)
            for n in range(self.cluster.partitions):
                partition = f"{topic}/{group}-{n}"
                newest = self.newest_acked.get(partition)
                if url is None or newest is None or self.stopping.is_set():
                    continue
                offset, value = newest
                try:
                    conn = await self._cached_conn(conns, url)
                    get = GetRequest(topic=topic, partition=n, offset=offset, max_size=4096)
                    reply = await conn.request(get.to_header(), timeout=1.0)
                except (ConnectionClosed, asyncio.TimeoutError, OSError):
                    conns.pop(url, None)
                    continue
                if not reply.ok:
                    continue
                first = next(iter(iter_records(bytes(reply.body), offset)), None)
                if first is not None and first.offset == offset and value_of(bytes(first.data)) == value:
                    self.history.read(f"probe-g{group}", partition, [(offset, value)], replica=url)
            await asyncio.sleep(every)
        for conn in conns.values():
            conn.close()

    async def run(self) -> None:
        """Every workload task until ``stopping``; a task that raises is a crash
        (``self.crashes``, in the history's ``run_problems``: the run fails)."""
        groups = range(self.cluster.num_groups)
        jobs = {name: RawProducer(self, name, self.producers, self.resend_budget_s).run() for name in ("r0", "r1")}
        jobs["c0"] = self.client_producer("c0")
        if self.transactions:
            jobs.update({name: self.transactional_producer(name, i % self.cluster.num_groups)
                         for i, name in enumerate(("x0", "x1"))})
            jobs["xa0"], jobs["z0"] = self.txn_load.xa_producer("xa0"), self.txn_load.zombie("z0")
        jobs.update({f"reader-g{g}": self.reader(g) for g in groups})
        if self.transactions:
            jobs.update({f"committed-reader-g{g}": self.reader(g, committed_only=True) for g in groups})
        jobs.update({f"probe-g{g}": self.prober(g) for g in groups})
        if self.time_reads:
            jobs.update({f"time-g{g}": TimeReadProber(self, g).run() for g in groups})
        results = await asyncio.gather(*(asyncio.create_task(job) for job in jobs.values()), return_exceptions=True)
        for conn in self.conns.values():
            conn.close()
        for name, r in zip(jobs, results):
            if isinstance(r, BaseException):
                log.error("workload task %s failed: %r", name, r)
                self.crashes.append(f"{name}: {r!r}")


def _read_pairs(body: bytes, offset: int, header: dict[str, Any], committed_only: bool) -> tuple[list[tuple[int, str]], int]:
    """A fetched range as a history's reads, and where the next fetch starts. Raw: every
    record. Read-committed: the records a read-committed consumer is given (no control
    record, nothing inside the reply's aborted spans); the next fetch starts past the
    filtered ones too."""
    if committed_only:
        filtered = committed_records(body, offset, aborted_spans(header))
        return [(r.offset, value_of(bytes(r.data))) for r in filtered.records], filtered.next_offset
    records = list(iter_records(body, offset))
    end = records[-1].offset + records[-1].size if records else offset
    return [(r.offset, record_value(r.attribute, r.data)) for r in records], end


def committed_messages_by_topic(txns: list[dict[str, Any]]) -> dict[str, int]:
    """Of ``txn`` completions: the committed transactions' messages per topic."""
    counts: dict[str, int] = {}
    for op in txns:
        if op["type"] == "ok":
            for partition, _offset, _value in op.get("sends") or []:
                topic = str(partition).rsplit("/", 1)[0]
                counts[topic] = counts.get(topic, 0) + 1
    return dict(sorted(counts.items()))


def injected_faults(faults: list[dict[str, Any]]) -> dict[str, int]:
    """Fault entries by kind, without heals: the consumer group's own starts, kills and
    stops are workload, not injected faults."""
    counts: dict[str, int] = {}
    for f in faults:
        if f["kind"] not in ("heal", "heal_all") and not f["kind"].startswith("consumer-"):
            counts[f["kind"]] = counts.get(f["kind"], 0) + 1
    return dict(sorted(counts.items()))


class Phases:
    """Wall seconds of a run's phases, in order (``phases`` in summary.json, one line of the
    report): where a run's time goes, so that the chaos tests' share of the suite can be
    read off their output directories."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.monotonic() - started, 2)

    def line(self) -> str:
        return "phases (s): " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in self.seconds.items())


#: What a run writes in its --out directory (docs/chaos.md, "How to run", its Output paragraph).
RUN_FILES = ("history.json", "check.json", "summary.json", "report.txt", "runner.log", "broker-logs.txt")
RUN_DIRS = ("cluster", "consumers")


def clear_previous_run(out: Path) -> None:
    """Remove what an earlier run left in ``out``, and only that (``--out`` may name a
    directory holding other files). The default --out is the same for the same scenario
    and seed, so running a command again meets the last run's files: its brokers' data
    would be the new brokers' starting logs (hundreds of false duplicates and phantoms),
    its consumers' record files would be appended to and runner.log would grow."""
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        directory = out / name
        if directory.is_dir():
            for child in directory.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()


class Run:
    def __init__(self, scenario: str, seconds: float, seed: int, out: Path, *, mode: str = "sync", groups: int = 1,
                 zk_nodes: int = 3, rate: float = 20.0, settle_timeout: float = 60.0, slaves: int = 1,
                 on_sync_slave_loss: str = "degrade", liveness_bound: float | None = None,
                 secure: bool = False, rogue: bool = False, producers: ProducerSettings = ProducerSettings(),
                 consumer_group: bool = False, transactions: bool = False, hosts: str = "local",
                 power_loss: bool = False, corruption: bool = False, topic_ops: bool = False,
                 time_reads: bool = False) -> None:
        self.scenario, self.seconds, self.seed, self.out = scenario, seconds, seed, Path(out)
        self.mode, self.groups, self.zk_nodes, self.rate = mode, groups, zk_nodes, rate
        self.slaves, self.on_sync_slave_loss = slaves, on_sync_slave_loss
        self.settle_timeout = settle_timeout
        self.secure, self.rogue = secure, rogue
        self.producers = producers
        self.hosts = hosts
        self.power_loss = power_loss
        self.corruption = corruption
        # The transactions' second topic only where transactions run: a run without them
        # would only wait for its empty partitions to settle and be compared.
        self.cluster = ChaosCluster(self.out / "cluster", groups=groups, mode=mode, zk_nodes=zk_nodes,
                                    slaves=slaves, on_sync_slave_loss=on_sync_slave_loss, secure=secure, hosts=hosts,
                                    power_loss=power_loss, corruption=corruption,
                                    txn_partitions=TXN_PARTITIONS if transactions else 0)
        session_ms = self.cluster.session_ms
        self.liveness_bound = liveness_bound if liveness_bound is not None else default_bound(session_ms)
        self.history = History({"mode": mode, "scenario": scenario, "seed": seed, "seconds": seconds,
                                "groups": groups, "zk_nodes": zk_nodes, "topic": self.cluster.topic,
                                "txn_topic": self.cluster.txn_topic,
                                "slaves": slaves, "on_sync_slave_loss": on_sync_slave_loss,
                                "session_ms": session_ms, "liveness_bound_s": self.liveness_bound,
                                "secure": secure, "rogue": rogue, "producers": producers.to_json(),
                                "consumer_group": consumer_group, "transactions": transactions,
                                "power_loss": power_loss, "corruption": corruption, "topic_ops": topic_ops,
                                "time_reads": time_reads})
        self.hostile = HostileLoad(self.cluster, self.history) if rogue else None
        self.transactions = transactions
        self.time_reads = time_reads
        self.consumers = ConsumerGroupLoad(self.cluster, self.history, seed, self.out) if consumer_group else None
        self.steps_done: list[dict[str, Any]] = []
        self.phases = Phases()
        self.settle_failures: list[str] = []
        self.unavailable: list[float] = []
        self.txn_load: TransactionLoad | None = None
        self.workload_crashes: list[str] = []
        # --- topic operations (chaos/topic_ops.py): the side topic churns beside the faults ---
        self.side_topics = SideTopicLoad(self.cluster, self.history, seed) if topic_ops else None

    def _fault_loop(self, stop_at: float, stopping: threading.Event) -> None:
        session_s = self.cluster.session_ms / 1000
        plan = schedule(self.scenario, self.seed, self.groups, self.zk_nodes, session_s, hosts=self.hosts,
                        can_cut=can_cut(self.hosts), power_loss=self.power_loss, corruption=self.corruption)
        self.history.meta["schedule"] = [s.to_json() for s in plan[:50]]
        self.history.meta["hosts"] = self.hosts
        rng = random.Random(f"targets/{self.seed}")
        time.sleep(1.5)  # plain load first
        for number, step in enumerate(plan):
            if time.monotonic() >= stop_at or stopping.is_set():
                break
            if not FAULTS[step.kind].heals:
                self._lasting(number, step, rng, stop_at)
                break  # the group stays one member short: no further step
            self._one(number, step, rng)

    def _record_fault(self, number: int, step: Step, rng: random.Random) -> tuple[str, Any]:
        kind = FAULTS[step.kind]
        eligible = self._eligible_slaves(step.group) if kind.role == "master" else None
        started = self.history.now()  # the fault's time: a kill is the first thing most injections do
        target, details, heal = inject(self.cluster, step, rng)
        groups = list(range(self.groups)) if kind.role == "zk" else [step.group]
        if eligible is not None:
            details = {**details, "eligible_slaves": eligible}
        self.history.fault(step.kind, target, at=started, group=step.group, groups=groups, step=number, hold_s=step.hold_s,
                           heals=kind.heals, reads_during=kind.reads_during, master_fixed=kind.master_fixed,
                           writes_expected=writes_expected(step.kind, self.mode, self.on_sync_slave_loss,
                                                           self.slaves), **details)
        log.info("fault %s on %s (%s)", step.kind, target,
                 f"hold {step.hold_s:.1f}s" if kind.heals else "never healed")
        return target, heal

    def _eligible_slaves(self, group: int) -> int | None:
        """How many slaves could take over from the group's master just before a master fault
        (the checker's failover check, ``eligible_slaves``): sync, the published sync set
        (a slave outside it may lack acked messages and never takes over on its own, V4);
        async, every registered slave. None when ZooKeeper cannot be read."""
        try:
            view = self.cluster.view(group)
        except Exception as exc:  # ZooKeeper unreachable: nothing recorded, the check stays strict
            log.warning("cannot read group %d's slaves before a master fault: %s", group, exc)
            return None
        return len(view.sync_set) if self.mode == "sync" else len(view.slaves)

    def _lasting(self, number: int, step: Step, rng: random.Random, stop_at: float) -> None:
        """A fault that never heals: load goes on until the run ends, and at least the
        liveness bound plus a margin, so that the liveness check can decide."""
        target, _heal = self._record_fault(number, step, rng)
        self.steps_done.append({**step.to_json(), "target": target, "heals": False})
        time.sleep(max(stop_at - time.monotonic(), self.liveness_bound + 2.0))

    def _await_acks(self, since: float, groups: Any) -> None:
        """Settled is not serving: also wait (at most the liveness bound + 1 s) until every
        group the fault touched acked a write after its heal, so that the next fault does not
        cut the window in which the liveness check awaits that ack."""
        wanted = set(groups)
        deadline = time.monotonic() + self.liveness_bound + 1.0
        while time.monotonic() < deadline:
            acked = {group_of(op.get("partition")) for op in self.history.ops[-400:]
                     if op["type"] == "ok" and op.get("f") == "put" and op["time"] >= since}
            if wanted <= acked:
                return
            time.sleep(0.1)

    def _one(self, number: int, step: Step, rng: random.Random) -> None:
        cluster = self.cluster
        target, heal = self._record_fault(number, step, rng)
        time.sleep(step.hold_s)
        heal()
        self.history.fault("heal", target, of=step.kind, group=step.group, step=number)
        healed_at = self.history.faults[-1]["time"]
        try:
            took = cluster.wait_settled(self.settle_timeout)
            self._await_acks(healed_at, [step.group] if FAULTS[step.kind].role != "zk" else range(self.groups))
            self.steps_done.append({**step.to_json(), "target": target, "settle_s": round(took, 2)})
        except AssertionError as exc:
            self.settle_failures.append(f"after {step.kind} on {target}: {exc}")
            self.history.fault("settle_timeout", target, of=step.kind, why=str(exc))
            log.warning("%s", exc)
            cluster.heal_all()
        time.sleep(step.gap_s)

    async def _main(self) -> None:
        monitor = Monitor(self.cluster, self.history)
        monitor.poll()
        monitor.start()
        # A resend keeps going through a failover: past the liveness bound, by which writes resume.
        workload = Workload(self.cluster, self.history, monitor, self.seed, self.rate, self.producers,
                            resend_budget_s=self.liveness_bound + 5.0, transactions=self.transactions,
                            time_reads=self.time_reads)
        self.txn_load = workload.txn_load
        self.workload_crashes = workload.crashes
        load = asyncio.create_task(workload.run())
        with self.phases("load start"):
            if self.hostile is not None:
                await asyncio.to_thread(self.hostile.start)  # the quiet and attacked latency windows first
            if self.consumers is not None:
                self.consumers.start()
        stop_at = time.monotonic() + self.seconds
        stopping = threading.Event()
        try:
            with self.phases("faults"):
                side = (asyncio.to_thread(self.side_topics.run, stop_at, stopping) if self.side_topics is not None
                        else asyncio.sleep(0))
                results = await asyncio.gather(asyncio.to_thread(self._fault_loop, stop_at, stopping), side,
                                               return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        finally:
            with self.phases("load stop"):
                stopping.set()
                if self.hostile is not None:
                    await asyncio.to_thread(self.hostile.stop)
                    self.history.meta["rogue"] = self.hostile.summary()
                await asyncio.sleep(1.0)
                workload.stopping.set()
                await load
                if self.consumers is not None:
                    await asyncio.to_thread(self.consumers.stop)
                monitor.stop()

    def execute(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        clear_previous_run(self.out)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                            handlers=[logging.FileHandler(self.out / "runner.log"), logging.StreamHandler(sys.stderr)])
        logging.getLogger("kazoo").setLevel(logging.WARNING)
        started = time.monotonic()
        with self.phases("cluster start"):
            self.cluster.start()
        try:
            asyncio.run(self._main())
            with self.phases("final settle"):
                healed = self.cluster.heal_all()
                self.history.fault("heal_all", "cluster", actions=healed)
                try:
                    self.cluster.wait_settled(max(self.settle_timeout, 120))
                except AssertionError as exc:
                    self.settle_failures.append(f"final: {exc}")
            with self.phases("final reads"):
                if self.side_topics is not None:
                    self.side_topics.final_check()
                if self.consumers is not None:
                    self.consumers.drain()
                self.cluster.snapshot(self.history)
                self._consumers_ran_to_the_end()
        finally:
            with self.phases("cluster stop"):
                if self.side_topics is not None:
                    self.side_topics.close()
                if self.consumers is not None:
                    self.consumers.kill_all()
                self.history.close_open()
                self.history.meta["run_problems"] = self.run_problems()
                self.history.save(self.out / "history.json")
                (self.out / "broker-logs.txt").write_text(self.cluster.log_report(200))
                self.cluster.stop()
        with self.phases("check"):
            result = check(self.history)
        (self.out / "check.json").write_text(json.dumps(result.to_json(), indent=1))
        report = self.report(result, time.monotonic() - started)
        (self.out / "report.txt").write_text(report)
        faults: dict[str, int] = {}
        for f in self.history.faults:
            faults[f["kind"]] = faults.get(f["kind"], 0) + 1
        summary = {"ok": result.ok, "scenario": self.scenario, "seed": self.seed,
                   "mode": self.mode, "groups": self.groups, "slaves": self.slaves, "secure": self.secure,
                   "seconds": self.seconds, "faults": faults, "injected": injected_faults(self.history.faults),
                   "stats": result.stats, "settle_failures": self.settle_failures,
                   "master_faults_without_failover": [v["why"] for v in result.violations("failover")],
                   "violations": len(result.violations()),
                   "workload_crashes": self.workload_crashes,
                   "steps": self.steps_done, "phases": self.phases.seconds, "hostile_problems": self.hostile_problems,
                   "txn_problems": self.txn_problems,
                   "topic_ops": self.side_topics.summary() if self.side_topics is not None else None,
                   "rogue": self.hostile.summary() if self.hostile is not None else None}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(report)
        return 0 if result.ok else 1

    def _consumers_ran_to_the_end(self) -> None:
        """The group's records into the history; the group counts as run to the end (its
        ``unseen`` checked) when it was given the last message of every partition. A
        settled cluster whose group cannot get there is a settle failure."""
        if self.consumers is None:
            return
        self.consumers.merge()
        short = self.consumers.reached_end()
        if short:
            self.settle_failures.append(f"consumer group {GROUP} never got the last message of {short}")
        else:
            self.history.group_drained(GROUP)

    @property
    def hostile_problems(self) -> list[str]:
        return self.hostile.problems() if self.hostile is not None else []

    @property
    def txn_problems(self) -> list[str]:
        """Commits the broker should have refused (past a timeout, by a fenced instance)."""
        return self.txn_load.problems if self.txn_load is not None else []

    def run_problems(self) -> dict[str, list[str]]:
        """What this runner saw that the operations do not show, for the history's
        ``meta["run_problems"]``: the checker's ``run`` check fails the run on any of it, so
        the run, ``python -m chaos check`` of its history and the campaign give one verdict."""
        crashes = list(self.workload_crashes)
        if self.consumers is not None:
            crashes += self.consumers.crashes
        return {"settle_failures": list(self.settle_failures), "hostile_problems": self.hostile_problems,
                "txn_problems": list(self.txn_problems), "workload_crashes": crashes}

    def consumers_lines(self) -> list[str]:
        if self.consumers is None:
            return ["consumer group: off"]
        c = self.consumers
        polls = sum(1 for op in self.history.ops if op.get("f") == "poll" and op["type"] == "ok")
        drained = bool((self.history.meta.get("consumer_groups") or {}).get(GROUP, {}).get("drained"))
        return [f"consumer group {GROUP}: {c.size} members, {len(c.started)} processes started, "
                f"{c.signals['SIGKILL']} SIGKILLed, {c.signals['SIGTERM']} SIGTERMed; {polls} polls; "
                f"ran to the end: {'yes' if drained else 'no'}"]

    def transactions_line(self) -> str:
        if not self.transactions:
            return "transactions: off"
        ends = [op for op in self.history.ops if op.get("f") == "txn" and op["type"] != "invoke"]
        types = [op["type"] for op in ends]
        by_topic = committed_messages_by_topic(ends)
        return (f"transactions (x0, x1 local, xa0 XA, z0 zombie): {types.count('ok')} committed "
                f"(messages by topic: {', '.join(f'{t} {n}' for t, n in by_topic.items()) or 'none'}), "
                f"{types.count('fail')} rolled back, {types.count('info')} unknown; "
                + (self.txn_load.line() if self.txn_load is not None else ""))

    def producers_text(self) -> str:
        if self.producers.idempotent:
            return "idempotent, unknown outcomes resent (exactly once: no duplicate allowed)"
        if self.producers.retry_unknown:
            return "plain, unknown outcomes resent (at least once: a resent put may be stored twice)"
        return "plain, unknown outcomes not resent (nothing is sent twice: no duplicate allowed)"

    def command_line(self) -> str:
        """The command that repeats this run's setup. It names --secure or --insecure always
        (the default differs between random and the other scenarios) and every workload flag."""
        return (f"python -m chaos run --scenario {self.scenario} --seconds {self.seconds:g} --seed {self.seed} "
                f"--mode {self.mode} --groups {self.groups} --zk-nodes {self.zk_nodes} --slaves {self.slaves} "
                f"--on-sync-slave-loss {self.on_sync_slave_loss} --liveness-bound {self.liveness_bound:g} "
                f"--rate {self.rate:g}"
                + (" --secure" if self.secure else " --insecure")
                + (" --rogue" if self.rogue else "")
                + (f" --hosts {self.hosts}" if self.hosts != "local" else "")
                + (" --power-loss" if self.power_loss else "")
                + (" --corruption" if self.corruption else "")
                + (" --idempotent" if self.producers.idempotent else " --retry-unknown" if self.producers.retry_unknown else "")
                + (" --consumer-group" if self.consumers is not None else " --no-consumer-group")
                + (" --transactions" if self.transactions else " --no-transactions")
                + (" --topic-ops" if self.side_topics is not None else " --no-topic-ops")
                + (" --time-reads" if self.time_reads else "")
                + f" --out {self.out}")

    def report(self, result: Any, elapsed: float) -> str:
        s = result.stats
        faults = injected_faults(self.history.faults)
        no_failover = [v["why"] for v in result.violations("failover")]
        lines = [
            f"chaos run: scenario={self.scenario} seed={self.seed} mode={self.mode} groups={self.groups} "
            f"zk_nodes={self.zk_nodes} seconds={self.seconds} (wall {elapsed:.0f}s)",
            f"command: {self.command_line()}",
            f"producers: {self.producers_text()}",
            *self.consumers_lines(),
            self.transactions_line(),
            self.side_topics.line() if self.side_topics is not None else "topic operations: off",
            self.phases.line(),
            f"faults: {sum(faults.values())} {dict(sorted(faults.items()))}",
            f"operations: puts {s['puts_ok']} ok / {s['puts_fail']} failed / {s['puts_info']} unknown; "
            f"reads {s['reads']} messages in {s['gets']} fetches",
            f"failovers: {s['failovers']}; master faults without a failover: {len(no_failover)}"
            + (f" {no_failover[:5]}" if no_failover else ""),
            f"max unavailability (longest gap between acks): {s['max_unavailable_s']:.2f}s",
            *render_table(s.get("unavailability", {}), s.get("liveness_bound_s", self.liveness_bound)),
            f"lost acked messages: {s['lost_acked']}" + (" (must be 0 in sync mode)" if self.mode == "sync" else ""),
            duplicates_line(s) + ("" if self.producers.retry_unknown and not self.producers.idempotent
                                  else " (must be 0)"),
            resends_line(s),
            f"settle failures: {len(self.settle_failures)}",
            *[f"  - {x}" for x in self.settle_failures[:10]],
            *(self.hostile.report_lines() if self.hostile is not None else []),
            *[f"  - {x}" for x in self.hostile_problems[:10]],
            *[f"  - {x}" for x in self.txn_problems[:10]],
            f"workload tasks crashed: {len(self.run_problems()['workload_crashes'])}",
            *[f"  - {x}" for x in self.run_problems()["workload_crashes"][:10]],
            f"violations: {len(result.violations())}",
            f"VERDICT: {'PASS' if result.ok else 'FAIL'}",
            "",
            result.report(),
        ]
        return "\n".join(lines) + "\n"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run a chaos scenario: workload + faults, then check the history")
    p.add_argument("--scenario", required=True, help=f"one of {', '.join(scenario_names())}")
    p.add_argument("--seconds", type=float, default=20.0, help="how long faults are injected")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None, help="output directory (default /tmp/chaos-{scenario}-{seed})")
    p.add_argument("--mode", choices=("sync", "async"), default="sync")
    p.add_argument("--groups", type=int, default=1, choices=(1, 2))
    p.add_argument("--zk-nodes", type=int, default=3, choices=(1, 3))
    p.add_argument("--rate", type=float, default=20.0, help="puts per second per producer (3 producers)")
    p.add_argument("--slaves", type=int, default=1, choices=(1, 2), help="slaves per group")
    p.add_argument("--on-sync-slave-loss", choices=ON_SYNC_SLAVE_LOSS, default="degrade",
                   help="sync mode: what a master does without a sync slave (default degrade)")
    p.add_argument("--secure", action="store_true",
                   help="brokers with security on: a group secret per group (brokers authenticate to each other, "
                        "ZooKeeper digest ACLs on the group's nodes), SCRAM users; the workload logs in "
                        "(default: on in the random scenario)")
    p.add_argument("--insecure", action="store_true",
                   help="security off, also in the random scenario (where it is on by default)")
    p.add_argument("--rogue", action="store_true",
                   help="hostile peers for the whole run: forged positions, epoch claims, phantom joins, replica "
                        "reads and heartbeats at every broker (and, with --secure, ZooKeeper writes without "
                        "credentials); fails on any accepted forgery or a broker RSS growth over the limit")
    p.add_argument("--retry-unknown", action="store_true",
                   help="every producer resends a put whose outcome is unknown until it is acked or surely refused "
                        "(at least once: a resent put stored twice is counted, not a violation)")
    p.add_argument("--idempotent", action="store_true",
                   help="idempotent producers (numbered puts) that resend unknown outcomes (exactly once: any "
                        "duplicate is a violation); implies --retry-unknown")
    p.add_argument("--consumer-group", action=argparse.BooleanOptionalAction, default=None,
                   help="the consumer-group workload: 3 consumer processes of one group (read_from master, slave, "
                        "prefer-slave), SIGKILLed / SIGTERMed and restarted every few seconds, then one reading the "
                        "group to the end; their polls feed the poll, duplicate and unseen checks "
                        "(default: on in the random scenario)")
    p.add_argument("--transactions", action=argparse.BooleanOptionalAction, default=None,
                   help="transactional producers (local x0, x1: transactions of 2-4 messages, one in four rolled "
                        "back; XA xa0; the zombie z0; some left open past their timeout), every transaction spread "
                        "over two topics (chaos and txn-b), and a read-committed reader of both topics per group on "
                        "every replica; their outcomes and reads feed lost-write and the read-committed checks: "
                        "precommitted-read, aborted-read, intermediate-read, G1c (default: on in the random "
                        "scenario)")
    p.add_argument("--topic-ops", action=argparse.BooleanOptionalAction, default=None,
                   help="topic operations beside the faults: each group's side topic is created, grown, altered, "
                        "deleted and re-created smaller, and after each the state it must leave is checked on every "
                        "member (the topic-ops check; default: on in the random scenario)")
    p.add_argument("--time-reads", action="store_true",
                   help="a time-read prober per group: asks every master and slave offset_for_time for the times "
                        "of acked puts (and random times) about every 0.3 s; the time_reads check judges each "
                        "answer against the final logs (default: off, also in the random scenario)")
    p.add_argument("--hosts", choices=HOSTS_MODES, default="local",
                   help="local: every process on 127.0.0.1, links through the fault proxy (default); netns: each "
                        "ZooKeeper node and broker on a host of its own (a network namespace on one bridge; needs "
                        "root), with silent link-down and nftables faults (docs/chaos.md, 'Hosts mode')")
    p.add_argument("--power-loss", action="store_true",
                   help="every broker runs under the power-loss shim (chaos/power_loss.py; needs gcc) "
                        "with group commit (unflushThreshold=0): enables the power-loss-master and power-loss-slave "
                        "faults (kill -9, unsynced writes lost, restart), also in the random scenario")
    p.add_argument("--corruption", action="store_true",
                   help="brokers with 4 KiB segments and a scrub pass every second: enables the corrupt-master, "
                        "corrupt-slave, truncate-master and truncate-slave faults (kill -9, one payload bit of a flushed "
                        "record flipped, or a sealed segment cut short, on disk, restart), "
                        "also in the random scenario (docs/chaos.md, 'Corruption')")
    p.add_argument("--liveness-bound", type=float, default=None,
                   help="seconds within which reads and writes must resume after a fault "
                        "(default 2 x zk.zkSessionTimeoutMs + 1 s)")


def secure_run(scenario: str, secure: bool, insecure: bool) -> bool:
    """Security is how the project should be run, so ``random`` runs secured unless told
    ``--insecure``; the single-fault scenarios stay as they were unless told ``--secure``."""
    return secure or (scenario == "random" and not insecure)


def main(args: argparse.Namespace) -> int:
    if args.scenario not in scenario_names():
        print(f"error: unknown scenario {args.scenario!r}; choose from {', '.join(scenario_names())}", file=sys.stderr)
        return 2
    out = Path(args.out or f"/tmp/chaos-{args.scenario}-{args.seed}").absolute()  # the cluster's processes have their own cwd
    # Checked before any process starts: a rate of 0 divided by zero in every producer once
    # the cluster was up, a negative or infinite one made them put without pause.
    for flag, value in (("--seconds", args.seconds), ("--rate", args.rate), ("--liveness-bound", args.liveness_bound)):
        if value is not None and not (math.isfinite(value) and value > 0):
            print(f"error: {flag} must be a positive number, got {value:g}", file=sys.stderr)
            return 2
    if args.secure and args.insecure:
        print("error: --secure and --insecure contradict each other; give one", file=sys.stderr)
        return 2
    if args.hosts == "netns" and (why_not := hosts_unavailable()) is not None:
        print(f"chaos run skipped: --hosts netns needs network namespaces: {why_not}", file=sys.stderr)
        return EXIT_SKIPPED
    try:
        schedule(args.scenario, args.seed, args.groups, args.zk_nodes, 1.0, steps=1, hosts=args.hosts,
                 can_cut=can_cut(args.hosts), power_loss=args.power_loss, corruption=args.corruption)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        (out / "cluster").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: cannot use --out {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return run_of(args, out).execute()


def run_of(args: argparse.Namespace, out: Path) -> Run:
    """The run the parsed flags ask for (not started)."""
    return Run(args.scenario, args.seconds, args.seed, out, mode=args.mode, groups=args.groups,
               zk_nodes=args.zk_nodes, rate=args.rate, slaves=args.slaves,
               on_sync_slave_loss=args.on_sync_slave_loss, liveness_bound=args.liveness_bound,
               secure=secure_run(args.scenario, args.secure, args.insecure), rogue=args.rogue, hosts=args.hosts,
               producers=ProducerSettings(idempotent=args.idempotent, retry_unknown=args.retry_unknown),
               consumer_group=args.consumer_group if args.consumer_group is not None else args.scenario == "random",
               transactions=args.transactions if args.transactions is not None else args.scenario == "random",
               power_loss=args.power_loss, corruption=args.corruption,
               topic_ops=args.topic_ops if args.topic_ops is not None else args.scenario == "random",
               time_reads=args.time_reads)
