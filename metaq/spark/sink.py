"""The ``metaq`` Spark sink: ``df.write.format("metaq")`` and ``df.writeStream.format("metaq")``.

Exactly once through XA (``exactlyOnce``, the default). Each task writes its rows inside
its own XA branch on every broker group it writes to (one xid, one branch per group),
ends and prepares the branches when its input is exhausted, and reports the xids in its
commit message. The driver's ``commit`` commits every reported branch, ``abort`` rolls
them back. Branches that no commit message reports (a failed, killed or speculative task
attempt that got as far as prepare) are found with ``recover``: every xid of a write
starts with a prefix that names it (``xid_scope``), and the driver rolls back those of
its write that it did not decide to commit. An unprepared branch of a dead task is rolled
back by the broker when its transaction timeout passes; until then it holds back the
partition's last stable offset, never shows.

Streams: the xid prefix is the query id and the batch id, so branches of a micro-batch are
found again after a driver crash. Before committing a micro-batch the driver writes its
decision (the xids it commits) to ``{checkpointLocation}/metaq-sink/{batchId}``: a batch
that Spark re-runs after a crash between that decision and Spark's own commit log finds
it, commits what of the first run is still in doubt and rolls back the re-run's branches,
so nothing is written twice; in-doubt branches of an undecided batch are rolled back.

``exactlyOnce=false``: the client's batched producer, at least once (a retried task or
batch writes its rows again).

Rows are placed by the ``partition`` column (a partition name, "0-1"), else by the
``key`` column (CRC32 of the key over the topic's partitions, as the client's
``KeyHashPartitionSelector``: the same key always lands in the same partition), else
spread over the partitions chunk by chunk. Rows of one partition keep their order
within a Spark partition.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from ..client.config import MetaClientConfig
from ..client.message import Message, Partition
from ..client.selector import KeyHashPartitionSelector, NoPartitionAvailable
from ..client.session import AsyncMessageSessionFactory
from ..client.xa import TMFAIL, AsyncXAProducer, Xid, XAError
from .options_error import OptionError
from .sink_options import SinkOptions

log = logging.getLogger(__name__)

#: XA format ids of the sink's branches ('MQSB' batch writes, 'MQSS' streams): recover
#: returns every in-doubt branch of a group, the sink touches only its own.
BATCH_FORMAT_ID = 0x4D515342
STREAM_FORMAT_ID = 0x4D515353
#: Micro-batch decisions kept in the checkpoint (Spark keeps 100 batches by default too).
DECISIONS_KEPT = 100
DECISIONS_DIR = "metaq-sink"


@dataclass
class SinkCommit(WriterCommitMessage):
    """What a task reports: its prepared branches ``(broker group, xid)`` and rows written."""

    branches: tuple[tuple[int, str], ...]
    rows: int
    query_id: str | None = None


def xid_scope(format_id: int, write_id: uuid.UUID, batch_id: int) -> tuple[int, bytes]:
    """The (format id, gtrid) every branch of one write (or micro-batch) shares."""
    return format_id, write_id.bytes + batch_id.to_bytes(8, "big")


def task_xid(scope: tuple[int, bytes], partition_id: int) -> Xid:
    """A fresh xid for one task attempt: the write's gtrid, the Spark partition, 8 random bytes
    (two attempts of one partition, or a re-run after a restart, never share a branch)."""
    return Xid(scope[0], scope[1], partition_id.to_bytes(4, "big") + os.urandom(8))


def client_config(options: SinkOptions) -> MetaClientConfig:
    return MetaClientConfig(zk_connect=options.zk_connect, zk_root=options.zk_root,
                            credentials=options.login.credentials())


# --- placement -------------------------------------------------------------------------------


class PlacedSelector:
    """The sink picks each row's partition itself (``Message.partition``); the producer follows.

    The sink hands the producer one partition's messages per call, so the producer may ask
    once per put with the first message (``per_message = False``)."""

    per_message = False

    def select(self, topic: str, partitions: list[Partition], message: Message) -> Partition:
        if message.partition not in partitions:
            raise NoPartitionAvailable(f"partition {message.partition} of topic {topic!r} has no master right now")
        return message.partition


class Placement:
    """Which partition a row goes to (per task; a topic's partitions are read from ZooKeeper once)."""

    def __init__(self, factory: AsyncMessageSessionFactory, spread_from: int) -> None:
        self.cluster = factory.cluster
        self._partitions: dict[str, list[Partition]] = {}
        self._by_key: dict[str, KeyHashPartitionSelector] = {}
        self._spread = spread_from

    async def partitions(self, topic: str) -> list[Partition]:
        found = self._partitions.get(topic)
        if found is None:
            # Every partition of the topic (topics-sub), live or not: a key's partition must
            # not move when one master is briefly away (the selector's ``stable`` mode).
            await self.cluster.watch_topic(topic, subscribe=True)
            found = sorted(self.cluster.snapshot.readable_partitions(topic))
            if not found:
                raise ValueError(f"metaq sink: topic {topic!r}: no broker serves it (nothing under topics-sub)")
            self._partitions[topic] = found
            # The client's rule (CRC32 of the key over the sorted partitions), so a Spark job
            # and a client producer agree on a key's partition; here the "message" is the key.
            self._by_key[topic] = KeyHashPartitionSelector(key=lambda key: key, stable=True, all_partitions=found)
        return found

    def knows(self, topic: str) -> bool:
        return topic in self._partitions

    def place(self, topic: str, key: bytes | str | None, name: str | None) -> Partition:
        """The row's partition; ``partitions(topic)`` was awaited once before."""
        partitions = self._partitions[topic]
        if name is not None:
            try:
                partition = Partition.parse(name)
            except ValueError as exc:
                raise ValueError(f"metaq sink: column partition: {exc}") from None
            if partition not in partitions:
                raise ValueError(f"metaq sink: topic {topic!r} has no partition {name} (it has {', '.join(map(str, partitions))})")
            return partition
        if key is not None:
            return self._by_key[topic].select(topic, partitions, key)  # type: ignore[arg-type]
        return partitions[self._spread % len(partitions)]

    def next_chunk(self) -> None:
        """Rows without key or partition go to the next partition after each flushed chunk."""
        self._spread += 1


# --- the two ways of sending -------------------------------------------------------------------


class XAWrites:
    """One XA branch per broker group written to, all under one xid (the task attempt's)."""

    def __init__(self, factory: AsyncMessageSessionFactory, xid: Xid, timeout_s: int) -> None:
        self.factory = factory
        self.xid = xid
        self.timeout_s = timeout_s
        self.producers: dict[int, AsyncXAProducer] = {}

    async def send(self, partition: Partition, messages: list[Message]) -> None:
        producer = self.producers.get(partition.broker_id)
        if producer is None:
            producer = self.factory.create_xa_producer(partition.broker_id, PlacedSelector())
            resource = producer.xa_resource()
            resource.set_transaction_timeout(self.timeout_s)
            await resource.start(self.xid)
            self.producers[partition.broker_id] = producer
        await producer.send_batch(messages)

    async def finish(self) -> tuple[tuple[int, str], ...]:
        """End and prepare every branch: the xids the driver may commit."""
        prepared = []
        for group, producer in sorted(self.producers.items()):
            resource = producer.xa_resource()
            await resource.end(self.xid)
            if await resource.prepare(self.xid) == resource.XA_OK:
                prepared.append((group, str(self.xid)))
        return tuple(prepared)

    async def fail(self) -> None:
        """The task failed: roll back what it started (a branch it cannot reach times out on the broker)."""
        for producer in self.producers.values():
            resource = producer.xa_resource()
            for step in (lambda: resource.end(self.xid, TMFAIL), lambda: resource.rollback(self.xid)):
                try:
                    await step()
                except Exception:
                    pass  # best effort: the broker's timeout rolls back what we could not


class PlainWrites:
    """At least once: the client's batched producer, chunks to several partitions in parallel."""

    def __init__(self, factory: AsyncMessageSessionFactory) -> None:
        self.producer = factory.create_producer(PlacedSelector())

    async def send_all(self, groups: Iterable[list[Message]]) -> None:
        """One partition's messages per group, the groups in parallel (order kept within each)."""
        for results in await asyncio.gather(*(self.producer.send_batch(messages) for messages in groups)):
            for result in results:
                if not result.success:
                    raise RuntimeError(f"metaq sink: a message to {result.topic}-{result.partition} was not stored: {result.error_message}")

    async def finish(self) -> tuple[tuple[int, str], ...]:
        return ()

    async def fail(self) -> None:
        pass


# --- the task ------------------------------------------------------------------------------------


def _column(batch: Any, name: str) -> list[Any] | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index).to_pylist()


async def write_task(options: SinkOptions, batches: Iterable[Any], xid: Xid | None, spread_from: int) -> tuple[tuple[tuple[int, str], ...], int]:
    """Send every row of ``batches`` (pyarrow RecordBatches); XA branches prepared when ``xid``."""
    rows = 0
    async with AsyncMessageSessionFactory(client_config(options)) as factory:
        writes: XAWrites | PlainWrites = XAWrites(factory, xid, options.transaction_timeout_s) if xid else PlainWrites(factory)
        placement = Placement(factory, spread_from)
        pending: list[Message] = []
        pending_bytes = 0

        async def flush() -> None:
            nonlocal pending, pending_bytes
            # Rows by (topic, partition), each group in row order: a partition's rows stay in order.
            groups: dict[tuple[str, Partition], list[Message]] = {}
            for m in pending:
                groups.setdefault((m.topic, m.partition), []).append(m)
            if isinstance(writes, PlainWrites):
                await writes.send_all(groups.values())
            else:
                for (_, partition), messages in groups.items():
                    await writes.send(partition, messages)
            pending, pending_bytes = [], 0
            placement.next_chunk()

        try:
            for batch in batches:
                values = _column(batch, "value")
                n = len(values or ())
                attributes = _column(batch, "attribute") or [None] * n
                topics = _column(batch, "topic") or [None] * n
                keys = _column(batch, "key") or [None] * n
                names = _column(batch, "partition") or [None] * n
                for value, attribute, topic, key, name in zip(values, attributes, topics, keys, names):
                    if value is None:
                        raise ValueError("metaq sink: a row's value is null (column value is required)")
                    if isinstance(value, str):
                        value = value.encode("utf-8")
                    topic = topic or options.topic
                    if topic is None:
                        raise ValueError("metaq sink: a row's topic is null and option topic is not set")
                    if not placement.knows(topic):
                        await placement.partitions(topic)
                    partition = placement.place(topic, key, name)
                    pending.append(Message(topic, value, attribute, partition=partition))
                    pending_bytes += len(value)
                    if pending_bytes >= options.batch_bytes:
                        await flush()
                rows += n
            if pending:
                await flush()
            branches = await writes.finish()
        except BaseException:
            await writes.fail()
            raise
    return branches, rows


# --- the driver: decide, commit, roll back, resolve ----------------------------------------------


class BranchResolver:
    """Driver side: commits and rolls back branches, and lists the in-doubt ones of a scope."""

    def __init__(self, factory: AsyncMessageSessionFactory) -> None:
        self.factory = factory
        self._resources: dict[int, Any] = {}

    def resource(self, group: int) -> Any:
        if group not in self._resources:
            self._resources[group] = self.factory.create_xa_producer(group).xa_resource()
        return self._resources[group]

    async def in_doubt(self, format_id: int, prefix: bytes) -> list[tuple[int, Xid]]:
        """Prepared branches of the sink whose gtrid starts with ``prefix``, on every broker group."""
        found = []
        for group, addresses in sorted(self.factory.cluster.snapshot.brokers.items()):
            if not addresses.master:
                continue
            try:
                xids = await self.resource(group).recover()
            except Exception as exc:
                # Safe to skip: a branch left in doubt is resolved by the next batch's sweep, or
                # rolled back by the broker's timeout; either way it never shows half-decided.
                log.warning("metaq sink: recover on broker group %s failed (%s); its in-doubt branches wait", group, exc)
                continue
            found.extend((group, xid) for xid in xids if xid.format_id == format_id and xid.gtrid.startswith(prefix))
        return found

    async def commit(self, branches: Iterable[tuple[int, Xid]]) -> None:
        for group, xid in branches:
            try:
                await self.resource(group).commit(xid, one_phase=False)
            except XAError as exc:
                raise RuntimeError(
                    f"metaq sink: commit of {xid} on broker group {group} failed ({exc}); if the broker rolled it back "
                    "on its timeout (XA_HEURRB), that part of the write is lost: raise maxTxTimeoutInSeconds"
                ) from None

    async def rollback(self, branches: Iterable[tuple[int, Xid]]) -> None:
        for group, xid in branches:
            try:
                await self.resource(group).rollback(xid)
            except XAError:
                pass  # already rolled back (timeout, XAER_NOTA after its tombstone went): nothing visible


def reported(messages: Sequence[WriterCommitMessage | None]) -> list[tuple[int, Xid]]:
    return [(group, Xid.parse(xid)) for m in messages if isinstance(m, SinkCommit) for group, xid in m.branches]


def _run(options: SinkOptions, work: Any) -> None:
    async def main() -> None:
        async with AsyncMessageSessionFactory(client_config(options)) as factory:
            await work(BranchResolver(factory))

    asyncio.run(main())


def _task_context() -> Any:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("metaq sink: write() runs outside a Spark task")
    return context


class MetaQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("metaq")``: one XA scope per write (a random id made on the driver)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.scope = xid_scope(BATCH_FORMAT_ID, uuid.uuid4(), 0)

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        partition_id = _task_context().partitionId()
        xid = task_xid(self.scope, partition_id) if self.options.exactly_once else None
        branches, rows = asyncio.run(write_task(self.options, iterator, xid, partition_id))
        return SinkCommit(branches, rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.options.exactly_once:
            return
        chosen = reported(messages)

        async def work(resolver: BranchResolver) -> None:
            await resolver.commit(chosen)
            # Branches no message reports: attempts that failed or lost to another after prepare.
            await resolver.rollback(b for b in await resolver.in_doubt(*self.scope) if b not in chosen)

        _run(self.options, work)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.options.exactly_once:
            return

        async def work(resolver: BranchResolver) -> None:
            await resolver.rollback(reported(messages))
            await resolver.rollback(await resolver.in_doubt(*self.scope))

        _run(self.options, work)


class Decisions:
    """The sink's decisions per micro-batch, in the query's checkpoint: ``metaq-sink/{batchId}``
    holds the xids the driver decided to commit, written (atomically) before the first commit."""

    def __init__(self, checkpoint: str) -> None:
        path = checkpoint[len("file:"):] if checkpoint.startswith("file:") else checkpoint
        if "://" in path:
            raise OptionError(
                f"option checkpointLocation {checkpoint}: the exactly-once metaq sink keeps its decisions there and needs "
                "a path the driver can open as a file (local or mounted); use exactlyOnce=false otherwise"
            )
        self.root = Path(path)
        self.dir = self.root / DECISIONS_DIR

    def query_id(self) -> str:
        """The query's id, which Spark wrote to the checkpoint's ``metadata`` when the query first started."""
        metadata = self.root / "metadata"
        try:
            return str(json.loads(metadata.read_text().splitlines()[0])["id"])
        except (OSError, ValueError, KeyError, IndexError) as exc:
            raise RuntimeError(f"metaq sink: cannot read the query id from {metadata}: {exc}") from None

    def read(self, batch_id: int) -> list[tuple[int, Xid]] | None:
        try:
            data = json.loads((self.dir / str(batch_id)).read_text())
        except FileNotFoundError:
            return None
        return [(int(group), Xid.parse(xid)) for group, xid in data["branches"]]

    def write(self, batch_id: int, branches: list[tuple[int, Xid]]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{batch_id}.tmp"
        with open(tmp, "w") as f:
            json.dump({"batch": batch_id, "branches": [[group, str(xid)] for group, xid in branches]}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / str(batch_id))  # the decision exists whole or not at all
        for old in self.dir.iterdir():
            if old.name.isdigit() and int(old.name) <= batch_id - DECISIONS_KEPT:
                old.unlink(missing_ok=True)


def batch_of(xid: Xid) -> int:
    return int.from_bytes(xid.gtrid[16:24], "big")


class MetaQStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("metaq")``: branches named by (query id, batch id, Spark partition)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        if options.exactly_once:
            if options.checkpoint_location is None:
                raise OptionError(
                    "the exactly-once metaq sink needs option checkpointLocation on the writeStream (it keeps its "
                    "commit decisions there); or set exactlyOnce=false"
                )
            Decisions(options.checkpoint_location)  # checks the path's form on the driver, before any task

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        context = _task_context()
        partition_id = context.partitionId()
        query_id = context.getLocalProperty("sql.streaming.queryId")
        batch_id = int(context.getLocalProperty("streaming.sql.batchId") or 0)
        xid = None
        if self.options.exactly_once:
            xid = task_xid(xid_scope(STREAM_FORMAT_ID, uuid.UUID(query_id), batch_id), partition_id)
        branches, rows = asyncio.run(write_task(self.options, iterator, xid, partition_id + batch_id))
        return SinkCommit(branches, rows, query_id)

    def _resolve(self, messages: list[WriterCommitMessage | None], batch_id: int, commit_this_run: bool) -> None:
        assert self.options.checkpoint_location is not None
        decisions = Decisions(self.options.checkpoint_location)
        query = uuid.UUID(next((m.query_id for m in messages if isinstance(m, SinkCommit) and m.query_id), None)
                          or decisions.query_id())
        mine = reported(messages)

        async def work(resolver: BranchResolver) -> None:
            earlier = decisions.read(batch_id)
            if earlier is None and commit_this_run:
                decisions.write(batch_id, mine)  # the decision: from here on this batch is committed
                await resolver.commit(mine)
            else:
                # Spark re-runs a batch the sink had already committed (the driver died before Spark's
                # commit log recorded it): the first run's rows stand, this run's never show.
                await resolver.rollback(mine)
            # In-doubt branches of this query: committed if their batch was decided, else rolled back
            # (failed or speculative attempts, a run that died before deciding).
            _, prefix = xid_scope(STREAM_FORMAT_ID, query, 0)
            leftovers = await resolver.in_doubt(STREAM_FORMAT_ID, prefix[:16])
            decided: dict[int, set[tuple[int, Xid]]] = {}
            for group, xid in leftovers:
                batch = batch_of(xid)
                if batch not in decided:
                    decided[batch] = set(decisions.read(batch) or ())
                if (group, xid) in decided[batch]:
                    await resolver.commit([(group, xid)])
                else:
                    await resolver.rollback([(group, xid)])

        _run(self.options, work)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once:
            self._resolve(messages, batchId, commit_this_run=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once:
            self._resolve(messages, batchId, commit_this_run=False)
