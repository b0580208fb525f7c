"""All partition logs of a broker, their flushers and their retention schedule.

Logs are opened lazily (a master creates a partition on its first put) or all at
once at start (``open_existing``, which also yields the largest msg id on disk so the
broker can seed its ``MsgIdGenerator`` above it). A slave opens a partition it does
not have yet at its master's oldest retained offset with ``get_or_create_log``.

A partition whose files cannot be the log the broker knew (``LogCorruptError``) is
refused alone: one error line, a ``RefusedLog`` in its place, and every other
partition keeps serving.

The topic map is not the store's: it reads the broker's (``LiveConfig``, through the
``topics`` reader it is built with) each time and applies each ``TopicChange``
(``apply_topic_change``); a store built with a plain map (tools, tests: no broker) holds
that one and changes it with ``update_topics``.

A partition that stops being configured (its topic deleted, re-created as another
incarnation, or with fewer partitions) is dropped by ``apply_topic_change``: its log leaves the
map at once, its directory is renamed aside in the same step (so a log of a re-created
topic opens empty in its place), and ``dispose`` stops, closes and deletes the rest
(metaq/store/incarnation.py has the rule for files of an earlier incarnation).

The store keeps one map by partition, its open logs (``_logs``); each log carries its
flusher (``partition_log.flusher``, made with it in ``_register``), so the stop path's final
flush of every log and a dropped log's flusher are reached through that map. It stays
the store's own registry, apart from the broker's ``Partitions`` (metaq/server/partitions.py,
which reads it): tools and tests run a store without a broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Mapping

from metaq.config import ConfigError, TopicConfig
from metaq.topic_change import TopicChange
from metaq.private_files import make_private_dir
from metaq.store.batch_sync import fsync_all, run_all
from metaq.store.checkpoint import checkpoint_path, write_first_checkpoints
from metaq.cron import QuartzCron
from metaq.store import incarnation
from metaq.store.flush import FlushScheduler, LogFlusher
from metaq.store.log import LogCorruptError, PartitionLog, lay_out_empty_log
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


@dataclass
class DroppedPartition:
    """A partition no longer configured: out of the store's map, its files moved aside."""

    topic: str
    partition: int
    log: "PartitionLog | RefusedLog | None"
    flusher: LogFlusher | None
    #: Where its directory was moved (None: it had none).
    aside: Path | None


class MessageStoreManager:
    def __init__(
        self,
        topics: Mapping[str, TopicConfig] | Callable[[], Mapping[str, TopicConfig]],
        max_message_size: int,
        *,
        retention_grace_s: float = DEFAULT_RETENTION_GRACE_S,
    ) -> None:
        #: The topic map served now, read each time: the broker's ``LiveConfig`` (a reader), or a
        #: map of the store's own when it runs without a broker (then ``update_topics`` changes it).
        self._own_topics: dict[str, TopicConfig] | None = None
        if callable(topics):
            self._served: Callable[[], Mapping[str, TopicConfig]] = topics
        else:
            own = self._own_topics = dict(topics)
            self._served = lambda: own
        self.max_message_size = max_message_size
        self.retention_grace_s = retention_grace_s
        #: The open logs: the store's one map by partition. Each log carries its flusher
        #: (``partition_log.flusher``), so a log leaving this map takes its flusher along.
        self._logs: dict[tuple[str, int], PartitionLog | RefusedLog] = {}
        #: One timer for every log's periodic flush round (not one task per partition).
        self.flush_scheduler = FlushScheduler()
        #: Runs every topic's retention schedule (``_retention_sweeps``).
        self._retention_task: asyncio.Task[None] | None = None
        #: Dropped partitions being closed and deleted (``dispose``), and directories of an
        #: earlier incarnation being deleted (``_remove_later``).
        self._disposals: set[asyncio.Future[None]] = set()
        self._removals: set[asyncio.Future[None]] = set()
        self._started = False
        #: ``create_log`` requests waiting for the next batch: start offset and its waiter.
        self._creations: dict[tuple[str, int], tuple[int, asyncio.Future[None]]] = {}
        self._creating: asyncio.Future[None] | None = None
        #: One batch of new logs laid out at a time (``create_logs``): two batches in their
        #: worker threads at once could both lay out one partition's directory (a topic
        #: created, deleted and created again while the first batch ran: FileExistsError).
        self._laying_out = asyncio.Lock()
        #: Called with (topic, partition) after each successful fsync of that log.
        self.on_flushed: Callable[[str, int], None] | None = None
        #: Called with the seconds each fsync of any log took (the broker's metrics).
        self.on_fsync_seconds: Callable[[float], None] | None = None

    # --- lookup --------------------------------------------------------------------

    @property
    def topics(self) -> dict[str, TopicConfig]:
        return dict(self._served())

    def topic_config(self, topic: str) -> TopicConfig:
        topics = self._served()
        config = topics.get(topic)
        if config is None:
            raise UnknownTopic(topic, list(topics))
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

    def open_log(self, topic: str, partition: int) -> PartitionLog | RefusedLog | None:
        """The partition's log if it is open now (None once dropped), without creating one."""
        return self._logs.get((topic, partition))

    def get_log(self, topic: str, partition: int) -> PartitionLog | RefusedLog:
        """The log of a configured partition, created empty at offset 0 if it has none."""
        # Asked several times per request: an open log of a configured partition at once
        # (the same checks as ``get_or_create_log``'s, inline), anything else through it.
        config = self._served().get(topic)
        if config is not None and 0 <= partition < config.num_partitions:
            existing = self._logs.get((topic, partition))
            if existing is not None:
                return existing
        return self.get_or_create_log(topic, partition)

    def get_or_create_log(self, topic: str, partition: int, start_offset: int = 0) -> PartitionLog | RefusedLog:
        """Like ``get_log``; a new log starts at ``start_offset`` (existing logs ignore it)."""
        # Checked even for open logs: after a reload removed a topic its log stays
        # open (see apply_topic_change) but must no longer be served.
        config = self._checked_config(topic, partition)
        key = (topic, partition)
        existing = self._logs.get(key)
        if existing is not None:
            return existing
        directory = self._directory_for_new_log(topic, partition, config)
        partition_log = self._open_or_refuse(topic, partition, directory, config, start_offset)
        if isinstance(partition_log, PartitionLog):
            incarnation.write_marker(directory, config.incarnation)
        return self._register(topic, partition, partition_log, config)

    def _directory_for_new_log(self, topic: str, partition: int, config: TopicConfig) -> Path:
        directory = self.partition_dir(topic, partition)
        if not incarnation.belongs(directory, config.incarnation):
            # Invariant: a log is never served from another incarnation's files (a topic
            # deleted and re-created while this broker was down or missed the delete).
            aside = incarnation.move_aside(directory)
            log.warning("%s-%d: files of an earlier incarnation of topic %s moved aside to %s, being deleted",
                        topic, partition, topic, aside)
            self._remove_later(aside)
        return directory

    def _open_or_refuse(self, topic: str, partition: int, directory: Path, config: TopicConfig,
                        start_offset: int) -> PartitionLog | RefusedLog:
        """The partition's log, or a ``RefusedLog`` if its files cannot be it (blocking I/O)."""
        try:
            return PartitionLog(
                directory,
                max_segment_size=config.max_segment_size,
                start_offset=start_offset,
                max_message_size=self.max_message_size,
            )
        except LogCorruptError as exc:
            log.error("%s-%d is not served: %s", topic, partition, exc)
            return RefusedLog(directory, str(exc), exc.known_end, config.max_segment_size, self.max_message_size)

    def _register(self, topic: str, partition: int, partition_log: PartitionLog | RefusedLog,
                  config: TopicConfig) -> PartitionLog | RefusedLog:
        """Put an opened log in the map with its flusher (started if the store is)."""
        key = (topic, partition)
        flusher = LogFlusher(partition_log, config.unflush_threshold, config.unflush_interval_ms)
        flusher.on_flushed = lambda: self.on_flushed(topic, partition) if self.on_flushed is not None else None
        flusher.on_fsync_seconds = lambda seconds: self.on_fsync_seconds(seconds) if self.on_fsync_seconds is not None else None
        partition_log.flusher = flusher
        self._logs[key] = partition_log
        if self._started:
            flusher.start(self.flush_scheduler)
        return partition_log

    async def create_log(self, topic: str, partition: int, start_offset: int = 0) -> PartitionLog | RefusedLog:
        """``get_or_create_log`` for callers that create many logs at once, each in its own task
        (a slave starting its partitions): a new log's files are created with those of every
        other partition asked for meanwhile, in one batch off the event loop (``create_logs``)."""
        self._checked_config(topic, partition)
        key = (topic, partition)
        if key not in self._logs and not self.has_log(topic, partition):
            waiting = self._creations.get(key)
            if waiting is None:
                waiting = self._creations[key] = (start_offset, asyncio.get_running_loop().create_future())
                if self._creating is None or self._creating.done():
                    self._creating = asyncio.ensure_future(self._create_requested())
            await asyncio.shield(waiting[1])
        return self.get_or_create_log(topic, partition, start_offset)

    async def _create_requested(self) -> None:
        """Create what ``create_log`` was asked for, one batch at a time: the requests that
        arrive while a batch is in its worker thread form the next one."""
        await asyncio.sleep(0)  # let the tasks started together ask first
        while self._creations:
            batch, self._creations = self._creations, {}
            try:
                await self.create_logs([(topic, partition, start) for (topic, partition), (start, _) in batch.items()])
            except Exception as exc:  # each waiter raises it (a slave retries its start)
                for _start, future in batch.values():
                    if not future.done():
                        future.set_exception(exc)
            else:
                for _start, future in batch.values():
                    if not future.done():
                        future.set_result(None)

    async def create_logs(self, wanted: list[tuple[str, int, int]]) -> None:
        """Give each ``(topic, partition, start_offset)`` that has no log an empty one starting
        there, as one batch: files created and made durable in one worker thread
        (``_lay_out_and_open``), then the logs registered on the event loop. One batch at a
        time: what a batch before this one laid out is seen here as a log already there."""
        async with self._laying_out:
            await self._create_logs(wanted)

    async def _create_logs(self, wanted: list[tuple[str, int, int]]) -> None:
        new: dict[tuple[str, int], tuple[Path, TopicConfig, int]] = {}
        for topic, partition, start_offset in wanted:
            config = self._checked_config(topic, partition)
            if (topic, partition) in new or (topic, partition) in self._logs or self.has_log(topic, partition):
                continue
            new[(topic, partition)] = (self._directory_for_new_log(topic, partition, config), config, start_offset)
        if not new:
            return
        opened = await _shielded_to_thread(lambda: self._lay_out_and_open(new))
        for (topic, partition), partition_log in opened.items():
            current = self._served().get(topic)
            directory, config, _start = new[(topic, partition)]
            if (topic, partition) in self._logs:
                partition_log.close()  # opened meanwhile by ``get_or_create_log``: that one is the log
                continue
            if current is None or partition >= current.num_partitions or current.incarnation != config.incarnation:
                # No longer served as it was (deleted, or deleted and created again, while the
                # thread ran): these files are no partition's log. Its deletion may have renamed
                # the directory before the thread made it again, so they go the same way.
                partition_log.close()
                if incarnation.belongs(directory, config.incarnation):
                    self._remove_later(incarnation.move_aside(directory))
                continue
            self._register(topic, partition, partition_log, current)

    def _lay_out_and_open(self, new: dict[tuple[str, int], tuple[Path, TopicConfig, int]]) -> dict[tuple[str, int], PartitionLog | RefusedLog]:
        """Create and open new logs (blocking: a worker thread), with a bounded number of fsyncs
        however many there are, and crash-safe at every step. In this order:

        1. each parent data directory exists durably (``make_private_dir``: usually it does);
        2. per log, not yet durable: its directory, its first segment file (empty, named by its
           start offset), its incarnation marker;
        3. all of those files and directories fsynced at once (``fsync_all``);
        4. each parent directory fsynced once, for all the new directories in it;
        5. the first flushed-end checkpoints, as one batch (``write_first_checkpoints``);
        6. each log opened as an existing one (it finds its segment and checkpoint: no more writes).

        After a power loss at any point the start-up finds, per partition, one of: no
        directory; a directory without a segment file (not a log: ``has_log`` is false, and it is
        created again); an empty segment, with or without its marker (a log that starts where
        its file name says; a missing marker is written on open) and with or without a
        checkpoint. A checkpoint becomes durable only after its segment (step 5 follows 3-4), so
        it never names an offset its files lack (which would refuse the log: ``LogWentBackwards``).
        No log is returned, so nothing is appended or acked in one, before step 4 made it
        durable.
        """
        for parent in {directory.parent for directory, _config, _start in new.values()}:
            make_private_dir(parent)

        def lay_out(item: tuple[Path, TopicConfig, int]) -> list[Path]:
            directory, config, start_offset = item
            created = lay_out_empty_log(directory, start_offset)
            if config.incarnation:
                incarnation.write_marker(directory, config.incarnation)
                created.append(directory / incarnation.MARKER)
            return created

        fsync_all(path for created in run_all(lay_out, list(new.values())) for path in created)
        fsync_all(directory.parent for directory, _config, _start in new.values())
        write_first_checkpoints({directory: start_offset for directory, _config, start_offset in new.values()})
        opened = run_all(lambda item: self._open_or_refuse(*item[0], *item[1]),
                         [(key, (directory, config, start_offset)) for key, (directory, config, start_offset) in new.items()])
        return dict(zip(new, opened))

    def has_log(self, topic: str, partition: int) -> bool:
        """Whether the partition has a log, open or on disk (without creating one)."""
        if (topic, partition) in self._logs:
            return True
        directory = self.partition_dir(topic, partition)
        return _holds_a_log(directory) and incarnation.belongs(directory, self.topic_config(topic).incarnation)

    def flusher(self, topic: str, partition: int) -> LogFlusher:
        # Asked on every put: an open log's flusher straight away (get_log's checks of the
        # topic's configuration were made by whoever is appending to it).
        partition_log = self._logs.get((topic, partition)) or self.get_log(topic, partition)
        return _flusher_of(partition_log)

    def open_existing(self) -> int:
        """Open every configured partition that has segments on disk; return the largest msg id in them."""
        largest = 0
        for topic, config in self._served().items():
            incarnation.sweep(Path(config.data_path))
            for partition in range(config.num_partitions):
                if self.has_log(topic, partition):
                    largest = max(largest, self.get_log(topic, partition).last_msg_id())
        return largest

    # --- config reload -------------------------------------------------------------

    def update_topics(self, new_topics: dict[str, TopicConfig], delete_dropped: bool = True) -> list[DroppedPartition]:
        """A store without a broker (tools, tests) serves a new topic map of its own: see
        ``apply_topic_change``. A broker's store follows its ``LiveConfig`` instead."""
        own = self._own_topics
        if own is None:
            raise RuntimeError("this store serves the broker's topic map: change it through LiveConfig.set_topics")
        change = TopicChange(dict(own), dict(new_topics))
        own.clear()
        own.update(new_topics)
        return self.apply_topic_change(change, delete_dropped)

    def apply_topic_change(self, change: TopicChange, delete_dropped: bool = True) -> list[DroppedPartition]:
        """Serve a changed topic map (already the one ``topics`` reads): new topics, more
        partitions, changed settings.

        Returns the partitions it no longer has (``dropped_partitions``): already out of
        the map and (``delete_dropped``) their directories renamed aside, so nothing can look
        them up and a re-created topic opens empty; the caller forgets its own state of them,
        then ``dispose`` closes and deletes them. Without ``delete_dropped`` (a server.ini
        section removed, no group configuration) their files stay on disk.
        """
        dropped = [self._drop(topic, partition, path if delete_dropped else None)
                   for topic, partition, path in dropped_partitions(change.before, change.after)]
        dropped += self._claim_open_logs(change)
        for (topic, _partition), partition_log in self._logs.items():
            config = change.after.get(topic)
            if config is None:
                continue
            partition_log.max_segment_size = config.max_segment_size
            flusher = _flusher_of(partition_log)
            flusher.unflush_threshold = config.unflush_threshold
            flusher.unflush_interval_ms = config.unflush_interval_ms
        if self._started:
            self._schedule_retention()
        return dropped

    def _claim_open_logs(self, change: TopicChange) -> list[DroppedPartition]:
        """Open logs of a topic that gets its incarnation now (opened from server.ini at start,
        before the group's configuration was read): their files' marker decides. Files of
        another incarnation are dropped (the topic was deleted and re-created while this broker
        was down); files without a marker are adopted."""
        dropped = []
        for (topic, partition), partition_log in list(self._logs.items()):
            before, after = change.before.get(topic), change.after.get(topic)
            if before is None or after is None or before.incarnation or not after.incarnation:
                continue
            if incarnation.belongs(partition_log.directory, after.incarnation):
                incarnation.write_marker(partition_log.directory, after.incarnation)
            else:
                log.warning("%s-%d: its files belong to an earlier incarnation of topic %s; dropping them",
                            topic, partition, topic)
                dropped.append(self._drop(topic, partition, partition_log.directory))
        return dropped

    def _drop(self, topic: str, partition: int, directory: Path | None) -> DroppedPartition:
        """Take a partition out of the map; move its ``directory`` aside (None: keep the files)."""
        key = (topic, partition)
        partition_log = self._logs.pop(key, None)
        flusher = partition_log.flusher if partition_log is not None else None
        aside = None
        try:
            aside = incarnation.move_aside(directory) if directory is not None else None
        except OSError as exc:
            log.error("%s-%d: no longer served, but its files could not be moved aside: %s", topic, partition, exc)
        if aside is not None and partition_log is not None:
            # Its late writes (a final checkpoint, a snapshot) must land in the files
            # being deleted, never in a new incarnation's directory.
            partition_log.directory = aside
        return DroppedPartition(topic, partition, partition_log, flusher, aside)

    def dispose(self, dropped: list[DroppedPartition]) -> None:
        """Stop, close and delete dropped partitions in the background (awaited by ``stop``)."""
        for item in dropped:
            future = asyncio.ensure_future(self._dispose(item))
            self._disposals.add(future)
            future.add_done_callback(self._disposals.discard)

    async def _dispose(self, item: DroppedPartition) -> None:
        try:
            if item.flusher is not None:
                try:
                    await item.flusher.stop()
                except Exception as exc:  # its files are going anyway
                    log.debug("%s-%d: final flush of a dropped partition: %s", item.topic, item.partition, exc)
            if item.aside is not None:
                # Unlinking leaves open descriptors readable: the files go at once.
                await _shielded_to_thread(lambda: incarnation.remove(item.aside))
            # A fetch that looked the log up just before may still send from its descriptors.
            await asyncio.sleep(self.retention_grace_s)
        finally:  # also when the broker stops meanwhile (``stop`` cancels this)
            if item.log is not None:
                item.log.discard()

    def _remove_later(self, path: Path | None) -> None:
        if path is None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            incarnation.remove(path)
            return
        future = asyncio.ensure_future(asyncio.to_thread(incarnation.remove, path))
        self._removals.add(future)
        future.add_done_callback(self._removals.discard)

    def remove_unserved(self, topic: str, data_path: str) -> None:
        """Delete a topic's directories left on disk that no log of it will ever use (this broker
        was down or missed the change): every one of a deleted topic; of a served topic, those of
        partitions beyond its count holding another incarnation's files (deleted, then created
        again with fewer partitions). A partition within the count is opened when asked, and its
        files checked then (``get_or_create_log``); files without a marker are kept."""
        served = self._served().get(topic)
        root = Path(data_path)
        if not root.is_dir():
            return
        for path in root.iterdir():
            name, sep, suffix = path.name.rpartition("-")
            if name != topic or not sep or not suffix.isdigit() or (topic, int(suffix)) in self._logs or not path.is_dir():
                continue
            if served is not None and (int(suffix) < served.num_partitions or incarnation.belongs(path, served.incarnation)):
                continue
            aside = incarnation.move_aside(path)
            log.info("%s: files of %s topic %s moved aside to %s, being deleted", path,
                     "deleted" if served is None else "an earlier incarnation of", topic, aside)
            self._remove_later(aside)

    # --- retention -----------------------------------------------------------------

    async def run_retention(self, topic: str, now: datetime | None = None) -> list[Path]:
        """One retention pass over a topic's open logs; returns the paths removed or archived."""
        return await self.run_retention_of([topic], now)

    async def run_retention_of(self, topics: list[str], now: datetime | None = None) -> list[Path]:
        """One retention pass over the open logs of ``topics``, in one walk over the broker's
        logs (however many topics are due at once); returns the paths removed or archived."""
        moment = (now or datetime.now()).timestamp()
        policies = {topic: parse_delete_policy(self.topic_config(topic).delete_policy) for topic in topics}
        cutoffs = {topic: moment - policy.seconds for topic, policy in policies.items()}
        detached: list[tuple[str, LogSegment]] = []
        for (log_topic, _partition), partition_log in list(self._logs.items()):
            cutoff = cutoffs.get(log_topic)
            if cutoff is not None:
                detached.extend((log_topic, segment) for segment in partition_log.detach_segments_older_than(cutoff))
        if not detached:
            return []
        try:
            await asyncio.sleep(self.retention_grace_s)
        finally:
            # Even when cancelled (broker stopping): the segments are already out of
            # their logs, so their files must go now rather than leak descriptors.
            results = await _shielded_to_thread(lambda: [dispose_segment(s, policies[t]) for t, s in detached])
        for topic in sorted({topic for topic, _segment in detached}):
            count = sum(1 for t, _segment in detached if t == topic)
            log.info("topic %s: retention (%s) removed %d segment(s)", topic, policies[topic].kind, count)
        return results

    async def _retention_sweeps(self, schedules: dict[str, QuartzCron]) -> None:
        """Every topic's ``deleteWhen`` from one task: a heap of (next time, topic); it sleeps
        until the earliest, then runs one pass over every topic due (``run_retention_of``).
        Not a task per topic: a thousand topics firing at the same hour walked every log of the
        broker a thousand times."""
        now = datetime.now()
        due_at = [(cron.next_fire_after(now), topic) for topic, cron in schedules.items()]
        heapq.heapify(due_at)
        while due_at:
            await asyncio.sleep(max(0.0, (due_at[0][0] - datetime.now()).total_seconds()))
            now = datetime.now()
            due: list[str] = []
            while due_at and due_at[0][0] <= now:
                topic = heapq.heappop(due_at)[1]
                due.append(topic)
                heapq.heappush(due_at, (schedules[topic].next_fire_after(now), topic))
            if not due:
                continue  # woke a moment early (the loop's clock is not the wall clock)
            try:
                await self.run_retention_of(due)
            except Exception:
                log.exception("retention pass of %s failed", ", ".join(due))

    def _schedule_retention(self) -> None:
        """(Re)start the one retention task from every topic's deleteWhen."""
        # Validate everything before touching the running task: a bad expression
        # fails the reload or the start with a clear error, the old schedule intact.
        schedules = {}
        for topic, config in self._served().items():
            # ConfigError: `metaq broker` then exits with one line naming the key, no traceback.
            try:
                parse_delete_policy(config.delete_policy)
            except ValueError as exc:
                raise ConfigError(f"topic {topic}: deletePolicy: {exc}") from None
            try:
                schedules[topic] = QuartzCron(config.delete_when)
            except ValueError as exc:
                raise ConfigError(f"topic {topic}: deleteWhen: {exc}") from None
        if self._retention_task is not None:
            self._retention_task.cancel()
        self._retention_task = asyncio.get_running_loop().create_task(self._retention_sweeps(schedules), name="retention")

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start flushers and retention schedules (needs a running event loop)."""
        self._schedule_retention()
        self._started = True
        for partition_log in self._logs.values():
            _flusher_of(partition_log).start(self.flush_scheduler)

    async def stop(self) -> None:
        """Stop retention, then stop every flusher with a final flush."""
        self._started = False
        tasks, self._retention_task = [self._retention_task] if self._retention_task is not None else [], None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # All at once: each final fsync runs in a worker thread, so the stop takes about as long
        # as the slowest few, not one fsync per dirty partition after another (2,000 dirty logs
        # took 19 s one by one on a loaded disk).
        flushers = [(key, _flusher_of(partition_log)) for key, partition_log in self._logs.items()]
        outcomes = await asyncio.gather(*(flusher.stop() for _key, flusher in flushers), return_exceptions=True)
        for (key, _flusher), outcome in zip(flushers, outcomes):
            if isinstance(outcome, Exception):
                log.error("%s-%d: final flush failed: %r", *key, outcome)
        disposals = list(self._disposals)
        for future in disposals:
            future.cancel()  # only their grace period is cut short; their logs are closed
        await asyncio.gather(*disposals, *self._removals, return_exceptions=True)

    def close(self) -> None:
        for partition_log in self._logs.values():
            partition_log.close()
        self._logs.clear()


def _flusher_of(partition_log: PartitionLog | RefusedLog) -> LogFlusher:
    """The flusher of a log in the store's map (``_register`` gave it one)."""
    flusher = partition_log.flusher
    assert flusher is not None, f"{partition_log.directory}: a log in the store's map has a flusher"
    return flusher


def dropped_partitions(old: Mapping[str, TopicConfig], new: Mapping[str, TopicConfig]) -> list[tuple[str, int, Path]]:
    """``(topic, partition, directory)`` of each partition ``old`` has and ``new`` has not.

    A topic whose incarnation ended (``incarnation.ended``: deleted, or re-created in between)
    loses all of its partitions: the new one starts empty.
    """
    gone = []
    for topic, before in old.items():
        after = new.get(topic)
        keep = 0 if after is None or incarnation.ended(before, after) else after.num_partitions
        gone += [(topic, p, Path(before.data_path) / f"{topic}-{p}") for p in range(keep, before.num_partitions)]
    return gone


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
