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
import time
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
    #: "corrupt": a record inside fails its checks; "torn": the last segment ends in an
    #: incomplete record (normal after a crash: recovery cuts it at start).
    kind: str = "corrupt"


@dataclass
class PartitionReport:
    partition: str  # the directory name, ``{topic}-{n}``
    segments: int = 0
    bytes_checked: int = 0
    bad: list[BadRange] = field(default_factory=list)
    error: str | None = None  # the files cannot form a log at all (gap, overlap, unreadable)

    @property
    def ok(self) -> bool:
        return self.error is None and not any(bad.kind == "corrupt" for bad in self.bad)

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
            if expected is not None and start != expected:
                kind = "gap" if start > expected else "overlap"
                report.error = (f"segments are not contiguous ({kind}): the previous segment ends at {expected},"
                                f" {path.name} starts at {start}")
            bad = first_bad_offset(_file_reader(fd, start), start, start + size)
        finally:
            os.close(fd)
        report.segments += 1
        report.bytes_checked += size
        if bad is not None:
            last = i == len(paths) - 1
            report.bad.append(BadRange(bad, start + size, path.name, "torn" if last and _is_torn_tail(path, start, bad) else "corrupt"))
        expected = start + size
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

    def start(self) -> None:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="scrub")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            try:
                await self.scrub_pass()
            except asyncio.CancelledError:
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
                bad = await asyncio.to_thread(self._check_segment, segment.path, segment.start, segment.size)
                self.stats.segments_checked += 1
                self.stats.bytes_checked += segment.size
                if bad is not None and segment in partition_log.segments and not segment.closed:
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
            if os.fstat(fd).st_size < size:
                return None  # cut since the list was taken: not ours to judge
            return first_bad_offset(_file_reader(fd, start), start, start + size, self._pace)
        finally:
            os.close(fd)

    def _pace(self, nbytes: int) -> None:
        if self.bytes_per_second > 0:
            time.sleep(nbytes / self.bytes_per_second)

    def _found(self, topic: str, partition: int, partition_log: "PartitionLog", start: int, end: int) -> None:
        if not partition_log.mark_corrupt(start, end):
            return
        self.stats.found.setdefault(f"{topic}-{partition}", []).append((start, end))
        log.error(
            "scrub: %s-%d: corrupt bytes in [%d, %d) (a record fails its CRC check in a sealed segment);"
            " they are not served until repaired: a slave re-fetches them from its master, a master"
            " asks its slaves (docs/operations.md, 'Corruption')",
            topic, partition, start, end,
        )
