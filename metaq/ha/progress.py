"""The master's view of replication: where each slave is, and how far behind.

This is the one writer of a slave's position: the sync set (sync_set.py) reads
it from here. The positions and each partition's append history live in the
partition's replication record (record.py, held by the partition's owner, so a
dropped partition takes them along); what is kept here is per slave: when each
was last heard. A slave is forgotten when its replication connection closes.

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

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from .record import HISTORY_ENTRIES, AppendHistory, RecordTable, ReplicaPosition, ReplicationRecords

__all__ = ["HISTORY_ENTRIES", "AppendHistory", "ReplicaPosition", "ReplicationProgress", "ReplicaLag", "SlaveInfo"]


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
    """Writes each slave's position into its partition's record; keeps when each slave was heard."""

    def __init__(self, records: ReplicationRecords | None = None, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self._clock = clock
        #: Where each partition's record is: the broker's ``Partitions`` (``HaNode``), or a table of its own.
        self.records: ReplicationRecords = records if records is not None else RecordTable()
        self.slaves: dict[int, SlaveInfo] = {}

    @property
    def positions(self) -> Mapping[tuple[int, str, int], ReplicaPosition]:
        """Every position as ``(slave_id, topic, partition) -> ReplicaPosition`` (read-only)."""
        return _Positions(self.records)

    def appended(self, topic: str, partition: int, end_offset: int, count: int) -> None:
        record = self.records.replication(topic, partition)
        if record is None:
            return
        history = record.history
        if history is None:
            history = record.history = AppendHistory()
        history.record(end_offset, count, self._clock())

    def fetched(self, slave_id: int, topic: str, partition: int, log_end: int, epoch: int) -> None:
        now = self._clock()
        record = self.records.replication(topic, partition)
        if record is not None:
            record.positions[slave_id] = ReplicaPosition(log_end, epoch, now)
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
            record = self.records.replication(topic, partition)
            if record is None:
                continue  # not served here: nothing to remember
            current = record.positions.get(slave_id)
            # A heartbeat may be older than the last fetch: positions only move forward here.
            if current is None or end > current.log_end:
                record.positions[slave_id] = ReplicaPosition(end, epoch, now)

    def position(self, slave_id: int, topic: str, partition: int, epoch: int | None = None) -> int | None:
        """A slave's last reported log end; with ``epoch``, only one reported in that epoch."""
        record = self.records.replication(topic, partition)
        found = record.positions.get(slave_id) if record is not None else None
        if found is None or (epoch is not None and found.epoch != epoch):
            return None
        return found.log_end

    def lag(self, master_log_end: dict[tuple[str, int], int]) -> list[ReplicaLag]:
        """Lag of every known slave for every partition of ``master_log_end``."""
        now = self._clock()
        rows = []
        served = [(key, end, self.records.replication(*key)) for key, end in sorted(master_log_end.items())]
        for slave_id in sorted(self.slaves):
            for (topic, partition), end, record in served:
                position = record.positions.get(slave_id) if record is not None else None
                log_end = position.log_end if position else 0
                history = record.history if record is not None and record.history is not None else AppendHistory()
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

    def forget(self, slave_id: int) -> None:
        """A slave left (its replication connection closed): drop it, so state stays bounded
        (a walk of every record: once per slave that leaves, never per report)."""
        self.slaves.pop(slave_id, None)
        for _key, record in self.records.replications():
            record.positions.pop(slave_id, None)


class _Positions(Mapping[tuple[int, str, int], ReplicaPosition]):
    """``ReplicationProgress.positions``: the records' positions seen as one table (read-only)."""

    def __init__(self, records: ReplicationRecords) -> None:
        self._records = records

    def __getitem__(self, key: tuple[int, str, int]) -> ReplicaPosition:
        slave_id, topic, partition = key
        record = self._records.replication(topic, partition)
        if record is None:
            raise KeyError(key)
        return record.positions[slave_id]

    def __iter__(self) -> Iterator[tuple[int, str, int]]:
        for (topic, partition), record in self._records.replications():
            for slave_id in record.positions:
                yield slave_id, topic, partition

    def __len__(self) -> int:
        return sum(len(record.positions) for _key, record in self._records.replications())
