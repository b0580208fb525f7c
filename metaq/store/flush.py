"""When a partition log is fsynced: MetaQ's flush policy on asyncio.

* ``unflushThreshold == 0`` -- group commit: a put is acked only after an fsync that
  covers it. There is at most one fsync in flight per log (in a worker thread). It
  covers every append made before it started, so all their callers share it; callers
  that arrive while it runs wait for the next one, which the first of them starts.
  Under load this batches many puts per fsync without any timer or queue.
* ``unflushThreshold > 0`` -- puts are acked at once; an fsync starts in the
  background once that many messages are unflushed, and every ``unflushInterval`` ms a
  periodic round flushes the log if anything is unflushed (and checks, whatever the
  policy, that no segment file of the log was deleted).

Periodic rounds of every log of a broker run from one ``FlushScheduler`` (one timer for
the broker, a heap of due times), not one task per partition: at 10,000 partitions a task
each would wake the event loop 1,000 times a second with the default 10 s interval while
nothing happens.

An fsync error fails every caller waiting on that fsync with the OSError (never a
hang); the data stays unflushed and the next flush tries again.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from typing import Callable

from metaq.store.log import PartitionLog, SegmentVanished

log = logging.getLogger(__name__)


class AppendTruncated(RuntimeError):
    """The log was truncated below an offset someone was waiting to see flushed."""


class LogFlusher:
    def __init__(self, log: PartitionLog, unflush_threshold: int, unflush_interval_ms: int) -> None:
        if unflush_interval_ms <= 0:
            raise ValueError(f"unflush_interval_ms must be positive, got {unflush_interval_ms}")
        self.log = log
        self.unflush_threshold = unflush_threshold
        self.unflush_interval_ms = unflush_interval_ms
        self.fsyncs = 0  # completed fsync rounds, for stats and tests
        self._unflushed_messages = 0
        self._inflight: asyncio.Future[int] | None = None
        #: The scheduler running this log's periodic rounds (None: not started).
        self._scheduler: FlushScheduler | None = None
        #: Called on the event loop after each successful fsync (the broker wakes
        #: consumers waiting for the committed offset, which follows flushed_end).
        self.on_flushed: Callable[[], None] | None = None
        #: Called with the seconds each successful fsync took (the broker's metrics).
        self.on_fsync_seconds: Callable[[float], None] | None = None

    @property
    def group_commit(self) -> bool:
        return self.unflush_threshold <= 0

    @property
    def unflushed_messages(self) -> int:
        return self._unflushed_messages

    async def appended(self, end_offset: int, count: int) -> None:
        """Note ``count`` records appended up to ``end_offset``; in group commit, wait for their fsync."""
        if self.group_commit:
            self._unflushed_messages += count
            await self.wait_flushed(end_offset)
        else:
            self.note_appended(count)

    def note_appended(self, count: int) -> None:
        """The threshold policy's bookkeeping, without a coroutine (the put hot path)."""
        self._unflushed_messages += count
        threshold = self.unflush_threshold  # > 0: not group commit (``group_commit``, inline)
        if threshold > 0 and self._unflushed_messages >= threshold:
            # ">=" so that unflushThreshold=1 means "every message", as MetaQ documents.
            self._current_or_new_flush()

    async def wait_flushed(self, end_offset: int) -> int:
        """Return once ``flushed_end >= end_offset``, sharing fsyncs with other waiters."""
        while self.log.flushed_end < end_offset:
            if self.log.log_end < end_offset:
                raise AppendTruncated(
                    f"{self.log.directory}: log truncated to {self.log.log_end} before offset {end_offset} was flushed"
                )
            # shield: a cancelled waiter must not cancel the fsync others share.
            await asyncio.shield(self._current_or_new_flush())
        return self.log.flushed_end

    async def flush_now(self) -> int:
        return await self.wait_flushed(self.log.log_end)

    def _current_or_new_flush(self) -> asyncio.Future[int]:
        """The fsync in flight, or a new one if none is. One at a time per log."""
        if self._inflight is None or self._inflight.done():
            counted, started = self._unflushed_messages, time.perf_counter()
            future = asyncio.ensure_future(asyncio.to_thread(self.log.flush))
            future.add_done_callback(lambda f: self._flush_done(f, counted, started))
            self._inflight = future
        return self._inflight

    def _flush_done(self, future: asyncio.Future[int], counted: int, started: float) -> None:
        if future.cancelled():
            return
        error = future.exception()  # also marks it retrieved for background flushes
        if error is not None:
            if not isinstance(error, SegmentVanished):  # the log said so once, with what to do
                log.error("%s: fsync failed: %s", self.log.directory, error)
            return
        self.fsyncs += 1
        if self.on_fsync_seconds is not None:
            self.on_fsync_seconds(time.perf_counter() - started)
        if self.on_flushed is not None:
            self.on_flushed()
        # Messages counted after this flush started may or may not be covered; keep
        # them counted, at worst the next flush comes a little early.
        self._unflushed_messages = max(0, self._unflushed_messages - counted)

    # --- periodic flushing -----------------------------------------------------------

    def start(self, scheduler: "FlushScheduler | None" = None) -> None:
        """Run periodic rounds from ``scheduler`` (the store's, shared by every log; a private
        one without); needs a running event loop."""
        if self._scheduler is None:
            self._scheduler = scheduler if scheduler is not None else FlushScheduler()
            self._scheduler.add(self)

    async def stop(self) -> None:
        """Stop the periodic rounds and flush what is left."""
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.remove(self)
        await self.flush_now()

    def periodic_round(self) -> None:
        """One round: notice a deleted segment file even with no puts; start an fsync if
        anything is unflushed (its failure is logged by ``_flush_done``; the next round retries)."""
        self.log.check_files()
        if self.log.flushed_end < self.log.log_end:
            self._current_or_new_flush()


class FlushScheduler:
    """One timer for the periodic rounds of every log of a broker.

    A heap of ``(due, sequence, flusher)``; the loop timer is armed for the earliest entry.
    When it fires, every round due (within ``COALESCE_S``) runs, and each flusher is put
    back ``unflush_interval_ms`` later (read each round: a reload may change it). A removed
    flusher's entries are skipped when they come up (``_members``).
    """

    COALESCE_S = 0.05

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, LogFlusher]] = []
        self._members: set[int] = set()
        self._sequence = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None

    def __len__(self) -> int:
        return len(self._members)

    def add(self, flusher: LogFlusher) -> None:
        self._members.add(id(flusher))
        self._push(flusher, asyncio.get_running_loop().time())

    def remove(self, flusher: LogFlusher) -> None:
        self._members.discard(id(flusher))
        if not self._members and self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
            self._heap.clear()

    def _push(self, flusher: LogFlusher, now: float) -> None:
        due = now + flusher.unflush_interval_ms / 1000
        heapq.heappush(self._heap, (due, next(self._sequence), flusher))
        if self._timer_at is None or due < self._timer_at:
            self._arm(due)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(when, self._fire)
        self._timer_at = when

    def _fire(self) -> None:
        self._timer = self._timer_at = None
        now = asyncio.get_running_loop().time()
        due: list[LogFlusher] = []
        while self._heap and self._heap[0][0] <= now + self.COALESCE_S:
            flusher = heapq.heappop(self._heap)[2]
            if id(flusher) in self._members:
                due.append(flusher)
        for flusher in due:
            try:
                flusher.periodic_round()
            except Exception:  # one log's trouble must not stop every other log's rounds
                log.exception("%s: periodic flush round failed", flusher.log.directory)
            self._push(flusher, now)
        if self._heap and self._timer is None:
            self._arm(self._heap[0][0])
