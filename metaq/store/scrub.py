"""Finding corrupt bytes in partition logs: the offline check and the broker's background scrub.

A record's CRC covers its payload, so a bit flipped on disk in a segment that was written
long ago shows as a record that fails its check. Recovery at start only scans the active
segment (only it can end in a torn write); sealed segments are checked here:

* ``check_partition_dir`` reads a partition directory without opening it as a log (so
  nothing on disk changes) and reports, per segment, where its valid records stop. It is
  ``metaq verify --data-dir`` (metaq/cli/verify.py), for a stopped broker.
* ``Scrubber`` runs in the broker: it re-reads every sealed segment of every open log at
  most ``scrubBytesPerSecond``, one pass every ``scrubIntervalMs``, and marks what fails as
  corrupt in the log (``PartitionLog.mark_corrupt``). From then on the broker never serves
  those bytes (a read gets ``CorruptRange``, naming topic, partition and offsets), a metric
  and an error line say so, and a slave repairs it: its replica truncates the log to the
  start of the range and fetches the master's bytes again (metaq/ha/replica.py), so its log
  stays a byte-identical prefix of the master's. A master asks its slaves for the bytes
  (metaq/ha/repair.py) and writes them back in place.

A bad range runs from the first record that fails to the end of its segment: after a bad
length nothing says where the next record starts, and segments start on record boundaries.

Not covered by any CRC, hence not found here: the 8-byte msg id and, partly, the flag of a
record's header (MetaQ's format checks only the payload); ``metaq verify --zk`` finds those by
comparing replicas byte for byte.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from metaq import record
from metaq.store.segment import parse_segment_start

if TYPE_CHECKING:
    from metaq.store.log import PartitionLog

log = logging.getLogger(__name__)

#: How much the scrub reads at a time (then sleeps to keep its rate).
SCRUB_CHUNK = 1024 * 1024


@dataclass
class BadRange:
    start: int
    end: int
    segment: str
    #: "corrupt": a record inside fails its checks; "missing": a sealed segment's file ends
    #: before the next segment starts (cut short outside the broker; served by no one, repaired
    #: like "corrupt"); "torn": the last segment ends in an incomplete record (normal after a
    #: crash: recovery cuts it at start).
    kind: str = "corrupt"


@dataclass
class PartitionReport:
    partition: str  # the directory name, ``{topic}-{n}``
    segments: int = 0
    bytes_checked: int = 0
    bad: list[BadRange] = field(default_factory=list)
    error: str | None = None  # the files cannot form a log at all (overlap, unreadable)

    @property
    def ok(self) -> bool:
        return self.error is None and all(bad.kind == "torn" for bad in self.bad)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def first_bad_offset(read: Callable[[int, int], bytes], start: int, end: int,
                     pace: Callable[[int], None] | None = None) -> int | None:
    """Where the valid records in [start, end) stop, or None if they fill it.

    ``pace(bytes)`` is called after each chunk read (the scrub sleeps there)."""
    valid_end = start
    for run in record.walk_records(read, start, end, chunk_size=SCRUB_CHUNK):
        valid_end = run.end
        if pace is not None:
            pace(len(run.data))
    return None if valid_end == end else valid_end


def _file_reader(fd: int, base: int) -> Callable[[int, int], bytes]:
    return lambda offset, length: os.pread(fd, length, offset - base)


def check_partition_dir(directory: Path) -> PartitionReport:
    """Check every segment of one partition directory, read-only (for ``metaq verify --data-dir``)."""
    report = PartitionReport(directory.name)
    paths = sorted((p for p in directory.iterdir() if parse_segment_start(p) is not None), key=parse_segment_start)
    expected: int | None = None
    for i, path in enumerate(paths):
        start = parse_segment_start(path)
        assert start is not None
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            report.error = f"{path.name}: cannot be read: {exc.strerror}"
            return report
        try:
            size = os.fstat(fd).st_size
            if expected is not None and start < expected:
                report.error = (f"segments are not contiguous (overlap): the previous segment ends at {expected},"
                                f" {path.name} starts at {start}")
            bad = first_bad_offset(_file_reader(fd, start), start, start + size)
        finally:
            os.close(fd)
        report.segments += 1
        report.bytes_checked += size
        end = start + size
        # The next segment's start is where this one must end: short of it, the rest is missing
        # (the broker marks the same range at open, PartitionLog._claim_missing_bytes).
        next_start = parse_segment_start(paths[i + 1]) if i + 1 < len(paths) else None
        if next_start is not None and next_start > end:
            report.bad.append(BadRange(end if bad is None else bad, next_start, path.name, "missing"))
        elif bad is not None:
            last = next_start is None
            report.bad.append(BadRange(bad, end, path.name, "torn" if last and _is_torn_tail(path, start, bad) else "corrupt"))
        expected = end
    return report


def _is_torn_tail(path: Path, start: int, bad: int) -> bool:
    """Whether the last segment merely ends inside a record (a write cut off by a crash)."""
    with open(path, "rb") as f:
        f.seek(bad - start)
        rest = f.read()
    if len(rest) < record.HEADER_SIZE:
        return True
    length = record.HEADER.unpack_from(rest)[0]
    return length >= 0 and record.HEADER_SIZE + length > len(rest)


def check_data_dir(data_dir: Path, topic: str | None = None) -> list[PartitionReport]:
    """Every partition directory under ``data_dir`` (``{topic}-{n}`` holding segment files)."""
    if not data_dir.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(data_dir))
    reports = []
    for directory in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        name, _, n = directory.name.rpartition("-")
        if not n.isdigit() or (topic is not None and name != topic):
            continue
        if any(parse_segment_start(p) is not None for p in directory.iterdir()):
            reports.append(check_partition_dir(directory))
    return reports


class ScrubHalted(Exception):
    """The broker is stopping: the segment being read is left unjudged."""


@dataclass
class ScrubStats:
    passes: int = 0
    segments_checked: int = 0
    bytes_checked: int = 0
    #: Corrupt ranges found, by ``topic-partition``: ``[(start, end), ...]`` (also after repair).
    found: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    @property
    def corrupt_ranges(self) -> int:
        return sum(len(ranges) for ranges in self.found.values())


class Scrubber:
    """Re-verifies the CRCs of every open log's sealed segments in the background.

    ``logs()`` gives the logs to check by ``(topic, partition)`` (the store's map, read on
    the event loop). Segments are read in a worker thread through a descriptor of their
    own, at most ``bytes_per_second``; a segment that left the log meanwhile (retention,
    truncation) is not judged by what was read of it.

    Stopping is bounded: ``stop`` sets ``_halt``, which the worker thread checks after every
    chunk (``SCRUB_CHUNK``) and waits on instead of sleeping, so the thread ends within one
    chunk's read however large the segment and however slow the pace. Cancelling the task
    alone would not do: the thread would go on reading the segment at the paced rate, and
    the process's exit waits for it (a 1 GiB segment at 8 MiB/s is two minutes).
    """

    def __init__(self, logs: Callable[[], dict[tuple[str, int], Any]], interval_ms: int, bytes_per_second: int) -> None:
        self.logs = logs
        self.interval_s = interval_ms / 1000
        self.bytes_per_second = bytes_per_second
        self.stats = ScrubStats()
        #: Called with (topic, partition, start, end) for every corrupt range known at the end
        #: of a pass over its log (the broker repairs a master's from its slaves).
        self.on_corrupt: Callable[[str, int, int, int], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._halt = threading.Event()
        #: The worker thread's read of the segment in progress (awaited by ``stop``).
        self._reading: asyncio.Future[int | None] | None = None

    def start(self) -> None:
        if self.interval_s > 0 and self._task is None:
            self._halt.clear()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="scrub")

    async def stop(self) -> None:
        task, self._task = self._task, None
        self._halt.set()  # before the cancel: the thread stops at its next chunk
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, ScrubHalted):
                pass
        reading, self._reading = self._reading, None
        if reading is not None:
            # The thread ends within one chunk now; waiting for it here keeps the read of a
            # segment from outliving the store's close (and the process's exit from waiting on it).
            await asyncio.gather(reading, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                await self.scrub_pass()
            except (asyncio.CancelledError, ScrubHalted):
                raise
            except Exception:  # the scrub is a safety net: it must not die on one odd file
                log.exception("scrub pass failed")
            await asyncio.sleep(self.interval_s)

    async def scrub_pass(self) -> None:
        """One pass over the sealed segments of every open log."""
        for (topic, partition), partition_log in sorted(self.logs().items()):
            for segment in list(getattr(partition_log, "segments", []))[:-1]:
                if segment.closed:
                    continue
                size = segment.size
                self._reading = asyncio.ensure_future(asyncio.to_thread(self._check_segment, segment.path, segment.start, size))
                bad = await asyncio.shield(self._reading)  # a cancel leaves the read to ``stop``
                self._reading = None
                self.stats.segments_checked += 1
                self.stats.bytes_checked += size
                # Judged only if the log still holds the segment sealed and as long as it was
                # (a truncation by the broker itself makes it the active one, shorter).
                if bad is not None and segment in partition_log.segments[:-1] and segment.size == size and not segment.closed:
                    self._found(topic, partition, partition_log, bad, segment.end)
            if self.on_corrupt is not None:
                # Every range still known (also recovery's, and one a repair could not fix
                # yet) is offered again each pass: a replica may have it by now.
                for start, end in list(getattr(partition_log, "corrupt_ranges", [])):
                    self.on_corrupt(topic, partition, start, end)
        self.stats.passes += 1

    def _check_segment(self, path: Path, start: int, size: int) -> int | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None  # removed by retention or truncation since the list was taken
        try:
            # A file shorter than the log says was cut outside the broker (at open, or since):
            # its bytes from the last whole record on are missing, a range like a corrupt one.
            on_disk = min(size, os.fstat(fd).st_size)
            bad = first_bad_offset(_file_reader(fd, start), start, start + on_disk, self._pace)
            return bad if bad is not None or on_disk == size else start + on_disk
        finally:
            os.close(fd)

    def _pace(self, nbytes: int) -> None:
        """After each chunk: keep the rate, and end the read at once when the broker stops."""
        if self.bytes_per_second > 0:
            halted = self._halt.wait(nbytes / self.bytes_per_second)
        else:
            halted = self._halt.is_set()
        if halted:
            raise ScrubHalted()

    def _found(self, topic: str, partition: int, partition_log: "PartitionLog", start: int, end: int) -> None:
        if not partition_log.mark_corrupt(start, end):
            return
        self.stats.found.setdefault(f"{topic}-{partition}", []).append((start, end))
        log.error(
            "scrub: %s-%d: corrupt or missing bytes in [%d, %d) (a record fails its CRC check in a sealed"
            " segment, or the segment's file was cut short);"
            " they are not served until repaired: a slave re-fetches them from its master, a master"
            " asks its slaves (docs/operations.md, 'Corruption')",
            topic, partition, start, end,
        )
