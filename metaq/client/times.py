"""Offsets for points in time: the ``offset_for_time`` request from the client's side.

Every record's time is its msg id's timestamp part (docs/storage.md, "Time index"); a
broker answers, per partition, the first offset whose record time is >= T, or that no
readable record is that late (``latest``). A master and its slaves answer alike (the same
bytes at the same offsets), so the question goes to the replica a reader with
``read_from='master'`` would use: the master, else a slave.

Used by producers' and consumers' ``offsets_for_times`` and a consumer's ``seek_to_time``,
the CLI (``metaq groups reset-offsets --to-datetime``, ``metaq topics get --at``), the HTTP
gateway and the Spark source.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Mapping

from ..errors import MetaqError
from ..protocol.messages import OffsetForTimeRequest
from ..protocol.replies import OffsetForTimeReply, ReplyError
from .cluster import Cluster
from .connection import BrokerConnection, ConnectionClosed
from .message import Partition
from .pool import ConnectionPool
from .routing import choose_replica


class OffsetForTimeError(MetaqError):
    """A partition's offset for a time could not be had (no replica, refused, unreachable)."""


@dataclass(frozen=True)
class TimeOffset:
    """One partition's answer: ``offset`` is the first readable record at or after the time, or
    the end (``max_offset``) when ``latest`` (no readable record is that late)."""

    offset: int
    latest: bool
    min_offset: int
    max_offset: int


async def ask_offset_for_time(
    conn: BrokerConnection, topic: str, partition: int, time_ms: int, timeout_s: float
) -> TimeOffset:
    """One ``offset_for_time`` request on an open connection (raises ReplyError on a refusal)."""
    header = OffsetForTimeRequest(topic=topic, partition=partition, time_ms=int(time_ms)).to_header()
    reply = OffsetForTimeReply.of(await conn.request(header, timeout=timeout_s))
    return TimeOffset(reply.offset, reply.latest, reply.min_offset, reply.max_offset)


async def time_offsets(
    cluster: Cluster, pool: ConnectionPool, topic: str, times: Mapping[Partition | str, int], timeout_s: float
) -> dict[Partition, TimeOffset]:
    """Each partition's ``TimeOffset`` (partitions as ``Partition`` or ``"{broker}-{n}"``), asked in parallel."""
    await cluster.watch_topic(topic, subscribe=True)
    wanted = {_partition(p): int(ms) for p, ms in times.items()}

    async def one(partition: Partition, time_ms: int) -> TimeOffset:
        broker = cluster.snapshot.brokers.get(partition.broker_id)
        replica = choose_replica(broker, "master")
        if replica is None:
            raise OffsetForTimeError(f"{topic}-{partition}: no broker {partition.broker_id} is registered")
        try:
            conn = await pool.get(replica.host, replica.port)
            return await ask_offset_for_time(conn, topic, partition.partition, time_ms, timeout_s)
        except ReplyError as exc:
            raise OffsetForTimeError(f"{topic}-{partition}: {exc}") from None
        except (ConnectionClosed, OSError, asyncio.TimeoutError) as exc:
            raise OffsetForTimeError(f"{topic}-{partition}: {replica.address}: {exc or type(exc).__name__}") from None

    answers = await asyncio.gather(*(one(p, ms) for p, ms in wanted.items()))
    return dict(zip(wanted, answers))


async def offsets_for_times(
    cluster: Cluster, pool: ConnectionPool, topic: str, times: Mapping[Partition | str, int], timeout_s: float
) -> dict[Partition, int | None]:
    """Kafka's ``offsets_for_times``: per partition the first offset whose record time is >= the
    given ms, or None when no readable record is that late."""
    found = await time_offsets(cluster, pool, topic, times, timeout_s)
    return {p: None if answer.latest else answer.offset for p, answer in found.items()}


def _partition(value: Partition | str) -> Partition:
    if isinstance(value, Partition):
        return value
    try:
        broker_id, number = str(value).split("-")
        return Partition(int(broker_id), int(number))
    except ValueError:
        raise OffsetForTimeError(f"not a partition: {value!r} (expected Partition or 'brokerId-n')") from None
