"""The ``metaq`` PySpark data source: batch and streaming reads of a topic, from slaves by default,
and the sink (``df.write`` / ``df.writeStream``, exactly once through XA: sink.py).

    from metaq.spark import MetaQDataSource
    spark.dataSource.register(MetaQDataSource)
    df = spark.read.format("metaq").option("zkConnect", "127.0.0.1:2181").option("topic", "t").load()

Planning (ZooKeeper discovery, the replicas' committed offsets, split points) happens on
the driver; each task reads its range in ``read()`` with its own connection (see
``reader.py``). Streaming offsets are ``{"{brokerId}-{n}": byte offset}`` dicts that Spark
keeps in the query's checkpoint.
"""

from __future__ import annotations

import logging
from typing import Iterator, Sequence

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter,
                                    DataSourceWriter, InputPartition)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxRows,
                                              SupportsTriggerAvailableNow)
from pyspark.sql.types import StructType

from .fetch import AccessRefused
from .options import OptionError, SourceOptions
from ..client.message import Partition
from .sink_options import SinkOptions
from .planning import Planner, TopicPartition, discover, offsets_json_map, resolve_ranges
from .reader import SPARK_SCHEMA, MetaQInputPartition, read_partition

log = logging.getLogger(__name__)


def _input_partitions(
    planner: Planner, partitions: Sequence[TopicPartition], ranges: dict[str, tuple[int, int]]
) -> list[MetaQInputPartition]:
    options = planner.options
    result: list[MetaQInputPartition] = []
    for tp in partitions:
        if tp.name not in ranges:
            continue
        start, end = ranges[tp.name]
        if start >= end:
            continue
        pieces = planner.split(tp, start, end) if tp.replicas else [(start, end)]
        for i, (a, b) in enumerate(pieces):
            result.append(
                MetaQInputPartition(
                    topic=options.topic,
                    name=tp.name,
                    broker_id=tp.broker_id,
                    partition=tp.partition,
                    start=a,
                    end=b,
                    replicas=planner.ordered_for_reading(tp),
                    read_from=options.read_from,
                    zk_connect=options.zk_connect,
                    zk_root=options.zk_root,
                    fetch_bytes=options.fetch_bytes,
                    timeout_ms=options.timeout_ms,
                    split=i,
                    login=options.login,
                )
            )
    return result


class MetaQDataSource(DataSource):
    """``spark.read.format("metaq")`` / ``spark.readStream.format("metaq")``."""

    @classmethod
    def name(cls) -> str:
        return "metaq"

    def schema(self) -> str:
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return MetaQBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MetaQStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink import MetaQBatchWriter

        return MetaQBatchWriter(_sink_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import MetaQStreamWriter

        return MetaQStreamWriter(_sink_options(self.options, schema))


def _sink_options(options: dict, schema: StructType) -> SinkOptions:
    """The sink's options, checked with the DataFrame's columns on the driver."""
    sink = SinkOptions.parse(options)
    sink.check_columns({f.name: f.dataType.simpleString() for f in schema.fields})
    return sink


class MetaQBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        topic_partitions = discover(options)
        if not topic_partitions:
            raise ValueError(
                f"metaq: topic {options.topic!r} not found under {options.zk_root}/brokers/topics-sub "
                f"at {options.zk_connect} (no broker serves it)"
            )
        with Planner(options) as planner:
            for tp in topic_partitions:
                if not tp.replicas:
                    raise ValueError(f"metaq: {planner.no_replica_message(tp)}")
            ranges = resolve_ranges(planner, topic_partitions, options.starting, options.ending)
            parts = _input_partitions(planner, topic_partitions, ranges)
        # Spark needs at least one partition; an empty range reads nothing.
        return parts or [MetaQInputPartition(options.topic, "", -1, -1, 0, 0, (), options.read_from, options.zk_connect, options.zk_root, options.fetch_bytes, options.timeout_ms)]

    def read(self, partition: InputPartition) -> Iterator:
        assert isinstance(partition, MetaQInputPartition)
        if partition.start >= partition.end:
            return iter(())
        return read_partition(partition)


class MetaQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches between the checkpointed offsets and the replicas' committed offsets,
    cut by ``maxMessagesPerTrigger`` / ``maxBytesPerTrigger`` when set."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        #: Trigger.AvailableNow: the offsets available when the query started; batches stop there.
        self.available_now_end: dict[str, int] | None = None
        #: What the last ``latestOffset`` found available, before any read limit: Spark shows it
        #: as the source's ``latestOffset`` in each progress, next to ``endOffset`` (the lag).
        self._available: dict | None = None

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger is not None:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now_end = self._committed({})

    def latestOffset(self, start: dict | None = None, limit: object = None) -> dict:
        """Per partition, the committed offset of the replica we would read from (never below
        ``start``), within Trigger.AvailableNow's end, cut down to the read limit."""
        start = {name: int(value) for name, value in (start or {}).items()}
        latest = self._committed(start)
        if self.available_now_end is not None:
            latest = {name: max(start.get(name, 0), min(end, self.available_now_end.get(name, end)))
                      for name, end in latest.items()}
        self._available = offsets_json_map(latest)
        if limit is None or isinstance(limit, ReadAllAvailable):
            # Spark asks for everything (e.g. a trigger that ignores limits): the options do not apply.
            return offsets_json_map(latest)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        # Both options set: the default limit is the messages', the bytes' applies too.
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.options.max_bytes_per_trigger
        return offsets_json_map(self._limited(start, latest, max_rows, max_bytes))

    def reportLatestOffset(self) -> dict | None:
        """Per partition, the offset readable when this batch was planned (no extra round trip:
        what ``latestOffset`` found). A query's progress then shows each partition's lag behind
        it as ``sources[0].latestOffset[p] - sources[0].endOffset[p]`` (bytes of log)."""
        return self._available

    def _limited(self, start: dict[str, int], latest: dict[str, int], max_rows: int | None,
                 max_bytes: int | None) -> dict[str, int]:
        """Each partition's share of the limit in proportion to its new bytes (its lag), cut at
        a message boundary. A share is rounded up to a whole message (at least one), so a
        batch may exceed the limit by at most one message per partition. Partitions the
        checkpoint does not know yet (read from their beginning) are not limited."""
        behind = {name: end - start[name] for name, end in latest.items() if name in start and end > start[name]}
        total = sum(behind.values())
        if not total or ((max_bytes is None or total <= max_bytes) and max_rows is None):
            return latest
        limited = dict(latest)
        by_name = {tp.name: tp for tp in discover(self.options)}
        with Planner(self.options) as planner:
            for name, lag in behind.items():
                tp = by_name.get(name)
                if tp is None or not tp.replicas:
                    limited[name] = start[name]  # no replica to find a boundary on: nothing from it this time
                    continue
                share_bytes = None if max_bytes is None else -(-max_bytes * lag // total)
                share_rows = None if max_rows is None else -(-max_rows * lag // total)
                limited[name] = planner.boundary_after(tp, start[name], latest[name], share_bytes, share_rows)
        return limited

    def initialOffset(self) -> dict:
        options = self.options
        topic_partitions = [tp for tp in discover(options) if tp.replicas]
        with Planner(options) as planner:
            ranges = resolve_ranges(planner, topic_partitions, options.starting, options.ending)
        return offsets_json_map({name: start for name, (start, _end) in ranges.items()})

    def _committed(self, start: dict[str, int]) -> dict[str, int]:
        """Per partition, the committed offset of the replica we would read from (never
        below ``start``: a replica that is behind just means no new data there yet)."""
        latest: dict[str, int] = dict(start)
        with Planner(self.options) as planner:
            for tp in discover(self.options):
                if not tp.replicas:
                    continue
                try:
                    info = planner.offsets(tp)
                except (AccessRefused, OptionError):
                    raise  # a refused login (or an unreadable passwordFile) never heals by itself: fail, do not stall
                except Exception:
                    continue  # no replica reachable now: no new data from it in this batch
                previous = latest.get(tp.name)
                if previous is None:
                    # A partition born after the query started: from its beginning.
                    latest[tp.name] = info.committed
                else:
                    latest[tp.name] = max(previous, info.committed)
        return latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        options = self.options
        topic_partitions = {tp.name: tp for tp in discover(options)}
        parts: list[MetaQInputPartition] = []
        with Planner(options) as planner:
            ranges: dict[str, tuple[int, int]] = {}
            missing: list[TopicPartition] = []
            for name, stop in end.items():
                tp = topic_partitions.get(name)
                if name in start:
                    first = self._after_retention(planner, tp, name, int(start[name]), int(stop))
                elif tp is not None and tp.replicas:
                    first = planner.offsets(tp).min_offset
                else:
                    continue
                if first < int(stop):
                    ranges[name] = (first, int(stop))
                    if tp is None:
                        p = Partition.parse(name)
                        missing.append(TopicPartition(name, p.broker_id, p.partition, ()))
            parts = _input_partitions(planner, list(topic_partitions.values()) + missing, ranges)
        return parts

    def _after_retention(self, planner: Planner, tp: TopicPartition | None, name: str, first: int, stop: int) -> int:
        """``first``, or (``failOnDataLoss=false``) the log start when retention already deleted
        ``first``; with ``failOnDataLoss=true`` (the default) such a gap fails the query."""
        if tp is None or not tp.replicas or first >= stop:
            return first
        try:
            oldest = planner.offsets(tp).min_offset
        except (AccessRefused, OptionError):
            raise
        except Exception:
            return first  # no replica answers now: the task waits for one (timeoutMs), as before
        if first >= oldest:
            return first
        if self.options.fail_on_data_loss:
            raise ValueError(
                f"metaq: partition {name} of topic {self.options.topic}: offsets [{first}, {oldest}) were deleted "
                f"by retention before this query read them; set option failOnDataLoss=false to skip to {oldest}"
            )
        log.warning("metaq: partition %s of topic %s: offsets [%s, %s) were deleted by retention; skipping to %s "
                    "(failOnDataLoss=false)", name, self.options.topic, first, oldest, oldest)
        return min(oldest, stop)

    def read(self, partition: InputPartition) -> Iterator:
        assert isinstance(partition, MetaQInputPartition)
        if partition.start >= partition.end:
            return iter(())
        return read_partition(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, and a broker keeps no reader state."""
