"""The master's view of replication: where each slave is, and how far behind.

This is the one record of a slave's position: the sync set (sync_set.py) reads
it from here. A slave is forgotten when its replication connection closes.

A slave's position in a partition is the ``log_end`` it reports with every
fetch (and in its heartbeats). Because a slave's log is a byte-identical prefix
of the master's, that one number says exactly which messages it has.

Lag is measured three ways per slave and partition:

* bytes: master log end minus slave log end;
* messages: from the partition's append history, the number of messages
  appended after the slave's position;
* milliseconds: how long ago the oldest message the slave does not have was
  appended (0 when it has everything).

The append history is a bounded ring of ``(end_offset, total_messages, time)``
per partition, one entry per put; a slave further behind than the ring reaches
gets lower bounds (marked ``approx``).
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field

HISTORY_ENTRIES = 20_000


@dataclass
class AppendHistory:
    """Recent appends of one partition, oldest first."""

    ends: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY_ENTRIES))
    totals: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY_ENTRIES))
    times: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_ENTRIES))
    total_messages: int = 0

    def record(self, end_offset: int, count: int, now: float) -> None:
        self.total_messages += count
        self.ends.append(end_offset)
        self.totals.append(self.total_messages)
        self.times.append(now)

    def behind(self, position: int, now: float) -> tuple[int, float, bool]:
        """``(messages, seconds, exact)`` a replica at ``position`` is behind."""
        if not self.ends or position >= self.ends[-1]:
            return 0, 0.0, True
        # First append whose end is past the replica's position: it and all later
        # appends are missing on the replica.
        index = bisect.bisect_right(self.ends, position)  # deque supports bisect via __getitem__
        if index == 0:
            # Behind everything the ring remembers: lower bounds.
            return self.total_messages - self.totals[0] + 1, now - self.times[0], False
        missing = self.total_messages - self.totals[index - 1]
        return missing, now - self.times[index], True


@dataclass
class ReplicaPosition:
    log_end: int
    epoch: int
    updated_at: float


@dataclass
class SlaveInfo:
    slave_id: int
    last_seen: float
    address: str | None = None
    heartbeat_at: float | None = None


@dataclass
class ReplicaLag:
    slave_id: int
    topic: str
    partition: int
    log_end: int
    master_log_end: int
    bytes: int
    messages: int
    millis: float
    exact: bool
    last_fetch_ms_ago: float


class ReplicationProgress:
    """Per slave and partition positions, plus each partition's append history."""

    def __init__(self, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self._clock = clock
        self.positions: dict[tuple[int, str, int], ReplicaPosition] = {}
        self.slaves: dict[int, SlaveInfo] = {}
        self.history: dict[tuple[str, int], AppendHistory] = {}

    def appended(self, topic: str, partition: int, end_offset: int, count: int) -> None:
        history = self.history.get((topic, partition))
        if history is None:
            history = self.history[(topic, partition)] = AppendHistory()
        history.record(end_offset, count, self._clock())

    def fetched(self, slave_id: int, topic: str, partition: int, log_end: int, epoch: int) -> None:
        now = self._clock()
        self.positions[(slave_id, topic, partition)] = ReplicaPosition(log_end, epoch, now)
        info = self.slaves.get(slave_id)
        if info is None:
            self.slaves[slave_id] = SlaveInfo(slave_id, now)
        else:
            info.last_seen = now

    def heartbeat(self, slave_id: int, address: str | None, log_ends: dict[tuple[str, int], int], epoch: int) -> None:
        now = self._clock()
        info = self.slaves.setdefault(slave_id, SlaveInfo(slave_id, now))
        info.last_seen = info.heartbeat_at = now
        info.address = address
        for (topic, partition), end in log_ends.items():
            current = self.positions.get((slave_id, topic, partition))
            # A heartbeat may be older than the last fetch: positions only move forward here.
            if current is None or end > current.log_end:
                self.positions[(slave_id, topic, partition)] = ReplicaPosition(end, epoch, now)

    def position(self, slave_id: int, topic: str, partition: int, epoch: int | None = None) -> int | None:
        """A slave's last reported log end; with ``epoch``, only one reported in that epoch."""
        found = self.positions.get((slave_id, topic, partition))
        if found is None or (epoch is not None and found.epoch != epoch):
            return None
        return found.log_end

    def lag(self, master_log_end: dict[tuple[str, int], int]) -> list[ReplicaLag]:
        """Lag of every known slave for every partition of ``master_log_end``."""
        now = self._clock()
        rows = []
        for slave_id in sorted(self.slaves):
            for (topic, partition), end in sorted(master_log_end.items()):
                position = self.positions.get((slave_id, topic, partition))
                log_end = position.log_end if position else 0
                history = self.history.get((topic, partition), AppendHistory())
                messages, seconds, exact = history.behind(log_end, now)
                rows.append(
                    ReplicaLag(
                        slave_id,
                        topic,
                        partition,
                        log_end,
                        end,
                        max(0, end - log_end),
                        messages if log_end < end else 0,
                        seconds * 1000 if log_end < end else 0.0,
                        exact or log_end >= end,
                        (now - position.updated_at) * 1000 if position else -1.0,
                    )
                )
        return rows

    def heartbeat_ages_ms(self) -> dict[int, float]:
        """Milliseconds since each slave's last UDP heartbeat (-1: none yet)."""
        now = self._clock()
        return {
            slave_id: -1.0 if info.heartbeat_at is None else (now - info.heartbeat_at) * 1000
            for slave_id, info in self.slaves.items()
        }

    def forget_partitions(self, keys: list[tuple[str, int]]) -> None:
        """Partitions no longer served (topic deleted or re-created): positions in them and
        their append history describe another log."""
        gone = set(keys)
        for key in [k for k in self.positions if (k[1], k[2]) in gone]:
            del self.positions[key]
        for key in gone:
            self.history.pop(key, None)

    def forget(self, slave_id: int) -> None:
        """A slave left (its replication connection closed): drop it, so state stays bounded."""
        self.slaves.pop(slave_id, None)
        for key in [k for k in self.positions if k[0] == slave_id]:
            del self.positions[key]
