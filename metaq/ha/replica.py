"""One partition of a slave: fetch from the master at the local log end, append verbatim.

Invariant kept here: **the local log is a byte-identical prefix of the master's
log at the same offsets.** It holds because

* every fetch asks for the bytes at exactly the local log end, and a reply is
  used only if it says it starts there (``offset`` in the reply header);
* only whole, CRC-valid records are appended, byte for byte as received (a
  fetch may end inside a record: that tail is fetched again next time);
* appends of one partition happen in one task, one after the other.

Progress reports (``position``, sync masters only) carry an offset that is
already in the local log, always the end of a whole record: the master may ack
any put that ends at or before it, so a report must never run ahead of the log.

Anything that would break the invariant stops the partition with a clear error
and a metric instead (MetaQ's slave could silently diverge, notes §9.3):
a reply at another offset, a complete record with a bad CRC, a master log that
is shorter than ours, or a master that no longer has the bytes we need next.
A stopped partition is never appended to again until an operator (or, for a
returning old master, the epoch-based truncation) resolves it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..protocol import commands as c
from ..protocol.messages import GetRequest, PositionRequest
from ..record import HEADER, HEADER_SIZE, buffer_reader, walk_records
from ..store.flush import AppendTruncated
from .answerer import refusal_of
from .stream import ReplicaMode

if TYPE_CHECKING:
    from ..client.connection import BrokerConnection
    from ..store.flush import LogFlusher
    from .host import PartitionOwner

log = logging.getLogger(__name__)

# Bigger than a consumer's: in sync mode every ack waits for a replica fetch round
# trip, so one fetch must carry whole large batches.
DEFAULT_FETCH_SIZE = 8 * 1024 * 1024
#: A fetch reply larger than this is appended in pieces (the event loop runs between them);
#: to a sync master, each piece's end is reported as it is appended.
REPORT_PIECE_BYTES = 256 * 1024


class StaleMaster(ConnectionError):
    """The master and this slave disagree on the epoch; the coordinator must re-check ZooKeeper."""


class MasterLacksPartition(ConnectionError):
    """The master does not serve this partition (in this incarnation) right now: a topic
    deleted or re-created that one of the two has not applied yet. Retried; nothing to repair."""


class ReplicaDiverged(Exception):
    """The master's answer cannot continue this slave's log byte for byte."""


@dataclass
class ReplicaStatus:
    state: str = "starting"  # starting | following | stopped
    error: str | None = None
    fetches: int = 0
    appended_bytes: int = 0
    appended_messages: int = 0
    master_log_end: int = 0
    master_committed: int = 0
    last_fetch_at: float = 0.0
    caught_up_at: float = 0.0  # last time our log end reached the master's
    divergences: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class PartitionReplica:
    def __init__(
        self,
        topic: str,
        partition: int,
        owner: "PartitionOwner",
        flusher: "LogFlusher",
        replica_info: Callable[[], dict[str, Any]],
        on_appended: Callable[[str, int], None],
        max_delay_ms: int,
        fetch_size: int = DEFAULT_FETCH_SIZE,
        incarnation: str = "",
    ) -> None:
        self.topic = topic
        self.partition = partition
        #: The partition's one writer: every append and restart of the log goes through it, so
        #: its transaction state and epoch history follow (metaq/server/partitions.py).
        self.owner = owner
        self.log = owner.log
        #: Sent with each fetch: the master serves only the same life of the topic.
        self.incarnation = incarnation
        self.flusher = flusher
        self.replica_info = replica_info
        self.on_appended = on_appended
        self.max_delay_ms = max_delay_ms
        self.fetch_size = fetch_size
        self.status = ReplicaStatus()
        #: Report progress within large replies (the follower sets it for sync masters).
        self.report_positions = False
        #: Report only fsynced positions (the follower sets it for a sync master when this
        #: log uses group commit): a sync master acks what every sync-set slave reported,
        #: and that ack must survive a power loss of this slave, also after it is promoted.
        self.durable_positions = False
        #: Fetching or streamed (metaq/ha/stream.py); the follower moves it.
        self.mode = ReplicaMode()

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def stopped(self) -> bool:
        return self.status.state == "stopped"

    def committed(self) -> int:
        """What this slave may show consumers: what it has and the master has committed."""
        return min(self.log.log_end, self.status.master_committed)

    def position(self) -> int:
        """The log end this slave reports to the master (fetches, heartbeats)."""
        return self.log.flushed_end if self.durable_positions else self.log.log_end

    async def fetch_once(self, conn: "BrokerConnection", wait: bool = True) -> bool:
        """One fetch round; returns True if it appended anything. Raises ReplicaDiverged.
        ``wait``: park on the master until it has data (up to slaveMaxDelayInMills)."""
        self._repair_corruption()
        if self.durable_positions:
            # A fetch reports its offset as our position: only once it is fsynced.
            await self.flusher.flush_now()
        offset = self.log.log_end
        header = GetRequest(
            topic=self.topic,
            partition=self.partition,
            offset=offset,
            max_size=self.fetch_size,
            max_wait_ms=max(self.max_delay_ms, 1) if wait else 0,
            replica={**self.replica_info(), "log_end": offset, **self._incarnation_field()},
        ).to_header()
        reply = await conn.request(header, timeout=self.max_delay_ms / 1000 + 30)
        self.status.fetches += 1
        self.status.last_fetch_at = time.time()
        master_epoch = reply.get("epoch")
        if isinstance(master_epoch, int) and master_epoch < header["replica"]["epoch"]:
            raise StaleMaster(f"{self.name}: the master answers in epoch {master_epoch}, older than ours")
        if reply.code == c.FORBIDDEN:
            refused = refusal_of(reply, conn.address, self.name)
            if refused is not None:
                raise refused  # the broker we fetch from is not the master: ZooKeeper is asked who is
            if "epoch" in reply.message:
                raise StaleMaster(f"{self.name}: {reply.message}")
        if reply.code == c.OK:
            # Pieces of a reply are reported before any fsync: never as durable positions.
            report = self._reporter(conn) if self.report_positions and not self.durable_positions else None
            return await self._append_reply(offset, reply.header, reply.body, report)
        if reply.code == c.NOT_FOUND:
            master_end = reply.get("log_end")
            if master_end is None:
                # Not a log that disagrees with ours: the master does not serve the partition
                # (yet, or any more). Whichever of us is behind applies the group's topic
                # configuration shortly; a deleted topic's replica is then forgotten.
                raise MasterLacksPartition(f"{self.name}: master answered 404: {reply.message}")
            self._note_master(reply.header)
            if master_end < offset:
                raise ReplicaDiverged(
                    f"{self.name}: master log ends at {master_end}, before this slave's log end {offset}"
                )
            if master_end == offset:
                self.status.caught_up_at = time.time()
            return False
        if reply.code == c.MOVED:
            return self._moved(offset, int(reply.get("offset", -1)))
        raise ConnectionError(f"{self.name}: master answered {reply.code}: {reply.message}")

    def _repair_corruption(self) -> None:
        """Bytes of ours found corrupt (metaq/store/scrub.py, recovery) are cut and fetched again.

        Between fetches, in this partition's one task, so no reply is appended across the
        cut. Our log up to the cut was verified (the range starts where valid records end),
        and what is fetched next is the master's bytes: the prefix invariant holds.
        """
        cut = self.owner.truncate_corrupt()
        if cut is not None:
            self.status.extra["repairs"] = int(self.status.extra.get("repairs", 0)) + 1
            log.warning("%s: corrupt bytes at %d: cut %d bytes (kept in %s), fetching them again from the master",
                        self.name, *cut)

    def _incarnation_field(self) -> dict[str, str]:
        return {"incarnation": self.incarnation} if self.incarnation else {}

    def _reporter(self, conn: "BrokerConnection") -> Callable[[int], None]:
        def report(log_end: int) -> None:
            header = PositionRequest(
                topic=self.topic, partition=self.partition,
                replica={**self.replica_info(), "log_end": log_end, **self._incarnation_field()},
            ).to_header()
            try:
                conn.send(header).add_done_callback(_ignore_reply)
            except ConnectionError:
                pass  # the next fetch finds the connection closed and reconnects

        return report

    def _note_master(self, header: dict[str, Any]) -> None:
        self.status.master_log_end = int(header.get("log_end", self.status.master_log_end))
        committed = int(header.get("committed", self.status.master_committed))
        if committed != self.status.master_committed:
            self.status.master_committed = committed
            self.on_appended(self.topic, self.partition)

    async def _append_reply(
        self, offset: int, header: dict[str, Any], body: bytearray, report: Callable[[int], None] | None = None
    ) -> bool:
        if header.get("offset") != offset:
            raise ReplicaDiverged(f"{self.name}: asked for offset {offset}, master answered from {header.get('offset')}")
        whole, count = 0, 0
        # A large reply is checked and appended a piece at a time, each piece's end
        # reported at once (``report``), so that a sync master can ack the first puts
        # of the reply without waiting for the slave's CRC check of all of it. Between
        # pieces the event loop runs the rest of the broker: following a piece (its CRCs,
        # its transaction state) takes milliseconds, a whole 8 MiB reply of small batches
        # a good part of a second, long enough to hold up the pre-login deadlines
        # (docs/security.md, "Limits") of a slave catching up.
        runs = walk_records(
            buffer_reader(body, offset), offset, offset + len(body),
            chunk_size=REPORT_PIECE_BYTES, max_message_size=self.log.max_message_size,
        )
        for run in runs:
            if whole:
                await asyncio.sleep(0)  # appends of this partition stay in this task, one after the other
            start = self.owner.append_as_follower(run.data)
            assert start == run.offset, "append must continue the log exactly where the fetch started"
            whole += len(run.data)
            count += run.count
            if report is not None and whole < len(body):
                report(offset + whole)
        if whole < len(body):
            self._check_tail(offset, body, whole)
        if whole:
            self.status.appended_bytes += whole
            self.status.appended_messages += count
            self._schedule_flush(offset + whole, count)
        self._note_master(header)
        if self.log.log_end >= self.status.master_log_end:
            self.status.caught_up_at = time.time()
        self.on_appended(self.topic, self.partition)
        return whole > 0

    def append_streamed(self, offset: int, data: memoryview) -> int | None:
        """Append a chunk of the replication stream (metaq/ha/stream.py), already checked to
        start at our log end, in our epoch, with its CRC. Every record in it must be whole and
        valid, or nothing is appended and None says so (the stream closes; we fetch). Returns
        the record count; the caller reports, then calls ``streamed`` (critical path first)."""
        runs = list(walk_records(buffer_reader(data, offset), offset, offset + len(data),
                                 chunk_size=len(data), max_message_size=self.log.max_message_size))
        if sum(len(run.data) for run in runs) != len(data):
            return None
        count = 0
        for run in runs:
            start = self.owner.append_as_follower(run.data)
            assert start == run.offset, "a streamed chunk must continue the log exactly at its offset"
            count += run.count
        return count

    def streamed(self, end: int, size: int, count: int) -> None:
        """The bookkeeping of an appended chunk ending at ``end``: stats, flush, wake-ups."""
        self.status.appended_bytes += size
        self.status.appended_messages += count
        self._schedule_flush(end, count)
        if end >= self.status.master_log_end:
            self.status.master_log_end = end  # what the master sent is its log end
            self.status.caught_up_at = time.time()
        self.on_appended(self.topic, self.partition)

    def note_committed(self, committed: int) -> None:
        """The master's committed offset, as its stream told it."""
        self._note_master({"committed": committed})

    def _check_tail(self, offset: int, body: bytearray, whole: int) -> None:
        """Bytes after the last whole record: fine if they are a cut record, not if corrupt."""
        rest = len(body) - whole
        if rest < HEADER_SIZE:
            return
        length, _crc, _id, _flag = HEADER.unpack_from(body, whole)
        if length < 0 or length > self.log.max_message_size:
            raise ReplicaDiverged(f"{self.name}: record at offset {offset + whole} has an impossible length {length}")
        if HEADER_SIZE + length <= rest:
            raise ReplicaDiverged(f"{self.name}: record at offset {offset + whole} fails its CRC check")
        if whole == 0:
            # One record bigger than our fetch size: ask for more next time.
            self.fetch_size = max(self.fetch_size, HEADER_SIZE + length)

    def _moved(self, offset: int, new_offset: int) -> bool:
        if offset == self.log.min_offset and offset == self.log.log_end and new_offset > offset:
            # Empty local log: start it where the master's retained log starts.
            log.info("%s: empty log restarted at the master's log start %d", self.name, new_offset)
            self.owner.restart_at(new_offset)
            return False
        raise ReplicaDiverged(
            f"{self.name}: master no longer has offset {offset} (its log starts at {new_offset});"
            " this slave cannot continue without a gap"
        )

    def _schedule_flush(self, end: int, count: int) -> None:
        if not self.flusher.group_commit:
            # The threshold policy's bookkeeping needs no task (one per reply otherwise).
            self.flusher.note_appended(count)
            return
        task = asyncio.ensure_future(self.flusher.appended(end, count))
        task.add_done_callback(_log_flush_error)

    def stop(self, error: str) -> None:
        self.status.state = "stopped"
        self.status.error = error
        self.status.divergences += 1
        log.error("replication of %s stopped: %s", self.name, error)


def _ignore_reply(future: "asyncio.Future[Any]") -> None:
    """A position report needs no answer: a refusal (new epoch) shows in the next fetch."""
    if not future.cancelled():
        future.exception()


def _log_flush_error(task: "asyncio.Future[None]") -> None:
    if not task.cancelled() and task.exception() is not None:
        if isinstance(task.exception(), AppendTruncated):  # a repair or a truncation cut the log: expected
            log.info("slave flush not needed: %s", task.exception())
            return
        log.error("slave flush failed: %s", task.exception())
