"""Streamed replication: how a partition switches between fetching and the stream.

Theory of operation
-------------------
The wire format and the checks of one subscription are metaq/protocol/replication_stream.py.
This module owns the two kinds of state around it:

* ``ReplicaMode`` (slave, one per replicated partition): how the partition gets its bytes.
  Every partition starts FETCHING (replica.py; catch-up, large backlogs, masters without
  the stream). Once a fetch finds it caught up with a sync master that offers the stream
  (``replicationStream=true``, told in its ``topics`` reply), it SUBSCRIBES; the master's
  acceptance makes it STREAMING; any doubt on either side, a refusal, or the connection's
  end brings it back to FETCHING, from its log end. The table below is every move.

      state        event       next
      -----------  ----------  -----------
      FETCHING     CAUGHT_UP   SUBSCRIBING
      SUBSCRIBING  ACCEPTED    STREAMING
      SUBSCRIBING  REFUSED     FETCHING
      SUBSCRIBING  DOUBT       FETCHING
      STREAMING    DOUBT       FETCHING

* ``StreamHub`` (master, one per broker): the open subscriptions, by connection (for reports
  and the connection's end); each partition's are kept in its replication record
  (metaq/ha/record.py ``ReplicationRecord.streams``, held by the partition's owner), so the put
  path finds them without a lookup and a partition dropped closes its own (``close_streams``). Every append of a
  master, a put or a transaction marker alike, calls ``push`` right after it (the
  partition's one leader append entry, metaq/server/partitions.py
  ``Partition.append_as_leader``); when no slave streams it costs one dict lookup. A change
  of the log that did not go through ``push`` (a truncation, a restart) shows as an offset
  gap at ``appended`` and closes the partition's streams.

Safety: the master records a streamed position only after ``StreamSender.report`` proved it
(in the stream's epoch, not past what was sent, from the connection that subscribed, whose
slave id was checked against its login at subscribe time). The slave appends only a chunk
that continues its log byte for byte (``StreamReceiver.chunk``, then the records' own CRCs
in ``PartitionReplica.append_streamed``). Either side drops a stream at the first doubt.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
from typing import Any, Callable

from ..protocol import codes
from ..protocol.replication_stream import DEFAULT_MAX_UNACKED, Doubt, Refused, StreamSender
from .record import RecordTable, ReplicationRecord, ReplicationRecords

log = logging.getLogger(__name__)

Key = tuple[str, int]
#: A committed offset that moved is told with the partition's next chunk, or after this
#: long without one (its slave's consumers then see an idle partition's last put).
COMMITTED_NOTICE_S = 0.005
#: Stream ids remembered per connection after their close (reports crossing the close).
RECENTLY_CLOSED = 64

class Mode(enum.Enum):
    FETCHING = "fetching"
    SUBSCRIBING = "subscribing"
    STREAMING = "streaming"

class ModeEvent(enum.Enum):
    CAUGHT_UP = "caught_up"
    ACCEPTED = "accepted"
    REFUSED = "refused"
    DOUBT = "doubt"

TRANSITIONS: dict[tuple[Mode, ModeEvent], Mode] = {
    (Mode.FETCHING, ModeEvent.CAUGHT_UP): Mode.SUBSCRIBING,
    (Mode.SUBSCRIBING, ModeEvent.ACCEPTED): Mode.STREAMING,
    (Mode.SUBSCRIBING, ModeEvent.REFUSED): Mode.FETCHING,
    (Mode.SUBSCRIBING, ModeEvent.DOUBT): Mode.FETCHING,
    (Mode.STREAMING, ModeEvent.DOUBT): Mode.FETCHING,
}

class ReplicaMode:
    """One partition's mode on a slave; every change is a row of ``TRANSITIONS``."""

    __slots__ = ("mode",)

    def __init__(self) -> None:
        self.mode = Mode.FETCHING

    def apply(self, event: ModeEvent) -> bool:
        """Move by ``event``; False (nothing changes) if the table has no such row."""
        after = TRANSITIONS.get((self.mode, event))
        if after is None:
            return False
        self.mode = after
        return True

class _Subscription:
    __slots__ = ("hub", "record", "key", "origin", "slave_id", "sender", "told_committed")

    def __init__(self, hub: "StreamHub", record: ReplicationRecord, key: Key, origin: Any, slave_id: int,
                 sender: StreamSender) -> None:
        self.hub = hub
        self.record = record  # the partition's: its ``streams`` list holds this subscription
        self.key = key
        self.origin = origin
        self.slave_id = slave_id
        self.sender = sender
        #: The committed offset this slave was last told (with a chunk or a notice).
        self.told_committed = -1

class StreamHub:
    """The master's open subscriptions. Costs: a push is O(subscribers of its partition)."""

    def __init__(self, records: ReplicationRecords | None = None, max_unacked: int = DEFAULT_MAX_UNACKED) -> None:
        self.max_unacked = max_unacked
        #: Each partition's record (the broker's ``Partitions``; a table of its own without one).
        self.records: ReplicationRecords = records if records is not None else RecordTable()
        self._by_origin: dict[Any, dict[int, _Subscription]] = {}
        #: Per connection, the ids of the last streams we closed (reports for them may still
        #: be on their way); bounded, gone with the connection.
        self._recently_closed: dict[Any, collections.deque[int]] = {}
        #: The committed offset of a partition (set by the broker); told to streaming slaves
        #: once per event-loop turn in which it moved (their consumers read up to it).
        self.committed_of: Callable[[Key], int | None] | None = None
        self._committed_moved: set[Key] = set()
        #: Chunks sent, streams closed by doubt, reports refused (stats).
        self.frames_sent = 0
        self.closed_by_doubt = 0
        self.reports_refused = 0

    def __bool__(self) -> bool:
        return bool(self._by_origin)

    def streams(self) -> int:
        return sum(len(subs) for subs in self._by_origin.values())

    def _subscriptions(self, key: Key) -> list[_Subscription] | None:
        """The partition's open streams (in its record), or None."""
        record = self.records.replication(*key) if self._by_origin else None
        return record.streams if record is not None else None

    def status_pairs(self) -> list[tuple[str, object]]:
        return [
            ("replication_streams", self.streams()),
            ("replication_stream_frames_sent", self.frames_sent),
            ("replication_streams_closed", self.closed_by_doubt),
            ("replication_stream_reports_refused", self.reports_refused),
        ]

    def subscribe(self, origin: Any, slave_id: int, key: Key, stream_id: int, epoch: int, start: int) -> bool:
        """A checked ``stream`` request (caught up at ``start``): push from now on. False if the
        partition is not served (no record: nothing is opened for it)."""
        record = self.records.replication(*key)
        if record is None:
            return False
        for old in list(self._by_origin.get(origin, {}).values()):
            if old.key == key or old.sender.stream_id == stream_id:
                self._close(old, "subscribed again")  # one stream per partition and connection
        sub = _Subscription(self, record, key, origin, slave_id, StreamSender(stream_id, epoch, start, self.max_unacked))
        self._by_origin.setdefault(origin, {})[stream_id] = sub
        if record.streams is None:
            record.streams = []
        record.streams.append(sub)
        return True

    def push(self, subs: list[_Subscription], offset: int, epoch: int, data: bytes | bytearray | memoryview) -> None:
        """Bytes were appended at ``offset``: send them to every slave streaming the partition
        (``subs``: its record's ``streams``, which the leader append entry reads, non-empty)."""
        key = subs[0].key
        committed = self.committed_of(key) if self.committed_of is not None else None
        for sub in list(subs):
            chunk = sub.sender.push(offset, epoch, data)
            if isinstance(chunk, Doubt):
                self._close(sub, chunk.reason)
                continue
            header: dict[str, Any] = {"opaque": sub.sender.stream_id, "code": codes.OK}
            if committed is not None:
                header["committed"] = sub.told_committed = committed
            sub.origin.send_reply(header, chunk)
            self.frames_sent += 1

    def committed_moved(self, key: Key) -> None:
        """``key``'s committed offset moved. Its next chunk carries it; a partition that gets
        no chunk for COMMITTED_NOTICE_S is told by a notice (no extra frame per put)."""
        if self.committed_of is not None and self._subscriptions(key):
            if not self._committed_moved:
                asyncio.get_running_loop().call_later(COMMITTED_NOTICE_S, self._tell_committed)
            self._committed_moved.add(key)

    def _tell_committed(self) -> None:
        moved, self._committed_moved = self._committed_moved, set()
        assert self.committed_of is not None
        for key in moved:
            subs = self._subscriptions(key)
            committed = self.committed_of(key) if subs else None
            if subs and committed is not None:
                for sub in subs:
                    if sub.told_committed != committed:
                        sub.told_committed = committed
                        sub.origin.send_reply({"opaque": sub.sender.stream_id, "code": codes.OK, "committed": committed})

    def appended(self, key: Key, end: int) -> None:
        """Every append of ``key`` ends here: one the streams did not carry closes them."""
        subs = self._subscriptions(key)
        if subs:
            for sub in list(subs):
                if sub.sender.sent_end != end:
                    self._close(sub, f"an append ending at {end} was not streamed (sent up to {sub.sender.sent_end})")

    def report(self, origin: Any, stream_id: int, epoch: int, end: int) -> tuple[int, Key, int] | None:
        """A report on ``origin``: (slave id, partition, position) to record, or None (refused, logged)."""
        sub = self._by_origin.get(origin, {}).get(stream_id)
        if sub is None:
            if stream_id not in self._recently_closed.get(origin, ()):
                self._refuse(origin, f"stream {stream_id} is not subscribed on this connection")
            # else: a report that crossed our close on the wire, not a forgery: dropped quietly
            return None
        proved = sub.sender.report(epoch, end)
        if isinstance(proved, Refused):
            self._refuse(origin, f"slave{sub.slave_id} {sub.key[0]}-{sub.key[1]}: {proved.reason}")
            self._close(sub, proved.reason)
            return None
        return sub.slave_id, sub.key, proved

    def _refuse(self, origin: Any, reason: str) -> None:
        self.reports_refused += 1
        log.warning("refused a stream report from %s: %s", getattr(origin, "peer", "?"), reason)

    def end(self, sub: _Subscription, reason: str) -> None:
        """One stream ends (its partition's record closes it: the partition was dropped)."""
        self._close(sub, reason)

    def close_partition(self, key: Key, reason: str) -> None:
        """Every stream of one partition ends (our log changed under them)."""
        for sub in list(self._subscriptions(key) or ()):
            self._close(sub, reason)

    def close_all(self, reason: str) -> None:
        """Role or epoch change: every stream ends (the slaves fetch, and hear why)."""
        for subs in list(self._by_origin.values()):
            for sub in list(subs.values()):
                self._close(sub, reason)

    def connection_closed(self, origin: Any) -> None:
        self._recently_closed.pop(origin, None)
        for sub in list(self._by_origin.pop(origin, {}).values()):
            self._drop(sub)

    def _close(self, sub: _Subscription, reason: str) -> None:
        """Close one stream and tell the slave (it fetches from its log end)."""
        self.closed_by_doubt += 1
        log.info("closed the replication stream of slave%d for %s-%d: %s", sub.slave_id, *sub.key, reason)
        sub.sender.close(reason)
        self._drop(sub)
        self._recently_closed.setdefault(sub.origin, collections.deque(maxlen=RECENTLY_CLOSED)).append(sub.sender.stream_id)
        sub.origin.send_reply(codes.reply_header(sub.sender.stream_id, codes.SERVICE_UNAVAILABLE, reason))

    def _drop(self, sub: _Subscription) -> None:
        subs = sub.record.streams
        if subs is not None and sub in subs:
            subs.remove(sub)
            if not subs:
                sub.record.streams = None
        on_conn = self._by_origin.get(sub.origin)
        if on_conn is not None and on_conn.get(sub.sender.stream_id) is sub:
            del on_conn[sub.sender.stream_id]
            if not on_conn:
                del self._by_origin[sub.origin]
