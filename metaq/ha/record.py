"""One partition's replication record: what replication knows of one partition, in one object.

Kafka's ``Partition`` owns its followers' states, its ISR and its high watermark; here each
served partition's owner (metaq/server/partitions.py : ``Partition.replication``) holds one
``ReplicationRecord``, so a partition dropped (its topic deleted or re-created) takes its
whole record with it in the one ``Partitions.drop``, and nothing has to reach into per-slave
tables to forget it. On the master it holds:

* ``positions``: each slave's last reported log end in this partition (``ReplicaPosition``),
  written only by ``ReplicationProgress`` (progress.py: fetches, position reports, heartbeats);
* ``history``: the partition's recent appends (``AppendHistory``), for lag in messages and
  milliseconds, written only by ``ReplicationProgress.appended``;
* ``shared``: ``(epoch, highest log end a slave reported fetching in it)`` for the epoch this
  broker leads, written only by ``HaNode.replica_fetched``, read by ``HaNode._deposed_bound``;
* ``sync``: the sync set's state of this partition in its term (sync_set.py : ``PartitionSync``:
  committed offset, safe end, the log end the term started with, the offset consumers were
  last woken for, the puts waiting), written only by that term's ``SyncReplication``;
* ``streams``: the slaves streaming this partition (stream.py's subscriptions: the leader
  append entry pushes to them), written only by ``StreamHub``; None when none streams.

On a slave it holds ``following``: the ``ReplicaRun`` (follower.py) of the ``MasterFollower``
that copies this partition from the master, which alone writes it: its ``PartitionReplica``
(replica.py), its fetch task, while quiet the future that task waits on and its
registration for the next ``news``, while streamed its stream's closer. A follower of a
later master sees no run of an earlier one.

``close`` (from ``Partitions.drop``) ends the puts still waiting on a dropped partition,
closes its streams (each slave is told, and fetches) and, on a slave, cancels the
partition's fetch task: forgetting a partition's replication is this one call.

What stays broker-wide is genuinely per slave: ``ReplicationProgress.slaves`` (when each slave
was last heard), the sync set's membership (sync_set.py), the slaves' connections (node.py).

Cost at 10,000 partitions: one record each (six slots) and, on a sync master, one
``PartitionSync`` each (seven slots), on a slave one ``ReplicaRun`` each (six slots); a
position per slave that reports
the partition; the append history is made at a partition's first put and is bounded
(``HISTORY_ENTRIES``). No task and no timer per partition.

``RecordTable`` is the same records for an owner without a broker's partitions (a unit test
of progress.py alone): a dict of records, dropped by ``drop``.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

Key = tuple[str, int]

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


class ReplicationRecord:
    """Everything replication keeps about one partition (see the module docstring)."""

    __slots__ = ("positions", "history", "shared", "sync", "following", "streams")

    def __init__(self) -> None:
        self.positions: dict[int, ReplicaPosition] = {}
        self.history: AppendHistory | None = None
        self.shared: tuple[int, int] | None = None
        #: sync_set.py's ``PartitionSync`` (typed loosely: sync_set.py imports this module).
        self.sync: Any = None
        #: follower.py's ``ReplicaRun`` on a slave (loosely typed: follower.py imports this
        #: module's users).
        self.following: Any = None
        #: stream.py's subscriptions of this partition, or None (loosely typed: stream.py imports this module).
        self.streams: list[Any] | None = None

    def close(self) -> None:
        """The partition is dropped: puts waiting for its slaves end (404, outcome unknown), the
        slaves streaming it are told and fetch (finding it gone), and a slave's fetch task of
        it is cancelled."""
        if self.sync is not None:
            self.sync.dropped()
        if self.following is not None:
            self.following.dropped()
        for sub in list(self.streams or ()):
            sub.hub.end(sub, "the partition is no longer served (topic deleted or re-created)")


class ReplicationRecords(Protocol):
    """Where each served partition's record is (metaq.server.partitions.Partitions)."""

    def replication(self, topic: str, partition: int) -> ReplicationRecord | None:
        """The partition's record; None if this broker does not serve it (nothing is opened)."""

    def replications(self) -> Iterator[tuple[Key, ReplicationRecord]]:
        """Every served partition's record."""


class RecordTable:
    """Records for an owner without partitions (a unit test): made at first use, dropped by ``drop``."""

    def __init__(self) -> None:
        self._records: dict[Key, ReplicationRecord] = {}

    def replication(self, topic: str, partition: int) -> ReplicationRecord:
        record = self._records.get((topic, partition))
        if record is None:
            record = self._records[(topic, partition)] = ReplicationRecord()
        return record

    def replications(self) -> Iterator[tuple[Key, ReplicationRecord]]:
        return iter(list(self._records.items()))

    def drop(self, keys: list[Key]) -> None:
        for key in keys:
            record = self._records.pop(key, None)
            if record is not None:
                record.close()
