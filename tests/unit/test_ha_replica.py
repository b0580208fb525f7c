"""A slave partition appending fetch replies: whole, CRC-valid records only, and (sync
masters) its progress reported piece by piece within a large reply."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from metaq import record
from metaq.client.connection import Reply
from metaq.ha.replica import REPORT_PIECE_BYTES, PartitionReplica, ReplicaDiverged
from metaq.protocol import commands as c
from metaq.config import TopicConfig
from metaq.server.partitions import Partition, Partitions
from metaq.store.flush import LogFlusher
from metaq.store.manager import MessageStoreManager


class NoFlush:
    """A flusher of the threshold policy that never flushes (the slave only counts appends)."""

    group_commit = False

    def __init__(self) -> None:
        self.counted = 0

    def note_appended(self, count: int) -> None:
        self.counted += count


def partition_owner(tmp_path: Path) -> Partition:
    """The slave's partition: its log appended through its one owner, as the follower wires it."""
    config = TopicConfig(name="t", data_path=str(tmp_path), num_partitions=1, max_segment_size=64 << 20)
    return Partitions(MessageStoreManager({"t": config}, max_message_size=1 << 20)).get("t", 0)


def make_replica(tmp_path: Path) -> PartitionReplica:
    return PartitionReplica("t", 0, partition_owner(tmp_path), NoFlush(), lambda: {"slave_id": 1, "epoch": 0}, lambda *_: None, 100)  # type: ignore[arg-type]


def records(count: int, size: int = 100) -> bytearray:
    return bytearray(record.encode_batch([(bytes([i % 251]) * size, None) for i in range(count)]))


def append(replica: PartitionReplica, body: bytearray, reports: list[int] | None) -> bool:
    header = {"offset": replica.log.log_end, "log_end": replica.log.log_end + len(body), "committed": 0}

    async def go() -> bool:  # the flush is scheduled as a task: needs a running loop
        return await replica._append_reply(header["offset"], header, body, None if reports is None else reports.append)

    return asyncio.run(go())


def test_a_large_reply_is_reported_piece_by_piece_at_record_boundaries(tmp_path: Path) -> None:
    replica = make_replica(tmp_path)
    body = records(10_000)  # about 1.2 MB: several pieces
    reports: list[int] = []
    assert append(replica, body, reports)
    assert replica.log.log_end == len(body)
    assert replica.log.read(0, len(body)) == bytes(body), "the log is the reply, byte for byte"
    assert len(reports) >= len(body) // REPORT_PIECE_BYTES - 1
    assert reports == sorted(set(reports)) and reports[-1] < len(body), "the last position goes with the next fetch"
    boundaries = set(record.record_ends(body))
    assert set(reports) <= boundaries, "a reported position is always the end of a whole record"
    assert replica.status.appended_messages == 10_000


def test_a_large_reply_lets_the_event_loop_run_between_its_pieces(tmp_path: Path) -> None:
    # Also without reporting (a slave reporting only fsynced positions): a whole 8 MiB reply
    # followed at once held the loop, and with it the pre-login deadlines, for a good part of
    # a second (seed 6003's slaves catching up).
    replica = make_replica(tmp_path)
    body = records(10_000)  # about 1.2 MB: several pieces
    seen: list[int] = []

    async def go() -> bool:
        loop = asyncio.get_running_loop()

        def look() -> None:  # another callback of the loop: what the log end is when it gets a turn
            seen.append(replica.log.log_end)
            if not appending.done():
                loop.call_soon(look)

        appending = asyncio.ensure_future(replica._append_reply(0, {"offset": 0, "log_end": len(body)}, body, None))
        loop.call_soon(look)
        return await appending

    assert asyncio.run(go())
    assert replica.log.log_end == len(body) and replica.log.read(0, len(body)) == bytes(body)
    between = sorted({end for end in seen if 0 < end < len(body)})
    assert len(between) >= len(body) // REPORT_PIECE_BYTES - 1, f"the loop ran only at log ends {sorted(set(seen))}"


def test_a_bad_record_in_a_later_piece_keeps_what_came_before_and_stops(tmp_path: Path) -> None:
    replica = make_replica(tmp_path)
    body = records(10_000)
    ends = record.record_ends(body)
    bad = ends[5_000]  # the record after the 5,001st: far into a later piece
    body[bad + record.HEADER_SIZE + 3] ^= 0xFF  # payload byte: the CRC no longer matches
    reports: list[int] = []
    with pytest.raises(ReplicaDiverged, match="CRC"):
        append(replica, body, reports)
    assert replica.log.log_end == bad, "every whole record before the bad one, nothing after"
    assert all(r <= bad for r in reports)


def test_a_record_bigger_than_a_piece_is_appended_whole(tmp_path: Path) -> None:
    replica = make_replica(tmp_path)
    body = records(3) + records(1, size=REPORT_PIECE_BYTES * 2) + records(3)
    reports: list[int] = []
    assert append(replica, body, reports)
    assert replica.log.log_end == len(body)
    assert set(reports) <= set(record.record_ends(body))


def test_a_reply_cut_inside_a_record_keeps_the_cut_record_for_the_next_fetch(tmp_path: Path) -> None:
    replica = make_replica(tmp_path)
    full = records(5_000)
    cut = full[: len(full) - 50]
    assert append(replica, cut, [])
    assert replica.log.log_end == record.record_ends(cut)[-1]


class RecordingMaster:
    """A master connection that serves ``body`` once, then has nothing new; records what the slave tells it."""

    def __init__(self, replica: PartitionReplica, body: bytearray) -> None:
        self.replica, self.body = replica, body
        self.fetches: list[tuple[int, int, int]] = []  # (offset, reported log_end, flushed_end when sent)
        self.position_reports: list[dict] = []

    async def request(self, header: dict, timeout: float) -> Reply:
        log = self.replica.log
        self.fetches.append((header["offset"], header["replica"]["log_end"], log.flushed_end))
        end = len(self.body)
        if len(self.fetches) == 1:
            return Reply({"code": c.OK, "offset": 0, "log_end": end, "committed": 0}, self.body)
        return Reply({"code": c.NOT_FOUND, "log_end": end, "committed": end}, bytearray())

    def send(self, header: dict) -> "asyncio.Future[None]":
        self.position_reports.append(header)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


def test_a_group_commit_slave_of_a_sync_master_reports_only_fsynced_positions(tmp_path: Path) -> None:
    """durable_positions: a fetch (whose offset is the slave's reported position) waits for
    the fsync of the previous reply, and no position inside a reply is reported before its
    fsync; a sync master's ack then survives a power loss of this slave (docs/guarantees.md P3)."""
    owner = partition_owner(tmp_path)
    log = owner.log
    replica = PartitionReplica("t", 0, owner, LogFlusher(log, 0, 1000), lambda: {"slave_id": 1, "epoch": 0}, lambda *_: None, 100)
    replica.report_positions = replica.durable_positions = True
    body = records(10_000)  # several pieces: a page-cache slave would report inside it
    master = RecordingMaster(replica, body)

    async def two_fetches() -> None:
        await replica.fetch_once(master)  # type: ignore[arg-type]
        assert replica.position() <= log.flushed_end
        await replica.fetch_once(master)  # type: ignore[arg-type]

    asyncio.run(two_fetches())
    assert master.position_reports == []
    assert master.fetches[1] == (len(body), len(body), len(body)), "the position went out only once fsynced"
    assert replica.position() == log.flushed_end == len(body)
