"""A consumer position that no longer starts a record (docs/client.md "Realigning a position"):
the broker's answer (``offset`` with ``realign``), the log's record-start walk, and the fetcher's
detection, warning and bound."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from metaq import record
from metaq.client import consumer as consumer_module
from metaq.client.consumer import PartitionFetcher, Subscription, _FetchError, _Misaligned
from metaq.record import damaged_first_record
from metaq.client.message import Partition
from metaq.client.offsets import Position
from metaq.protocol import commands as c
from metaq.server.handlers import realign_position
from metaq.store.log import PartitionLog
from tests.unit.test_server_handlers import put_header, run, running


def records_log(tmp_path: Path, sizes: list[int], max_segment_size: int = 1 << 30) -> tuple[PartitionLog, list[int]]:
    """A log of records with payloads of ``sizes`` bytes, and each record's start."""
    log = PartitionLog(tmp_path / "t-0", max_segment_size=max_segment_size)
    starts = []
    for i, size in enumerate(sizes):
        starts.append(log.append(record.encode_record(bytes([i % 251]) * size)))
    return log, starts


# --- the broker's rule ------------------------------------------------------------------------


def test_inside_a_record_of_a_partition_with_epochs_resumes_at_the_epoch_that_holds_it(tmp_path: Path) -> None:
    log, starts = records_log(tmp_path, [27] * 40)
    epochs = [(1, 0), (4, starts[10]), (5, starts[30])]
    assert realign_position(log, starts[20] + 3, epochs) == (starts[10], "epoch_start", 4)
    assert realign_position(log, starts[35] + 1, epochs) == (starts[30], "epoch_start", 5)
    assert realign_position(log, starts[5] + 12, epochs) == (0, "epoch_start", 1)


def test_past_the_end_with_epochs_resumes_at_the_epoch_holding_the_log_end(tmp_path: Path) -> None:
    log, starts = records_log(tmp_path, [27] * 40)
    epochs = [(1, 0), (4, starts[10])]
    assert realign_position(log, log.log_end + 5000, epochs) == (starts[10], "epoch_start", 4)
    # A new master that wrote nothing yet: its epoch starts at its log end, the answer too.
    assert realign_position(log, log.log_end + 5000, [(1, 0), (6, log.log_end)]) == (log.log_end, "epoch_start", 6)


def test_without_epochs_inside_a_record_resumes_at_the_next_record_and_past_the_end_at_the_end(tmp_path: Path) -> None:
    log, starts = records_log(tmp_path, [27, 500, 3, 90] * 10)
    for k in range(len(starts) - 1):
        for inside in (starts[k] + 1, starts[k] + record.HEADER_SIZE, starts[k + 1] - 1):
            assert realign_position(log, inside, []) == (starts[k + 1], "next_record", None)
    assert realign_position(log, log.log_end - 1, []) == (log.log_end, "next_record", None)
    assert realign_position(log, log.log_end + 1, []) == (log.log_end, "log_end", None)


def test_a_record_start_is_answered_as_itself_with_or_without_epochs(tmp_path: Path) -> None:
    log, starts = records_log(tmp_path, [27, 500, 3] * 10)
    for epochs in ([], [(1, 0), (3, starts[7])]):
        for start in starts + [log.log_end]:
            assert realign_position(log, start, epochs) == (start, "record_start", None)


def test_before_the_log_start_is_the_log_start(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "t-0", max_segment_size=1 << 20, start_offset=4096)
    log.append(record.encode_record(b"x" * 10))
    assert realign_position(log, 100, [(2, 4096)]) == (4096, "log_start", None)


def test_the_walk_starts_at_the_time_index_entry_below_and_agrees_with_a_whole_walk(tmp_path: Path) -> None:
    # Several segments, many index entries (one per 4 KiB): every offset's answer is the first
    # record start at or after it, as a walk of the whole log says.
    log, starts = records_log(tmp_path, [27, 700, 5, 3000, 64] * 60, max_segment_size=64 * 1024)
    assert len(log.segments) > 2
    every = sorted(set(starts) | {log.log_end})
    for offset in range(0, log.log_end + 1, 37):
        expected = next(s for s in every if s >= offset)
        assert log.record_start_at_or_after(offset) == expected, offset
    # The walk reads from the entry, not the segment's start.
    segment = log.segments[0]
    target = starts[200] if starts[200] < segment.end else segment.end - 1
    entry = segment.time_index.record_start_at_or_before(target)
    assert entry is not None and entry > segment.start and entry <= target


def test_the_offset_request_realign_field_over_the_wire(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (_, conn):
            offsets = []
            for size in (27, 400, 9):
                put = await conn.request(put_header("moved"), record.encode_record(b"m" * size))
                offsets.append(put["offset"])
            ask = {"op": "offset", "topic": "moved", "partition": 0}
            inside = await conn.request({**ask, "offset": offsets[1] + 5, "realign": True})
            assert inside.code == 200, inside.header
            assert (inside["offset"], inside["realign"]) == (offsets[2], "next_record")  # no ZooKeeper: no epochs
            assert "epoch" not in inside.header and inside["max_offset"] >= offsets[2]
            start = await conn.request({**ask, "offset": offsets[1], "realign": True})
            assert (start["offset"], start["realign"]) == (offsets[1], "record_start")
            plain = await conn.request({**ask, "offset": offsets[1] + 5})  # MetaQ's offset: unchanged
            assert plain["offset"] == 0 and "realign" not in plain.header
            wrong = await conn.request({**ask, "offset": 5, "realign": "yes"})
            assert wrong.code == 400 and "realign" in wrong.message

    run(scenario())


# --- the consumer's detection -----------------------------------------------------------------


def test_a_damaged_first_record_is_told_from_a_partial_one() -> None:
    whole = record.encode_record(b"a" * 27) + record.encode_record(b"b" * 40)
    assert not damaged_first_record(whole)
    assert not damaged_first_record(whole[:20])  # cut off: fetch more
    assert not damaged_first_record(whole[:5])
    assert damaged_first_record(whole[3:])  # inside the first record: unknown flags in what reads as a header
    inner = record.encode_record(b"\x00\x00\x00\x04" + b"z" * 40)  # a payload that reads as a short header
    assert damaged_first_record(inner[record.HEADER_SIZE:])  # inside the record: its CRC fails
    flipped = bytearray(whole)
    flipped[record.HEADER_SIZE + 2] ^= 1
    assert damaged_first_record(bytes(flipped))


class FakeConnection:
    """Answers ``offset`` requests with the given offsets in turn (unit test: no broker)."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = list(answers)
        self.asked: list[dict[str, Any]] = []

    async def request(self, header: dict[str, Any], body: bytes = b"", timeout: float | None = None) -> Any:
        self.asked.append(header)
        fields = self.answers.pop(0)
        return _Reply(200, fields)


class _Reply:
    def __init__(self, code: int, header: dict[str, Any], body: bytes = b"") -> None:
        self.code, self.header, self.body = code, header, body
        self.ok = code == c.OK
        self.message = header.get("msg", "")
        self.reason = header.get("reason")

    def __getitem__(self, key: str) -> Any:
        return self.header[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.header.get(key, default)


def make_fetcher(position: int, role: str = "master") -> PartitionFetcher:
    consumer = SimpleNamespace(
        config=SimpleNamespace(group="g", max_fetch_size=1 << 20, fetch_wait_ms=0),
        client_config=SimpleNamespace(request_timeout_s=1.0),
        stats=SimpleNamespace(filtered=0),
    )
    subscription = Subscription(topic="t", listener=lambda m: None, max_size=1 << 16)
    fetcher = PartitionFetcher(consumer, subscription, Partition(0, 0), Position(-1, position))  # type: ignore[arg-type]
    fetcher.state.replica = SimpleNamespace(role=role)  # type: ignore[assignment]
    return fetcher


def test_a_fetch_inside_a_record_or_past_the_masters_end_is_misaligned_and_a_partial_tail_is_not() -> None:
    async def scenario() -> None:
        data = record.encode_record(b"a" * 27) + record.encode_record(b"b" * 40)
        fetcher = make_fetcher(1003)
        with pytest.raises(_Misaligned) as inside:
            await fetcher._handle(_Reply(200, {"offset": 1003}, data[3:]), 1 << 16)
        assert inside.value.offset == 1003 and "no message starts at 1003" in str(inside.value)
        with pytest.raises(_Misaligned):  # a first record that never ends in what the broker had
            await fetcher._handle(_Reply(200, {"offset": 1003}, record.encode_record(b"c" * 90)[:50]), 1 << 16)
        cut = record.encode_record(b"c" * 90)[:50]
        assert await fetcher._handle(_Reply(200, {"offset": 1003}, cut), 50) == "grow"  # cut off by max_size
        with pytest.raises(_Misaligned) as past:
            await fetcher._handle(_Reply(404, {"committed": 500, "log_end": 500}), 1 << 16)
        assert "past the master's log end 500" in str(past.value)
        slave = make_fetcher(1003, role="slave")  # a slave may lag: not a changed log
        with pytest.raises(_FetchError, match="behind"):
            await slave._handle(_Reply(404, {"committed": 500, "log_end": 500}), 1 << 16)

    run(scenario())


def test_realign_moves_the_position_warns_once_and_never_loops(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        fetcher = make_fetcher(234397)
        conn = FakeConnection({"offset": 233451, "realign": "epoch_start", "epoch": 4})
        caplog.set_level(logging.WARNING, logger=consumer_module.__name__)
        await fetcher._realign(conn, _Misaligned(234397, "no message starts at 234397 (bad header)"))  # type: ignore[arg-type]
        assert conn.asked == [{"op": "offset", "topic": "t", "partition": 0, "offset": 234397, "realign": True}]
        assert fetcher.position == Position(-1, 233451)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == ["t-0-0: no message starts at 234397 (bad header): the log changed under this position, "
                            "e.g. an async failover took back records; resuming at 233451, the start of epoch 4"]
        # Undecodable again at the position it was moved to: a clear error, no second query.
        with pytest.raises(_FetchError) as again:
            await fetcher._realign(conn, _Misaligned(233451, "no message starts at 233451 (bad header)"))  # type: ignore[arg-type]
        assert again.value.stuck and "the broker says a message starts there" in str(again.value)
        assert len(conn.asked) == 1 and fetcher.position == Position(-1, 233451)

    run(scenario())


def test_a_broker_that_vouches_for_the_position_is_an_error_and_is_not_asked_again() -> None:
    async def scenario() -> None:
        fetcher = make_fetcher(4096)
        conn = FakeConnection({"offset": 4096, "realign": "record_start"})
        for _ in range(3):
            with pytest.raises(_FetchError) as stuck:
                await fetcher._realign(conn, _Misaligned(4096, "no message starts at 4096 (a fetch of 1048576 bytes holds no whole one)"))  # type: ignore[arg-type]
            assert stuck.value.stuck and not stuck.value.replica_failed
        assert len(conn.asked) == 1 and fetcher.position == Position(-1, 4096)

    run(scenario())


def test_an_old_broker_answers_the_segment_start_which_is_a_record_start(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        fetcher = make_fetcher(9000)
        caplog.set_level(logging.WARNING, logger=consumer_module.__name__)
        await fetcher._realign(FakeConnection({"offset": 8192, "min_offset": 0, "max_offset": 9500}),  # type: ignore[arg-type]
                               _Misaligned(9000, "no message starts at 9000 (bad header)"))
        assert fetcher.position == Position(-1, 8192)
        assert "the start of the segment holding it (the broker predates realign)" in caplog.text

    run(scenario())
