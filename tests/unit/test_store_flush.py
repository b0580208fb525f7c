"""LogFlusher: group commit, threshold and periodic flushing, fsync errors."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from metaq import record
from metaq.store.flush import AppendTruncated, LogFlusher
from metaq.store.log import PartitionLog

REC = record.encode_record(b"payload", msg_id=1)


class GatedFsync:
    """os.fsync replacement that counts calls and blocks until the test opens the gate."""

    def __init__(self, monkeypatch, fail: bool = False) -> None:
        self.real = os.fsync
        self.calls: list[int] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.fail = fail
        monkeypatch.setattr(os, "fsync", self)

    def __call__(self, fd: int) -> None:
        self.calls.append(fd)
        self.entered.set()
        assert self.gate.wait(5), "test never opened the fsync gate"
        if self.fail:
            raise OSError(5, "Input/output error")
        self.real(fd)


def new_log(tmp_path) -> PartitionLog:
    log = PartitionLog(tmp_path, max_segment_size=1 << 20)
    log.flush()  # the directory entry of the first segment, so tests count only data fsyncs
    return log


async def put(log: PartitionLog, flusher: LogFlusher, count: int = 1) -> int:
    """What the broker does per put: append, then let the flusher decide when to ack."""
    log.append(REC * count)
    end = log.log_end
    await flusher.appended(end, count)
    return end


def test_group_commit_acks_after_fsync_and_shares_fsyncs(tmp_path, monkeypatch):
    async def scenario():
        log = new_log(tmp_path)
        flusher = LogFlusher(log, unflush_threshold=0, unflush_interval_ms=10_000)
        fsync = GatedFsync(monkeypatch)
        first = asyncio.create_task(put(log, flusher))
        await asyncio.to_thread(fsync.entered.wait, 5)  # fsync #1 is running
        # These arrive during fsync #1: it does not cover them, they wait for #2.
        later = [asyncio.create_task(put(log, flusher)) for _ in range(20)]
        await asyncio.sleep(0.05)
        assert not first.done() and not any(t.done() for t in later)
        assert log.flushed_end == 0
        fsync.gate.set()
        ends = await asyncio.gather(first, *later)
        assert log.flushed_end == log.log_end == max(ends)
        assert len(fsync.calls) == 2 and flusher.fsyncs == 2
        assert flusher.unflushed_messages == 0

    asyncio.run(scenario())


def test_group_commit_with_no_concurrency_is_one_fsync_per_put(tmp_path, monkeypatch):
    async def scenario():
        log = new_log(tmp_path)
        flusher = LogFlusher(log, unflush_threshold=0, unflush_interval_ms=10_000)
        fsync = GatedFsync(monkeypatch)
        fsync.gate.set()
        for n in range(1, 4):
            end = await put(log, flusher)
            assert log.flushed_end == end and len(fsync.calls) == n

    asyncio.run(scenario())


def test_fsync_failure_fails_every_waiter_then_recovers(tmp_path, monkeypatch):
    async def scenario():
        log = new_log(tmp_path)
        flusher = LogFlusher(log, unflush_threshold=0, unflush_interval_ms=10_000)
        fsync = GatedFsync(monkeypatch, fail=True)
        waiters = [asyncio.create_task(put(log, flusher)) for _ in range(5)]
        await asyncio.to_thread(fsync.entered.wait, 5)
        fsync.gate.set()
        results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 5)
        assert all(isinstance(r, OSError) for r in results)
        assert log.flushed_end == 0
        fsync.fail = False  # the disk is back: the next put flushes everything
        end = await put(log, flusher)
        assert log.flushed_end == end == log.log_end

    asyncio.run(scenario())


def test_cancelled_waiter_does_not_cancel_the_shared_fsync(tmp_path, monkeypatch):
    async def scenario():
        log = new_log(tmp_path)
        flusher = LogFlusher(log, unflush_threshold=0, unflush_interval_ms=10_000)
        fsync = GatedFsync(monkeypatch)
        impatient = asyncio.create_task(put(log, flusher))
        patient = asyncio.create_task(put(log, flusher))
        await asyncio.to_thread(fsync.entered.wait, 5)
        impatient.cancel()
        fsync.gate.set()
        await patient
        assert log.flushed_end == log.log_end

    asyncio.run(scenario())


def test_threshold_flushes_in_background_once_reached(tmp_path, monkeypatch):
    async def scenario():
        log = new_log(tmp_path)
        flusher = LogFlusher(log, unflush_threshold=5, unflush_interval_ms=100_000)
        fsync = GatedFsync(monkeypatch)
        fsync.gate.set()
        await put(log, flusher, count=2)
        await put(log, flusher, count=2)
        await asyncio.sleep(0.02)
        assert fsync.calls == [] and log.flushed_end == 0  # 4 < 5: acked, not flushed
        # The 5th message: acked at once (does not wait), and starts a background flush.
        gate_closed = GatedFsync(monkeypatch)
        end = await asyncio.wait_for(put(log, flusher), 1)
        await asyncio.to_thread(gate_closed.entered.wait, 5)
        gate_closed.gate.set()
        assert await flusher.wait_flushed(end) == end
        assert flusher.unflushed_messages == 0 and flusher.fsyncs == 1

    asyncio.run(scenario())


def test_periodic_flush_and_final_flush_on_stop(tmp_path):
    async def scenario():
        log = new_log(tmp_path)
        flusher = LogFlusher(log, unflush_threshold=1000, unflush_interval_ms=20)
        flusher.start()
        end = await put(log, flusher)
        for _ in range(100):
            if log.flushed_end == end:
                break
            await asyncio.sleep(0.01)
        assert log.flushed_end == end
        flusher.unflush_interval_ms = 100_000  # no more periodic rounds before stop
        await asyncio.sleep(0.05)
        end = await put(log, flusher)
        assert log.flushed_end < end
        await flusher.stop()
        assert log.flushed_end == end

    asyncio.run(scenario())


def test_waiting_for_bytes_that_were_truncated_away_fails(tmp_path):
    async def scenario():
        log = new_log(tmp_path)
        flusher = LogFlusher(log, unflush_threshold=0, unflush_interval_ms=1000)
        log.append(REC)
        with pytest.raises(AppendTruncated):
            await flusher.wait_flushed(log.log_end + 100)

    asyncio.run(scenario())


def test_one_scheduler_runs_the_periodic_rounds_of_every_log_without_a_task_per_log(tmp_path):
    from metaq.store.flush import FlushScheduler

    async def scenario():
        scheduler = FlushScheduler()
        logs, flushers = [], []
        for n in range(50):
            log = new_log(tmp_path / f"t-{n}")
            flusher = LogFlusher(log, unflush_threshold=1000, unflush_interval_ms=20 if n % 2 else 40)
            flusher.start(scheduler)
            logs.append(log)
            flushers.append(flusher)
        assert len(scheduler) == 50
        assert len(asyncio.all_tasks()) == 1  # this test's own: no task per log
        ends = [await put(log, flusher) for log, flusher in zip(logs, flushers)]
        for _ in range(200):
            if all(log.flushed_end == end for log, end in zip(logs, ends)):
                break
            await asyncio.sleep(0.01)
        assert all(log.flushed_end == end for log, end in zip(logs, ends))
        # A stopped log leaves the rounds (its final flush is its own); the others go on.
        await flushers[0].stop()
        assert len(scheduler) == 49
        end0 = await put(logs[0], flushers[0])
        end1 = await put(logs[1], flushers[1])
        await asyncio.sleep(0.2)
        assert logs[1].flushed_end == end1 and logs[0].flushed_end < end0
        for flusher in flushers[1:]:
            await flusher.stop()
        assert len(scheduler) == 0

    asyncio.run(scenario())
