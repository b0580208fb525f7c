"""Driver-side planning: which partitions, which replicas, which offset ranges.

Discovery reuses the client's ``Cluster`` (ZooKeeper: ``topics-sub`` for partitions,
``brokers/ids`` for replicas) and ``choose_replica`` (the read-from policy), so the Spark
source finds and picks replicas exactly as a consumer does.

Offsets are byte positions and identical on every replica. A range ``[start, end)`` holds
the records whose *start offset* lies in it; ``start`` and ``end`` are message boundaries.

Splitting (``maxBytesPerPartition``): split points must be message boundaries, and a byte
position inside a log says nothing about where a record starts (no sync markers; a payload
may even contain bytes that look like records). So the driver computes each split point
exactly: for the nominal point ``p = previous + maxBytes`` it takes the largest known
boundary ``<= p`` (the previous split point, or the start of the segment holding ``p``,
which the ``offset`` command returns: segments start at record boundaries on every
replica, since appends and replicated chunks are whole records) and walks record headers
forward from there to the first boundary ``>= p``. The walk reads headers only (a record
longer than the fetched bytes is skipped by fetching at its end), at most ``maxBytes``
per split, so planning costs at most one pass over the headers of the partition and
usually much less. Readers then start exactly at a boundary and stop exactly at one;
every record belongs to exactly one split.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from ..client.cluster import Cluster
from ..client.config import MetaClientConfig
from ..client.connection import Credentials
from ..client.message import Partition
from ..client.routing import BrokerAddresses, Replica, choose_replica
from ..errors import MetaqError
from ..zk.paths import partition_name
from .fetch import OffsetInfo, ReplicaError, ReplicaSession, first_boundary_at_or_after
from .options import EARLIEST, LATEST, OffsetSpec, OptionError, SourceOptions, TimeSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicPartition:
    """One partition of the topic and its replicas, in the order a reader tries them."""

    name: str  # "{brokerId}-{n}"
    broker_id: int
    partition: int
    replicas: tuple[Replica, ...]


# --- pure helpers (unit-tested) ------------------------------------------------------------


def without(addresses: BrokerAddresses, replica: Replica) -> BrokerAddresses:
    """``addresses`` minus one replica."""
    if replica.role == "master":
        return BrokerAddresses(addresses.broker_id, None, addresses.slaves)
    slave_id = int(replica.role[5:])
    return BrokerAddresses(addresses.broker_id, addresses.master, tuple(s for s in addresses.slaves if s[0] != slave_id))


def ordered_replicas(addresses: BrokerAddresses | None, read_from: str, rng: random.Random) -> tuple[Replica, ...]:
    """The replicas ``read_from`` allows, in the order to try them: ``choose_replica`` picks
    the first, then the next from what is left, and so on (so ``master`` falls back to the
    slaves, ``slave`` never reaches the master, ``prefer-slave`` ends with the master)."""
    order: list[Replica] = []
    remaining = addresses
    while remaining is not None:
        replica = choose_replica(remaining, read_from, rng=rng)
        if replica is None or replica in order:
            break
        order.append(replica)
        remaining = without(remaining, replica)
    return tuple(order)


def resolve_offset(value: int | str, info: OffsetInfo, option: str, name: str) -> int:
    if value == EARLIEST:
        return info.min_offset
    if value == LATEST:
        return info.committed
    assert isinstance(value, int)
    if value < info.min_offset:
        raise OptionError(
            f"{option}: offset {value} of partition {name} is before the first available offset {info.min_offset} "
            f"(deleted by retention); use 'earliest'"
        )
    if value > info.committed:
        raise OptionError(f"{option}: offset {value} of partition {name} is beyond its committed offset {info.committed}")
    return value


def check_partition_names(spec: OffsetSpec, known: Iterable[str], option: str, topic: str) -> None:
    known = sorted(set(known), key=Partition.parse)
    for name in spec.per_partition:
        if name not in known:
            raise OptionError(f"{option}: topic {topic!r} has no partition {name!r} (it has {', '.join(known) or 'none'})")


def split_range(start: int, end: int, max_bytes: int | None, boundary_at_or_after: Callable[[int, int], int]) -> list[tuple[int, int]]:
    """Split ``[start, end)`` into ranges of about ``max_bytes`` at message boundaries.

    ``boundary_at_or_after(known, target)`` returns the first message boundary
    ``>= target`` given a boundary ``known <= target``. Pieces are at least as large as
    ``max_bytes`` (except the last) and at most ``max_bytes`` plus one record.
    """
    if start >= end:
        return []
    if max_bytes is None or end - start <= max_bytes:
        return [(start, end)]
    points = [start]
    cur = start
    while end - cur > max_bytes:
        nxt = boundary_at_or_after(cur, cur + max_bytes)
        if nxt <= cur or nxt >= end:
            break
        points.append(nxt)
        cur = nxt
    points.append(end)
    return list(zip(points, points[1:]))


# --- discovery and planning against a live cluster ------------------------------------------------


def discover(options: SourceOptions) -> list[TopicPartition]:
    """The topic's partitions (from ``topics-sub``) with their replicas ordered per ``readFrom``."""
    return asyncio.run(_discover(options))


async def _discover(options: SourceOptions) -> list[TopicPartition]:
    config = MetaClientConfig(
        zk_connect=options.zk_connect,
        zk_root=options.zk_root,
        zk_session_timeout_ms=10_000,
        zk_connection_timeout_ms=min(options.timeout_ms, 15_000),
        zk_tls=options.login.zk_tls(),
    )
    cluster = Cluster(config)
    try:
        await cluster.start()
    except MetaqError as exc:
        raise OptionError(f"option zkConnect: {exc}") from None
    try:
        await cluster.watch_topic(options.topic, subscribe=True)
        snapshot = cluster.snapshot
    finally:
        await cluster.stop()
    result = []
    for p in snapshot.readable_partitions(options.topic):
        name = partition_name(p.broker_id, p.partition)
        rng = random.Random(f"{options.topic}/{name}")  # spread partitions over slaves, stably
        replicas = ordered_replicas(snapshot.brokers.get(p.broker_id), options.read_from, rng)
        result.append(TopicPartition(name, p.broker_id, p.partition, replicas))
    return result


def discover_replicas(options: SourceOptions, broker_id: int, partition: int) -> tuple[Replica, ...]:
    """Fresh replicas of one partition (a reader whose planned replicas all failed)."""
    for tp in discover(options):
        if tp.broker_id == broker_id and tp.partition == partition:
            return tp.replicas
    return ()


class Planner:
    """Offsets and split points, asked of each partition's first reachable replica.

    Sessions are opened lazily, one per replica, and closed by ``close()``.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._sessions: dict[Replica, ReplicaSession] = {}
        self._serving: dict[str, Replica] = {}
        self._credentials: Credentials | None = None  # read from the password file at the first connection

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()

    def __enter__(self) -> "Planner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _session(self, replica: Replica) -> ReplicaSession:
        session = self._sessions.get(replica)
        if session is None:
            if self._credentials is None:
                self._credentials = self.options.login.credentials()
            session = ReplicaSession(replica, timeout=min(self.options.timeout_ms / 1000, 10.0), credentials=self._credentials)
            self._sessions[replica] = session
        return session

    def _ask(self, tp: TopicPartition, call: Callable[[ReplicaSession], object]) -> object:
        if not tp.replicas:
            raise OptionError(self.no_replica_message(tp))
        errors = []
        preferred = self._serving.get(tp.name)
        order = ([preferred] if preferred else []) + [r for r in tp.replicas if r != preferred]
        for replica in order:
            try:
                result = call(self._session(replica))
            except ReplicaError as exc:
                errors.append(str(exc))
                session = self._sessions.pop(replica, None)
                if session is not None:
                    session.close()
                continue
            self._serving[tp.name] = replica
            return result
        # Brokers with TLS drop a plaintext connection like a dead broker would: say so.
        hint = "" if self.options.login.tls_ca else " (if its brokers use TLS, set option tlsCa)"
        raise MetaqError(f"no replica of partition {tp.name} answered{hint}: {'; '.join(errors)}")

    def no_replica_message(self, tp: TopicPartition) -> str:
        hint = {
            "slave": "no slave is registered; use readFrom=prefer-slave or readFrom=master",
            "prefer-slave": "neither a slave nor the master is registered",
            "master": "neither the master nor a slave is registered",
        }[self.options.read_from]
        return f"partition {tp.name} of topic {self.options.topic!r}: {hint}"

    def offsets(self, tp: TopicPartition) -> OffsetInfo:
        return self._ask(tp, lambda s: s.offsets(self.options.topic, tp.partition))  # type: ignore[return-value]

    def time_offset(self, tp: TopicPartition, time_ms: int, info: OffsetInfo) -> int | None:
        """The first offset below ``info.committed`` whose message time is >= ``time_ms`` (the
        replica's time index, docs/storage.md); None when no message there is that late."""
        reply = self._ask(tp, lambda s: s.offset_for_time(self.options.topic, tp.partition, time_ms))
        offset = reply.offset  # type: ignore[attr-defined]
        # Asked after ``info``: a message committed since then is not in the planned range.
        return None if reply.latest or offset >= info.committed else max(offset, info.min_offset)  # type: ignore[attr-defined]

    def serving(self, tp: TopicPartition) -> Replica | None:
        """The replica that answered for ``tp`` last (the one whose committed offset we use)."""
        return self._serving.get(tp.name)

    def split(self, tp: TopicPartition, start: int, end: int) -> list[tuple[int, int]]:
        max_bytes = self.options.max_bytes_per_partition
        topic = self.options.topic

        def boundary(known: int, target: int) -> int:
            def walk(session: ReplicaSession) -> int:
                segment = session.segment_start(topic, tp.partition, target)
                begin = segment if known <= segment <= target else known
                return first_boundary_at_or_after(session, topic, tp.partition, begin, target, end)

            return self._ask(tp, walk)  # type: ignore[return-value]

        return split_range(start, end, max_bytes, boundary)

    def boundary_after(self, tp: TopicPartition, start: int, end: int, max_bytes: int | None, max_records: int | None) -> int:
        """A message boundary in ``(start, end]``: after at least ``max_bytes`` bytes (the first
        boundary at or past ``start + max_bytes``) or after ``max_records`` records, whichever
        comes first; ``end`` when the range holds less. A rate limit's cut (``maxBytesPerTrigger``,
        ``maxMessagesPerTrigger``): never empty, so a stream always moves on."""
        target = end if max_bytes is None else min(end, start + max(1, max_bytes))
        if target >= end and max_records is None:
            return end

        def walk(session: ReplicaSession) -> int:
            return first_boundary_at_or_after(session, self.options.topic, tp.partition, start, target, end,
                                              max_records=None if max_records is None else max(1, max_records))

        return self._ask(tp, walk)  # type: ignore[return-value]

    def ordered_for_reading(self, tp: TopicPartition) -> tuple[Replica, ...]:
        """Replicas in reading order, the one planning talked to first (its committed
        offset is the planned end, so it can serve the range without waiting)."""
        first = self._serving.get(tp.name)
        if first is None:
            return tp.replicas
        return (first,) + tuple(r for r in tp.replicas if r != first)


def resolve_ranges(
    planner: Planner,
    partitions: Sequence[TopicPartition],
    starting: OffsetSpec,
    ending: OffsetSpec,
) -> dict[str, tuple[int, int]]:
    """``{name: (start, end)}`` for a batch read, validated against each replica's offsets."""
    options = planner.options
    names = [tp.name for tp in partitions]
    check_partition_names(starting, names, "startingOffsets", options.topic)
    check_partition_names(ending, names, "endingOffsets", options.topic)
    starting_times, ending_times = options.starting_times, options.ending_times
    for times in (starting_times, ending_times):
        if times is not None and times.every is None:
            check_time_partitions(times, names, options.topic)
    ranges = {}
    for tp in partitions:
        info = planner.offsets(tp)
        if starting_times is not None:
            start = _start_at_time(planner, tp, starting_times, info)
            starting_option = starting_times.option
        else:
            start = resolve_offset(starting.value_for(tp.name), info, "startingOffsets", tp.name)
            starting_option = "startingOffsets"
        if ending_times is not None:
            # Kafka's rule: no message that late ends the range at the latest offset.
            found = planner.time_offset(tp, ending_times.time_for(tp.name), info)  # type: ignore[arg-type]
            end = info.committed if found is None else found
            ending_option = ending_times.option
        else:
            end = resolve_offset(ending.value_for(tp.name), info, "endingOffsets", tp.name)
            ending_option = "endingOffsets"
        if start > end:
            raise OptionError(f"partition {tp.name}: {starting_option} {start} is after {ending_option} {end}")
        ranges[tp.name] = (start, end)
    return ranges


def check_time_partitions(times: TimeSpec, known: Sequence[str], topic: str) -> None:
    """Every partition named exists, and every partition has a time (Kafka asks for all of them)."""
    for name in times.per_partition:
        if name not in known:
            listed = ", ".join(sorted(known, key=Partition.parse)) or "none"
            raise OptionError(f"{times.option}: topic {topic!r} has no partition {name!r} (it has {listed})")
    missing = sorted((name for name in known if name not in times.per_partition), key=Partition.parse)
    if missing:
        every = times.option.replace("OffsetsByTimestamp", "Timestamp")
        raise OptionError(f"{times.option}: no time for partition(s) {', '.join(missing)} of topic {topic!r}"
                          f" (name every partition, or give {every} for all of them)")


def _start_at_time(planner: Planner, tp: TopicPartition, times: TimeSpec, info: OffsetInfo) -> int:
    time_ms = times.time_for(tp.name)
    assert time_ms is not None  # check_time_partitions
    found = planner.time_offset(tp, time_ms, info)
    if found is not None:
        return found
    if planner.options.timestamp_strategy == "latest":
        return info.committed
    raise OptionError(
        f"{times.option}: partition {tp.name} has no message at or after {time_ms} (every readable message is older);"
        " set startingOffsetsByTimestampStrategy=latest to start such partitions at their latest offset"
    )


def offsets_json_map(values: Mapping[str, int]) -> dict[str, int]:
    return {name: int(values[name]) for name in sorted(values, key=Partition.parse)}
