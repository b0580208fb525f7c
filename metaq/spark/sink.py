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

Spark calls the driver's ``commit``/``abort`` without waiting for the attempts it is still
killing (a failed job's other tasks, a speculative loser): such an attempt may prepare
after the driver's ``recover`` sweep, and nobody would decide its branch. So the driver
*closes* the write on every broker group before it sweeps (``close_scope``: a marker xid,
started and rolled back, that the broker remembers), and a task checks for that mark after
preparing (``scope_closed``): a closed write means this attempt's result will never be
used, and it rolls its branches back itself. A prepare is either before the sweep (which
finds it) or after the mark (which the task then sees); the coordinator of a group orders
both. The mark lives only in the master's memory (it writes no record): a branch prepared
after a failover or restart that lost it, or by an attempt killed between its prepare and
its check, waits for the next sweep of any sink write (``BranchResolver.in_doubt`` rolls
back in-doubt branches of closed batch writes) or the broker's timeout.

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
spread over the partitions a put at a time. Rows of one partition keep their order
within a Spark partition.

A task never makes a Python object per row: each Arrow batch is placed with Arrow's
compute functions (``Placement.place``) and encoded from its columns' buffers
(``codec.encode_columns``, compiled), and its puts travel to the producers as
``EncodedRecords``.
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

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from ..client.config import MetaClientConfig
from ..client.accumulator import MAX_BATCH_COUNT
from ..client.codec import Column, EncodedRecords, encode_columns, key_crc32
from ..client.message import Message, Partition
from ..client.producer import StoredResults
from ..client.selector import NoPartitionAvailable
from ..client.session import AsyncMessageSessionFactory
from ..client.transactional import Branch, xa_name
from ..client.xa import TMFAIL, AsyncXAProducer, AsyncXAResource, Xid, XAError
from ..txn.xa import Code
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
#: Branch qualifier of a write's closing mark (``close_scope``). A task's qualifier is its
#: 4-byte Spark partition and 8 random bytes, so no task branch is ever named like this.
CLOSED_BQUAL = b"\xff\xff\xff\xffclosed"


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


def closed_xid(format_id: int, gtrid: bytes) -> Xid:
    """The closing mark of the write (or micro-batch) whose branches share ``gtrid``."""
    return Xid(format_id, gtrid, CLOSED_BQUAL)


async def close_scope(resource: AsyncXAResource, group: int, scope: tuple[int, bytes]) -> None:
    """Driver: mark the write decided on one broker group, before its last ``recover`` sweep.

    The mark is a branch that is started, ended and rolled back at once (it writes nothing,
    so it never holds a partition back); the broker remembers it as rolled back, and a
    ``rollback`` of it answers XA_OK from then on instead of XAER_NOTA (``scope_closed``)."""
    mark = Branch(str(closed_xid(*scope)), broker_id=group, started=True)
    for action in ("start", "end", "rollback"):
        # A retried start that finds the mark (XAER_DUPID) is our own: step() answers XA_OK.
        code = await resource.sender.step(mark, action)
        if code != Code.XA_OK:
            raise XAError(f"metaq sink: closing the write on broker group {group}: {action} answered {xa_name(code)}", code)


async def scope_closed(resource: AsyncXAResource, format_id: int, gtrid: bytes) -> bool:
    """Whether the driver has closed the write (``close_scope``) on this resource's broker group.

    A rollback of the mark: XAER_NOTA (no such branch) means open; XA_OK (remembered as rolled
    back, or idle and now rolled back by us) and XAER_PROTO (being closed right now) mean the
    driver has begun to close it."""
    try:
        await resource.rollback(closed_xid(format_id, gtrid))
    except XAError as exc:
        if exc.code == Code.XAER_NOTA:
            return False
        if exc.code != Code.XAER_PROTO:
            raise
    return True


def client_config(options: SinkOptions) -> MetaClientConfig:
    return MetaClientConfig(zk_connect=options.zk_connect, zk_root=options.zk_root,
                            credentials=options.login.credentials(), zk_tls=options.login.zk_tls())


# --- placement ---------------------------------------------------------------------------------


def arrow_column(array: Any) -> Column:
    """A binary or string Arrow array as ``codec.encode_columns`` reads it: its buffers, in place."""
    kind = array.type
    if pa.types.is_binary(kind) or pa.types.is_string(kind):
        width = 4
    elif pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
        width = 8
    else:
        raise ValueError(f"metaq sink: a column of type {kind} is not binary or string")
    validity, offsets, data = array.buffers()[:3]
    return offsets, b"" if data is None else data, validity if array.null_count else None, array.offset, width


def _array(batch: Any, name: str) -> Any:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index)


def _int64s(buffer: Any, count: int) -> Any:
    """An int64 Arrow array over a buffer of native int64s (``codec.key_crc32``'s)."""
    return pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(buffer)])


def _first_row(mask: Any) -> int:
    """The first row where a boolean Arrow array is true."""
    return int(pc.index(mask, True).as_py())


@dataclass
class Rows:
    """Rows of one Arrow batch that go to one place, in row order: ``rows[start:stop]`` of the
    batch's placement order, or rows ``start..stop`` themselves when ``rows`` is None."""

    topic: str
    partition: Partition | None  # None: spread, a partition per put
    rows: Any
    start: int
    stop: int


class Placement:
    """Which partition each row goes to (per task; a topic's partitions are read from ZooKeeper once).

    Decided per Arrow batch with Arrow's compute functions, not per row in Python: a row's
    topic and partition name are looked up once per distinct value, a key is hashed in C."""

    def __init__(self, factory: AsyncMessageSessionFactory, spread_from: int) -> None:
        self.cluster = factory.cluster
        self._partitions: dict[str, list[Partition]] = {}
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
        return found

    def _count(self, topic: str | None) -> int:
        """How many partitions the topic has (1 for a topic code no row uses: the option's when unset)."""
        return 1 if topic is None else len(self._partitions[topic])

    def spread(self, topic: str) -> Partition:
        """Rows without key or partition: each put to the next partition."""
        partitions = self._partitions[topic]
        self._spread += 1
        return partitions[(self._spread - 1) % len(partitions)]

    def named(self, topic: str, name: str) -> int:
        """The index of partition ``name`` ("0-1") among the topic's partitions."""
        partitions = self._partitions[topic]
        try:
            partition = Partition.parse(name)
        except ValueError as exc:
            raise ValueError(f"metaq sink: column partition: {exc}") from None
        if partition not in partitions:
            raise ValueError(f"metaq sink: topic {topic!r} has no partition {name} (it has {', '.join(map(str, partitions))})")
        return partitions.index(partition)

    async def topics(self, batch: Any, default: str | None, row_base: int) -> tuple[list[str], Any]:
        """The batch's topics and each row's index among them (None: all rows the one topic)."""
        column = _array(batch, "topic")
        if column is None:
            names: list[str | None] = [default]
            codes = None
        else:
            encoded = pc.dictionary_encode(column)
            # An empty topic is no topic (the option's), as a null one.
            names = [name or default for name in encoded.dictionary.to_pylist()] + [default]
            codes = encoded.indices.fill_null(len(names) - 1).cast(pa.int64())
            for code in pc.unique(codes).to_pylist():
                if names[code] is None:
                    row = _first_row(pc.equal(codes, code))
                    raise ValueError(f"metaq sink: row {row_base + row}: the topic is null and option topic is not set")
            # One code per topic (a null and an empty topic are both the option's).
            distinct = list(dict.fromkeys(names))
            codes = pc.take(pa.array([distinct.index(name) for name in names], pa.int64()), codes)
            used = pc.unique(codes).to_pylist()
            names = distinct
            if len(used) == 1:
                names, codes = [names[used[0]]], None
        if names[0] is None:
            raise ValueError("metaq sink: a row's topic is null and option topic is not set")
        for name in names:
            if name is not None:
                await self.partitions(name)
        return names, codes  # type: ignore[return-value]

    def partition_indexes(self, batch: Any, names: list[str], codes: Any) -> Any:
        """Each row's partition index within its topic, -1 to spread; None: every row spreads."""
        count = batch.num_rows
        topic_codes = pa.repeat(0, count).cast(pa.int64()) if codes is None else codes
        keys, labels = _array(batch, "key"), _array(batch, "partition")
        if labels is not None and labels.null_count < count:
            encoded = pc.dictionary_encode(labels)
            labels_seen = encoded.dictionary.to_pylist()
            spread = len(labels_seen)
            # Each (topic, partition name) met once: checked, then mapped to its index.
            pairs = pc.add(pc.multiply(topic_codes, spread + 1), encoded.indices.fill_null(spread).cast(pa.int64()))
            distinct = pc.unique(pairs)
            indexes = [-1 if label == spread else self.named(names[topic], labels_seen[label])
                       for topic, label in (divmod(pair, spread + 1) for pair in distinct.to_pylist())]
            return pc.take(pa.array(indexes, pa.int64()), pc.index_in(pairs, value_set=distinct))
        if keys is not None and keys.null_count < count:
            # The client's KeyHashPartitionSelector: CRC32 of the key over the topic's sorted partitions.
            hashes = _int64s(key_crc32(arrow_column(keys), count), count)
            sizes = pc.take(pa.array([self._count(name) for name in names], pa.int64()), topic_codes)
            indexes = pc.subtract(hashes, pc.multiply(pc.divide(hashes, sizes), sizes))
            return pc.if_else(pc.less(hashes, 0), -1, indexes)
        return None

    async def place(self, batch: Any, default_topic: str | None, row_base: int) -> list[Rows]:
        """The batch's rows by place, each place's rows in row order (a partition's rows keep their order)."""
        names, codes = await self.topics(batch, default_topic, row_base)
        indexes = self.partition_indexes(batch, names, codes)
        count = batch.num_rows
        if indexes is not None:
            unplaced = pc.less(indexes, 0)
            if pc.all(unplaced).as_py():
                indexes = None
            elif pc.any(unplaced).as_py():
                # Rows without a key or name beside rows with one: placed before the rows are
                # grouped (all to the next partition), so a partition's rows stay in row order.
                turn = pa.array([self._spread % self._count(name) for name in names], pa.int64())
                self._spread += 1
                indexes = pc.if_else(unplaced, pc.take(turn, pa.repeat(0, count) if codes is None else codes), indexes)
        if indexes is None and codes is None:
            return [Rows(names[0], None, None, 0, count)]
        widest = max(self._count(name) for name in names)
        places = pa.repeat(0, count).cast(pa.int64()) if codes is None else pc.multiply(codes, widest + 1)
        if indexes is not None:
            places = pc.add(places, pc.if_else(pc.less(indexes, 0), widest, indexes))
        else:
            places = pc.add(places, widest)
        order = pc.sort_indices(places)  # stable: rows of one place stay in order
        runs = pc.run_end_encode(pc.take(places, order))
        rows = order.buffers()[1]
        found, start = [], 0
        for end, place in zip(runs.run_ends.to_pylist(), runs.values.to_pylist()):
            topic, index = divmod(place, widest + 1)
            partition = None if index == widest else self._partitions[names[topic]][index]
            found.append(Rows(names[topic], partition, rows, start, end))
            start = end
        return found

    def puts(self, batch: Any, places: list[Rows], options: SinkOptions, row_base: int) -> list[EncodedRecords]:
        """The batch's records, encoded from its columns in puts of up to ``batchBytes``."""
        values = arrow_column(_array(batch, "value"))
        attribute = _array(batch, "attribute")
        attributes = None if attribute is None or attribute.null_count == len(attribute) else arrow_column(attribute)
        puts = []
        for place in places:
            position = place.start
            while position < place.stop:
                try:
                    body, starts, position = encode_columns(values, attributes, place.rows, position, place.stop, options.batch_bytes,
                                                            MAX_BATCH_COUNT, options.max_message_size, row_base)
                except ValueError as exc:
                    raise ValueError(f"metaq sink: {exc}") from None
                partition = place.partition or self.spread(place.topic)
                puts.append(EncodedRecords(place.topic, partition, body, starts))
        return puts


# --- the two ways of sending -------------------------------------------------------------------


class PlacedSelector:
    """The sink picks each put's partition itself (``Message.partition``); the producer follows."""

    per_message = False

    def select(self, topic: str, partitions: list[Partition], message: Message) -> Partition:
        if message.partition not in partitions:
            raise NoPartitionAvailable(f"partition {message.partition} of topic {topic!r} has no master right now")
        return message.partition


def by_key(puts: Iterable[EncodedRecords], key: Any) -> list[list[EncodedRecords]]:
    """``puts`` grouped by ``key(put)``, each group in the order given."""
    groups: dict[Any, list[EncodedRecords]] = {}
    for put in puts:
        groups.setdefault(key(put), []).append(put)
    return list(groups.values())


class XAWrites:
    """One XA branch per broker group written to, all under one xid (the task attempt's)."""

    def __init__(self, factory: AsyncMessageSessionFactory, xid: Xid, timeout_s: int) -> None:
        self.factory = factory
        self.xid = xid
        self.timeout_s = timeout_s
        self.producers: dict[int, AsyncXAProducer] = {}

    async def send_all(self, puts: list[EncodedRecords]) -> None:
        """Broker groups in parallel; a group's puts one after the other (its branch takes one at a time)."""
        await asyncio.gather(*(self._send(group) for group in by_key(puts, lambda put: put.partition.broker_id)))

    async def _send(self, puts: list[EncodedRecords]) -> None:
        group = puts[0].partition.broker_id
        producer = self.producers.get(group)
        if producer is None:
            producer = self.factory.create_xa_producer(group, PlacedSelector())
            resource = producer.xa_resource()
            resource.set_transaction_timeout(self.timeout_s)
            await resource.start(self.xid)
            self.producers[group] = producer
        branch = producer.xa_resource().associated
        for put in puts:
            # The sender's put in the branch (AsyncXAProducer.send_batch without making the
            # results a list: they are built only if read, and the sink does not read them).
            await producer.sender.send(branch, put.as_messages())

    async def finish(self) -> tuple[tuple[int, str], ...]:
        """End and prepare every branch: the xids the driver may commit (none if the write is
        already decided: this attempt is late and its branches are rolled back here)."""
        prepared = []
        for group, producer in sorted(self.producers.items()):
            resource = producer.xa_resource()
            await resource.end(self.xid)
            if await resource.prepare(self.xid) == resource.XA_OK:
                prepared.append((group, str(self.xid)))
        # Checked after the prepares, on each group prepared on: a prepare the driver's sweep
        # missed came after its closing mark, so this check sees the mark (module docstring).
        for group, _ in prepared:
            if await scope_closed(self.producers[group].xa_resource(), self.xid.format_id, self.xid.gtrid):
                log.warning("metaq sink: attempt %s finished after its write was decided; rolling its branches back", self.xid)
                await self.fail()
                return ()
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
    """At least once: the client's producer, puts to different partitions in parallel."""

    def __init__(self, factory: AsyncMessageSessionFactory) -> None:
        self.producer = factory.create_producer(PlacedSelector())

    async def send_all(self, puts: list[EncodedRecords]) -> None:
        """Partitions in parallel; a partition's puts one after the other (so they keep their order)."""
        await asyncio.gather(*(self._send(group) for group in by_key(puts, lambda put: (put.topic, put.partition))))

    async def _send(self, puts: list[EncodedRecords]) -> None:
        producer = self.producer
        for put in puts:
            if put.topic not in producer.cluster.snapshot.pub:
                await producer.publish(put.topic)
            # The producer's one put with its retries; its results are built only if read, and
            # only a failed put's are (all of a put's results share its outcome).
            results = await producer._send_chunk(put.topic, put.partition, put.as_messages())
            if not isinstance(results, StoredResults) and results and not results[0].success:
                failed = results[0]
                raise RuntimeError(f"metaq sink: a put of {len(results)} rows to {put.topic}-{failed.partition or put.partition} "
                                   f"was not stored: {failed.error_message}")

    async def finish(self) -> tuple[tuple[int, str], ...]:
        return ()

    async def fail(self) -> None:
        pass


# --- the task ------------------------------------------------------------------------------------


async def write_task(options: SinkOptions, batches: Iterable[Any], xid: Xid | None, spread_from: int) -> tuple[tuple[tuple[int, str], ...], int]:
    """Send every row of ``batches`` (pyarrow RecordBatches); XA branches prepared when ``xid``.

    Each batch's rows are placed and encoded from its Arrow columns (``codec.encode_columns``,
    no Python object per row), then sent before the next batch is read."""
    rows = 0
    async with AsyncMessageSessionFactory(client_config(options)) as factory:
        writes: XAWrites | PlainWrites = XAWrites(factory, xid, options.transaction_timeout_s) if xid else PlainWrites(factory)
        placement = Placement(factory, spread_from)
        try:
            for batch in batches:
                if batch.num_rows:
                    places = await placement.place(batch, options.topic, rows)
                    await writes.send_all(placement.puts(batch, places, options, rows))
                rows += batch.num_rows
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

    def groups(self) -> list[int]:
        return [group for group, addresses in sorted(self.factory.cluster.snapshot.brokers.items()) if addresses.master]

    async def close(self, scope: tuple[int, bytes]) -> None:
        """Mark the write decided on every broker group (``close_scope``), before the last sweep."""
        for group in self.groups():
            try:
                await close_scope(self.resource(group), group, scope)
            except Exception as exc:
                # Safe to go on: an attempt that prepares late on this group is then left to the
                # next sweep of a sink write or to the broker's timeout; it never shows.
                log.warning("metaq sink: could not close the write on broker group %s (%s)", group, exc)

    async def recovered(self) -> list[tuple[int, Xid]]:
        """In-doubt branches of the sink (either format) on every broker group."""
        found = []
        for group in self.groups():
            try:
                xids = await self.resource(group).recover()
            except Exception as exc:
                # Safe to skip: a branch left in doubt is resolved by the next batch's sweep, or
                # rolled back by the broker's timeout; either way it never shows half-decided.
                log.warning("metaq sink: recover on broker group %s failed (%s); its in-doubt branches wait", group, exc)
                continue
            found.extend((group, xid) for xid in xids if xid.format_id in (BATCH_FORMAT_ID, STREAM_FORMAT_ID))
        return found

    async def in_doubt(self, format_id: int, prefix: bytes) -> list[tuple[int, Xid]]:
        """Prepared branches of the sink whose gtrid starts with ``prefix``, on every broker group;
        in-doubt branches of other batch writes that are closed are rolled back on the way (left
        by attempts killed between their prepare and their check, or prepared after a failover)."""
        mine, closed_elsewhere = [], []
        known: dict[tuple[int, bytes], bool] = {}
        for group, xid in await self.recovered():
            if xid.format_id == format_id and xid.gtrid.startswith(prefix):
                mine.append((group, xid))
            elif xid.format_id == BATCH_FORMAT_ID:
                # Only batch writes: a closed write committed every branch it chose before its
                # mark (a stream's batch may be closed with decided branches still to commit).
                if (group, xid.gtrid) not in known:
                    known[group, xid.gtrid] = await scope_closed(self.resource(group), xid.format_id, xid.gtrid)
                if known[group, xid.gtrid]:
                    closed_elsewhere.append((group, xid))
        await self.rollback(closed_elsewhere)
        return mine

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
            except XAError as exc:
                if exc.code == Code.XA_HEURRB:
                    # The broker rolled it back on its timeout, as we wanted; XA leaves the
                    # heuristic outcome listed by recover until the transaction manager forgets it.
                    await self.resource(group).forget(xid)
                # else already rolled back (XAER_NOTA after its tombstone went): nothing visible


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
            await resolver.close(self.scope)  # attempts still running roll themselves back from here on
            # Branches no message reports: attempts that failed or lost to another after prepare.
            await resolver.rollback(b for b in await resolver.in_doubt(*self.scope) if b not in chosen)

        _run(self.options, work)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.options.exactly_once:
            return

        async def work(resolver: BranchResolver) -> None:
            await resolver.rollback(reported(messages))
            await resolver.close(self.scope)  # attempts Spark is still killing roll themselves back
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
            if commit_this_run:
                # The batch is decided: attempts still running roll themselves back. Not on abort:
                # Spark runs an aborted batch again after a restart, under the same xids' gtrid.
                await resolver.close(xid_scope(STREAM_FORMAT_ID, query, batch_id))
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
