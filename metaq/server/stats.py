"""Broker counters, and the ``stats`` reply built as data and rendered as MetaQ's text.

The broker builds its stats once, as ``(name, value)`` pairs (StatsPairs). A value is a
scalar or a row: a dict of named fields, e.g. a slave's replication lag. Binary clients
ask for ``format: "map"`` and get the pairs as msgpack; the text form follows MetaQ:
``STATS\\r\\n`` then ``name value`` lines, then ``END\\r\\n``, so scripts written for
MetaQ's ``echo stats | nc`` keep working. A row renders as ``field=value`` words.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

import msgpack


@dataclass
class PartitionCounters:
    put_messages: int = 0
    put_bytes: int = 0
    put_failed: int = 0
    get_requests: int = 0
    get_bytes: int = 0
    get_miss: int = 0
    replica_get_requests: int = 0
    replica_get_bytes: int = 0
    replica_positions: int = 0  # position reports of sync slaves between fetches
    put_duplicates: int = 0  # idempotent retries re-acked without an append


#: What the broker refused or closed to bound its connections and memory (metaq/server/admission.py,
#: connection.py), as ``refused_{kind}`` in stats and ``metaq_refusals{reason="{kind}"}`` in metrics:
#: connections refused past maxConnections / maxConnectionsPerAddress, not-logged-in connections
#: closed to make room, or past loginTimeoutMs, or for a frame other than a small login frame
#: before login, and requests refused past maxBufferedRequestBytes.
REFUSAL_KINDS = ("max_connections", "per_address", "evicted", "login_timeout", "before_login", "request_budget")


class CountedPartitions(Protocol):
    """Where each partition's counters live: with the partition (metaq.server.partitions.Partitions)."""

    #: What partitions no longer served had counted (the broker's totals never go down).
    retired: PartitionCounters

    def counters(self, topic: str, partition: int) -> PartitionCounters:
        """The partition's counters (made at its first count)."""

    def counted(self) -> Iterator[tuple[tuple[str, int], PartitionCounters]]:
        """Every served partition that counted something, with its counters."""

    def reset_counters(self) -> None:
        """Every partition's counters and the retired ones back to zero."""


@dataclass
class BrokerStats:
    """The broker's own counters; a partition's are held by the partition (``partitions``), so
    a partition dropped takes its row along (its counts go to ``retired``, in the totals)."""

    partitions: CountedPartitions | None = None
    started_at: float = field(default_factory=time.time)
    connections: int = 0
    total_connections: int = 0
    bad_requests: int = 0
    refusals: Counter[str] = field(default_factory=Counter)

    def connection_opened(self) -> None:
        self.connections += 1
        self.total_connections += 1

    def connection_closed(self) -> None:
        self.connections -= 1

    def bad_request(self) -> None:
        self.bad_requests += 1

    def refused(self, kind: str) -> None:
        assert kind in REFUSAL_KINDS, kind
        self.refusals[kind] += 1

    def refusal_pairs(self) -> list[tuple[str, int]]:
        return [(f"refused_{kind}", self.refusals[kind]) for kind in REFUSAL_KINDS]

    def _partitions(self) -> CountedPartitions:
        assert self.partitions is not None, "these stats count no partitions"
        return self.partitions

    def __post_init__(self) -> None:
        if self.partitions is not None:
            # Asked per request: the partitions' own lookup, without a hop through this object.
            self.partition = self.partitions.counters  # type: ignore[method-assign]

    def partition(self, topic: str, partition: int) -> PartitionCounters:
        """The partition's counters (made at its first count)."""
        return self._partitions().counters(topic, partition)

    def topic_totals(self) -> dict[str, PartitionCounters]:
        totals: dict[str, PartitionCounters] = defaultdict(PartitionCounters)
        for (topic, _), counters in self._partitions().counted():
            add_counters(totals[topic], counters)
        return totals

    def totals(self) -> PartitionCounters:
        total = PartitionCounters()
        add_counters(total, self._partitions().retired)
        for counters in self.topic_totals().values():
            add_counters(total, counters)
        return total

    def reset(self) -> None:
        self._partitions().reset_counters()
        self.bad_requests = 0
        self.refusals.clear()

    def uptime(self) -> float:
        return time.time() - self.started_at


def add_counters(total: PartitionCounters, counters: PartitionCounters) -> None:
    for name in counters.__dataclass_fields__:
        setattr(total, name, getattr(total, name) + getattr(counters, name))


#: ``stats help``: each item and what it shows (docs/operations.md, "Stats", says the same).
ITEM_HELP = {
    "(empty)": "pid, broker id, role, epoch, version, uptime, connections, put/get counters, connections not logged in, buffered request bytes, refusals, HA state, replication lag",
    "realtime": "the same as (empty)",
    "topics": "per topic: put_messages put_bytes get_requests get_bytes get_miss replica_get_bytes replica_positions",
    "offsets": "per partition {topic}-{brokerId}-{n}: min_offset max_offset committed flushed [corrupt_from]",
    "<topic>": "offsets for one topic",
    "config": "the server.ini as loaded, then the topics served now (from the group's configuration in ZooKeeper)",
    "reset": "clear the counters (never data), then show the general stats",
    "help": "this list",
}

#: ``(name, value)``; a value is a scalar or a row (a dict of named fields).
StatsPairs = list[tuple[str, Any]]


def render_field(name: str, value: Any) -> str:
    """One field of a row in the text form.

    A flag (bool) is its name when set and nothing when not (``approx``); free text
    (whitespace, quotes, ``=``, or empty) is quoted, so a row stays split by spaces.
    """
    if isinstance(value, bool):
        return name if value else ""
    if isinstance(value, str) and (not value or any(ch.isspace() or ch in "'\"=" for ch in value)):
        return f"{name}={value!r}"
    return f"{name}={value}"


def render_value(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(word for name, field_value in value.items() if (word := render_field(name, field_value)))
    return str(value)


def render(pairs: StatsPairs) -> str:
    lines = ["STATS"]
    lines.extend(f"{name} {render_value(value)}" for name, value in pairs)
    lines.append("END")
    return "\r\n".join(lines) + "\r\n"


def encode_map(pairs: StatsPairs) -> bytes:
    """The body of a ``format: "map"`` stats reply: a msgpack array of ``[name, value]``."""
    return msgpack.packb([[name, value] for name, value in pairs], use_bin_type=True)


def counters_row(counters: PartitionCounters) -> dict[str, int]:
    return {
        "put_messages": counters.put_messages,
        "put_bytes": counters.put_bytes,
        "get_requests": counters.get_requests,
        "get_bytes": counters.get_bytes,
        "get_miss": counters.get_miss,
        "replica_get_bytes": counters.replica_get_bytes,
        "replica_positions": counters.replica_positions,
    }
