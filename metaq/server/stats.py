"""Broker counters and MetaQ's ``stats`` text output.

The text form follows MetaQ: ``STATS\\r\\n`` then ``name value`` lines, then
``END\\r\\n``, so scripts written for MetaQ's ``echo stats | nc`` keep working.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass, field


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


@dataclass
class BrokerStats:
    started_at: float = field(default_factory=time.time)
    connections: int = 0
    total_connections: int = 0
    bad_requests: int = 0
    by_partition: dict[tuple[str, int], PartitionCounters] = field(
        default_factory=lambda: defaultdict(PartitionCounters)
    )

    def connection_opened(self) -> None:
        self.connections += 1
        self.total_connections += 1

    def connection_closed(self) -> None:
        self.connections -= 1

    def bad_request(self) -> None:
        self.bad_requests += 1

    def partition(self, topic: str, partition: int) -> PartitionCounters:
        return self.by_partition[(topic, partition)]

    def topic_totals(self) -> dict[str, PartitionCounters]:
        totals: dict[str, PartitionCounters] = defaultdict(PartitionCounters)
        for (topic, _), counters in self.by_partition.items():
            total = totals[topic]
            for name in counters.__dataclass_fields__:
                setattr(total, name, getattr(total, name) + getattr(counters, name))
        return totals

    def totals(self) -> PartitionCounters:
        total = PartitionCounters()
        for counters in self.topic_totals().values():
            for name in counters.__dataclass_fields__:
                setattr(total, name, getattr(total, name) + getattr(counters, name))
        return total

    def reset(self) -> None:
        self.by_partition.clear()
        self.bad_requests = 0

    def uptime(self) -> float:
        return time.time() - self.started_at


def render(pairs: list[tuple[str, object]]) -> str:
    lines = ["STATS"]
    lines.extend(f"{name} {value}" for name, value in pairs)
    lines.append("END")
    return "\r\n".join(lines) + "\r\n"


def process_pairs() -> list[tuple[str, object]]:
    return [("pid", os.getpid())]
