"""All partition logs of a broker, their flushers and their retention schedule.

Logs are opened lazily (a master creates a partition on its first put) or all at
once at start (``open_existing``, which also yields the largest msg id on disk so the
broker can seed its ``MsgIdGenerator`` above it). A slave opens a partition it does
not have yet at its master's oldest retained offset with ``get_or_create_log``.

A partition whose files cannot be the log the broker knew (``LogCorruptError``) is
refused alone: one error line, a ``RefusedLog`` in its place, and every other
partition keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime
from pathlib import Path
from typing import Callable

from metaq.config import TopicConfig
from metaq.store.checkpoint import checkpoint_path
from metaq.store.cron import QuartzCron
from metaq.store.flush import LogFlusher
from metaq.store.log import LogCorruptError, PartitionLog
from metaq.store.refused import RefusedLog
from metaq.store.retention import dispose_segment, parse_delete_policy
from metaq.store.segment import LogSegment, parse_segment_start

log = logging.getLogger(__name__)

#: How long detached segments stay open before their files are deleted or archived:
#: a fetch that looked a segment up just before may still be sending from its descriptor.
DEFAULT_RETENTION_GRACE_S = 10.0


class UnknownTopic(LookupError):
    def __init__(self, topic: str, known: list[str]) -> None:
        self.topic = topic
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(f"unknown topic {topic!r}: this broker is configured for: {listed}")


class UnknownPartition(LookupError):
    def __init__(self, topic: str, partition: int, num_partitions: int) -> None:
        self.topic, self.partition, self.num_partitions = topic, partition, num_partitions
        super().__init__(
            f"topic {topic!r} has no partition {partition}: numPartitions is {num_partitions} "
            f"(valid partitions are 0..{num_partitions - 1})"
        )


class MessageStoreManager:
    def __init__(
        self,
        topics: dict[str, TopicConfig],
        max_message_size: int,
        *,
        retention_grace_s: float = DEFAULT_RETENTION_GRACE_S,
    ) -> None:
        self._topics = dict(topics)
        self.max_message_size = max_message_size
        self.retention_grace_s = retention_grace_s
        self._logs: dict[tuple[str, int], PartitionLog | RefusedLog] = {}
        self._flushers: dict[tuple[str, int], LogFlusher] = {}
        self._retention_tasks: dict[str, asyncio.Task[None]] = {}
        self._started = False
        #: Called with (topic, partition) after each successful fsync of that log.
        self.on_flushed: Callable[[str, int], None] | None = None
        #: Called with the seconds each fsync of any log took (the broker's metrics).
        self.on_fsync_seconds: Callable[[float], None] | None = None

    # --- lookup --------------------------------------------------------------------

    @property
    def topics(self) -> dict[str, TopicConfig]:
        return dict(self._topics)

    def topic_config(self, topic: str) -> TopicConfig:
        config = self._topics.get(topic)
        if config is None:
            raise UnknownTopic(topic, list(self._topics))
        return config

    def _checked_config(self, topic: str, partition: int) -> TopicConfig:
        config = self.topic_config(topic)
        if not 0 <= partition < config.num_partitions:
            raise UnknownPartition(topic, partition, config.num_partitions)
        return config

    def partition_dir(self, topic: str, partition: int) -> Path:
        return Path(self.topic_config(topic).data_path) / f"{topic}-{partition}"

    def logs(self) -> dict[tuple[str, int], PartitionLog | RefusedLog]:
        """The logs open now, by ``(topic, partition)``."""
        return dict(self._logs)

    def get_log(self, topic: str, partition: int) -> PartitionLog | RefusedLog:
        """The log of a configured partition, created empty at offset 0 if it has none."""
        return self.get_or_create_log(topic, partition)

    def get_or_create_log(self, topic: str, partition: int, start_offset: int = 0) -> PartitionLog | RefusedLog:
        """Like ``get_log``; a new log starts at ``start_offset`` (existing logs ignore it)."""
        # Checked even for open logs: after a reload removed a topic its log stays
        # open (see update_topics) but must no longer be served.
        config = self._checked_config(topic, partition)
        key = (topic, partition)
        existing = self._logs.get(key)
        if existing is not None:
            return existing
        directory = self.partition_dir(topic, partition)
        try:
            partition_log: PartitionLog | RefusedLog = PartitionLog(
                directory,
                max_segment_size=config.max_segment_size,
                start_offset=start_offset,
                max_message_size=self.max_message_size,
            )
        except LogCorruptError as exc:
            log.error("%s-%d is not served: %s", topic, partition, exc)
            partition_log = RefusedLog(directory, str(exc), exc.known_end, config.max_segment_size, self.max_message_size)
        flusher = LogFlusher(partition_log, config.unflush_threshold, config.unflush_interval_ms)
        flusher.on_flushed = lambda: self.on_flushed(topic, partition) if self.on_flushed is not None else None
        flusher.on_fsync_seconds = lambda seconds: self.on_fsync_seconds(seconds) if self.on_fsync_seconds is not None else None
        self._logs[key] = partition_log
        self._flushers[key] = flusher
        if self._started:
            flusher.start()
        return partition_log

    def has_log(self, topic: str, partition: int) -> bool:
        """Whether the partition has a log, open or on disk (without creating one)."""
        return (topic, partition) in self._logs or _holds_a_log(self.partition_dir(topic, partition))

    def flusher(self, topic: str, partition: int) -> LogFlusher:
        self.get_log(topic, partition)
        return self._flushers[(topic, partition)]

    def open_existing(self) -> int:
        """Open every configured partition that has segments on disk; return the largest msg id in them."""
        largest = 0
        for topic, config in self._topics.items():
            for partition in range(config.num_partitions):
                if _holds_a_log(self.partition_dir(topic, partition)):
                    largest = max(largest, self.get_log(topic, partition).last_msg_id())
        return largest

    # --- config reload -------------------------------------------------------------

    def update_topics(self, new_topics: dict[str, TopicConfig]) -> None:
        """Adopt a reloaded topic config: new topics, more partitions, changed settings.

        Open logs of topics that disappeared stay open (their data is kept) but can
        no longer be looked up.
        """
        self._topics = dict(new_topics)
        for (topic, _partition), partition_log in self._logs.items():
            config = self._topics.get(topic)
            if config is None:
                continue
            partition_log.max_segment_size = config.max_segment_size
            flusher = self._flushers[(topic, _partition)]
            flusher.unflush_threshold = config.unflush_threshold
            flusher.unflush_interval_ms = config.unflush_interval_ms
        if self._started:
            self._schedule_retention()

    # --- retention -----------------------------------------------------------------

    async def run_retention(self, topic: str, now: datetime | None = None) -> list[Path]:
        """One retention pass over a topic's open logs; returns the paths removed or archived."""
        policy = parse_delete_policy(self.topic_config(topic).delete_policy)
        cutoff = (now or datetime.now()).timestamp() - policy.seconds
        detached: list[LogSegment] = []
        for (log_topic, _partition), partition_log in list(self._logs.items()):
            if log_topic == topic:
                detached.extend(partition_log.detach_segments_older_than(cutoff))
        if not detached:
            return []
        try:
            await asyncio.sleep(self.retention_grace_s)
        finally:
            # Even when cancelled (broker stopping): the segments are already out of
            # their logs, so their files must go now rather than leak descriptors.
            results = await _shielded_to_thread(lambda: [dispose_segment(s, policy) for s in detached])
        log.info("topic %s: retention (%s) removed %d segment(s)", topic, policy.kind, len(results))
        return results

    async def _retention_loop(self, topic: str, cron: QuartzCron) -> None:
        while True:
            now = datetime.now()
            await asyncio.sleep((cron.next_fire_after(now) - now).total_seconds())
            try:
                await self.run_retention(topic)
            except Exception:
                log.exception("topic %s: retention pass failed", topic)

    def _schedule_retention(self) -> None:
        """(Re)create one retention task per configured topic from its deleteWhen."""
        # Validate everything before touching the running tasks: a bad expression
        # fails the reload or the start with a clear error, the old schedule intact.
        schedules = {}
        for topic, config in self._topics.items():
            parse_delete_policy(config.delete_policy)
            schedules[topic] = QuartzCron(config.delete_when)
        for task in self._retention_tasks.values():
            task.cancel()
        loop = asyncio.get_running_loop()
        self._retention_tasks = {
            topic: loop.create_task(self._retention_loop(topic, cron), name=f"retention {topic}")
            for topic, cron in schedules.items()
        }

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start flushers and retention schedules (needs a running event loop)."""
        self._schedule_retention()
        self._started = True
        for flusher in self._flushers.values():
            flusher.start()

    async def stop(self) -> None:
        """Stop retention, then stop every flusher with a final flush."""
        self._started = False
        tasks, self._retention_tasks = list(self._retention_tasks.values()), {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for key, flusher in list(self._flushers.items()):
            try:
                await flusher.stop()
            except Exception:
                log.exception("%s-%d: final flush failed", *key)

    def close(self) -> None:
        for partition_log in self._logs.values():
            partition_log.close()
        self._logs.clear()
        self._flushers.clear()


def _holds_a_log(directory: Path) -> bool:
    """Segment files, or a checkpoint saying there were some (all deleted: refused on open)."""
    if not directory.is_dir():
        return False
    return checkpoint_path(directory).exists() or any(parse_segment_start(p) is not None for p in directory.iterdir())


async def _shielded_to_thread(work):  # type: ignore[no-untyped-def]
    """Run ``work`` in a thread and wait for it even if the caller is being cancelled."""
    future = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await future
        raise
