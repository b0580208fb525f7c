"""The log of one topic-partition: an ordered run of segments in ``{dataPath}/{topic}-{n}``.

Offsets are absolute byte positions, so the whole log is one address space cut into
files; there is no offset index, a lookup is a bisection over the segments' start offsets
(as in MetaQ). Only the last segment (the *active* one) is written. Each segment has a
sparse time index (``timeindex.py``) for ``offset_for_time``; it is derived from the
segment's bytes, and every method that changes those bytes keeps it exact (appends and
rolls extend and seal it, truncation cuts it, a repair rebuilds it, retention removes it).

Invariants, checked on open and kept by every method:

* segments are contiguous: ``segments[i].end == segments[i + 1].start``;
* only the last segment is writable, and there is always at least one segment;
* ``min_offset <= flushed_end <= log_end``; ``flushed_end`` only grows, except that
  ``truncate_to`` lowers it together with ``log_end`` (and a full reset restarts it);
* bytes are never silently dropped: a corrupt tail found at start and bytes removed by
  ``truncate_to`` / ``truncate_fully_and_start_at`` are copied aside into the partition
  directory (and fsynced) before they are cut; only retention deletes, by policy;
* offsets are never reused after bytes vanished outside the broker: segment files that
  end before the flushed-end checkpoint (``checkpoint.py``) refuse to open, and an open
  segment whose file was unlinked refuses appends (checked after every write, on
  flush, on roll and by ``check_files``), so no put is acked for bytes that live only
  in an unlinked inode.

Threads: everything runs on the event-loop thread except ``flush``, which may run in a
worker thread. So the segment list is only ever changed by the event-loop thread.
``flush`` works on a snapshot of it taken under ``_structure_lock``; the methods that
close segments (truncation, retention, close) take the same lock, so a worker never
fsyncs a closed (or, worse, reused) descriptor. Appends and rolls need no lock: they
only grow the list.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from metaq import record
from metaq.private_files import DIR_MODE, FILE_MODE, fsync_directory, make_private_dir
from metaq.store.checkpoint import checkpoint_path, read_flushed_end, write_flushed_end
from metaq.store.timeindex import first_record_at_or_after
from metaq.store.segment import (
    LogSegment,
    parse_segment_start,
    segment_file_name,
)

log = logging.getLogger(__name__)

#: A directory mtime at least this old is settled: no deletion can still leave it unchanged
#: (file times come from a coarse kernel clock, a few ms).
FILES_SETTLED_NS = 1_000_000_000

_COPY_CHUNK = 4 * 1024 * 1024
#: How often flushes raise the flushed-end checkpoint at most (close always writes it):
#: one small fsync a second instead of one per group commit.
CHECKPOINT_INTERVAL_S = 1.0
#: A time lookup whose segment's index was being cut or removed while it was built starts
#: again; after this many tries it fails (the caller answers 500 and the reader asks again).
_LOOKUP_ATTEMPTS = 5


class OffsetOutOfRange(LookupError):
    """An offset below the oldest retained byte or beyond the end of the log."""

    def __init__(self, offset: int, min_offset: int, log_end: int, where: str = "") -> None:
        self.offset, self.min_offset, self.log_end = offset, min_offset, log_end
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}offset {offset} is out of range [{min_offset}, {log_end}]")


class LogCorruptError(RuntimeError):
    """The segment files on disk cannot form the log (gaps, overlaps, lost bytes)."""

    def __init__(self, message: str, known_end: int) -> None:
        super().__init__(message)
        #: The largest log end the broker had: offsets below it must not be reused.
        self.known_end = known_end


class LogWentBackwards(LogCorruptError):
    """The segment files end before the flushed end the broker last checkpointed."""


class SegmentVanished(OSError):
    """A segment file of the open log was deleted: its bytes live only in an unlinked inode."""


class CorruptRange(OSError):
    """A read reached bytes known to be corrupt (found by the scrub or by recovery): never served."""

    def __init__(self, where: str, start: int, end: int, offset: int) -> None:
        self.start, self.end, self.offset = start, end, offset
        super().__init__(
            errno.EIO,
            f"{where}: offset {offset} is in a corrupt byte range [{start}, {end}) (a record fails its CRC"
            " check); it is not served: read it from another replica (see 'metaq verify')",
        )


def _timestamp() -> str:
    """Sortable wall-clock stamp for files moved aside (milliseconds, to avoid collisions)."""
    now = time.time()
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f"-{int(now * 1000) % 1000:03d}"


def _create_aside_file(path: Path) -> tuple[Path, int]:
    """Open a new file for bytes moved aside; never overwrites an earlier one."""
    candidate, n = path, 0
    while True:
        try:
            return candidate, os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        except FileExistsError:
            n += 1
            candidate = path.with_name(f"{path.name}.{n}")


def _copy_out(segment: LogSegment, offset: int, out_fd: int) -> int:
    """Append ``segment``'s bytes from absolute ``offset`` to its end onto ``out_fd``."""
    copied = 0
    while offset + copied < segment.end:
        chunk = segment.read(offset + copied, _COPY_CHUNK)
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            view = view[os.write(out_fd, view) :]
        copied += len(chunk)
    return copied


def _save_aside(path: Path, segments: list[LogSegment], offset: int) -> tuple[Path, int]:
    """Copy every byte from ``offset`` on (across ``segments``) into a new file; fsync it.

    Called before bytes are cut from the log, so that nothing is lost silently.
    Returns the file's path (``path`` or a numbered variant) and the byte count.
    """
    aside_path, fd = _create_aside_file(path)
    try:
        copied = sum(_copy_out(seg, max(offset, seg.start), fd) for seg in segments if seg.end > offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_directory(path.parent)
    return aside_path, copied


def lay_out_empty_log(directory: Path, start_offset: int) -> list[Path]:
    """A new log's directory and first (empty) segment file, not yet durable: returns what the
    caller must fsync, before it fsyncs the directory's parent (``MessageStoreManager.create_logs``
    does both for many logs at once). ``PartitionLog`` then opens it as an existing log."""
    directory.mkdir(mode=DIR_MODE, exist_ok=True)
    segment = LogSegment.create(directory, start_offset)
    segment.close()
    return [segment.path, directory]


class PartitionLog:
    def __init__(
        self,
        directory: Path,
        *,
        max_segment_size: int,
        start_offset: int = 0,
        max_message_size: int = record.DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        if max_segment_size <= 0:
            raise ValueError(f"max_segment_size must be positive, got {max_segment_size}")
        if start_offset < 0:
            raise ValueError(f"start_offset must be >= 0, got {start_offset}")
        self.directory = Path(directory)
        self.max_segment_size = max_segment_size
        self.max_message_size = max_message_size
        #: Its flusher (metaq/store/flush.py's ``LogFlusher``, loosely typed: flush.py imports
        #: this module), set by the store that opened it (``MessageStoreManager._register``):
        #: the flusher goes wherever the log goes. None for a log opened without a store.
        self.flusher: Any = None
        self._structure_lock = threading.Lock()
        # A new segment file's directory entry must be fsynced too; flush() does it.
        # Versions, not a flag: a roll during a flush in another thread must not be
        # marked synced by that flush.
        self._directory_version = 0
        self._directory_synced_version = 0
        make_private_dir(self.directory)
        #: Byte ranges ``(start, end)`` known corrupt (``mark_corrupt``: recovery, the scrub),
        #: sorted. Invariant: ``file_range`` never returns a range that overlaps one, so no
        #: reader (consumer, slave fetch, checksum) ever gets these bytes.
        self.corrupt_ranges: list[tuple[int, int]] = []
        self._segments = self._load_segments()
        checkpointed = self._refuse_if_shorter_than_flushed()
        if not self._segments:
            self._segments = [LogSegment.create(self.directory, start_offset)]
            self._directory_version += 1
        else:
            self._recover_tail(checkpointed or 0)
        # What survived a crash of this process is in the page cache, not necessarily on
        # disk; sync it once so that flushed_end can honestly start at log_end.
        for segment in self._segments:
            segment.flush()
        self._flushed_end = self.log_end
        #: Why appends are refused (a segment file vanished), or None.
        self._vanished: SegmentVanished | None = None
        #: The directory's mtime when ``check_files`` last found every segment file (None: not settled).
        self._files_checked_mtime: int | None = None
        self._checkpointed = checkpointed if checkpointed is not None else 0
        self._checkpointed_at = time.monotonic()
        if checkpointed != self._flushed_end:
            self._save_checkpoint(self._flushed_end)

    # --- opening -------------------------------------------------------------------

    def _load_segments(self) -> list[LogSegment]:
        paths = sorted(
            (p for p in self.directory.iterdir() if parse_segment_start(p) is not None),
            key=parse_segment_start,
        )
        segments: list[LogSegment] = []
        try:
            for i, path in enumerate(paths):
                segments.append(LogSegment.open(path, read_only=i < len(paths) - 1))
            for prev, nxt in zip(segments, segments[1:]):
                if prev.end < nxt.start:
                    self._claim_missing_bytes(prev, nxt.start)
                elif prev.end > nxt.start:
                    raise LogCorruptError(
                        f"{self.directory}: segments are not contiguous (overlap): {prev.path.name} "
                        f"holds {prev.size} bytes and ends at offset {prev.end}, but the next file "
                        f"{nxt.path.name} starts at {nxt.start}. The partition is not served; move the"
                        f" file that does not belong out (a slave's files are byte-identical) and restart the broker",
                        max(segment.end for segment in segments),
                    )
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        return segments

    def _claim_missing_bytes(self, sealed: LogSegment, end: int) -> None:
        """A sealed segment's file ends before the next one starts (cut short, or a later
        file lost, outside the broker): the missing bytes are a corrupt range like a bit
        flip's (metaq/store/scrub.py), from the last whole record to ``end``. Never served; a
        slave cuts its log there and fetches them again, a master puts them back from a slave
        (metaq/ha/repair.py). Offsets keep their meaning: the segment still ends at ``end``."""
        valid_end = self._valid_end(sealed)
        sealed.claim_missing_tail(end)
        self.mark_corrupt(valid_end, end)
        log.error(
            "%s: %d bytes [%d, %d) are missing (its whole records end at %d, the next segment starts at %d): not served"
            " until repaired (a slave re-fetches them from its master, a master asks its slaves; docs/operations.md,"
            " 'Corruption')", sealed.path, end - valid_end, valid_end, end, valid_end, end,
        )

    def _refuse_if_shorter_than_flushed(self) -> int | None:
        """Raise LogWentBackwards if the files lost flushed bytes; return the checkpoint."""
        expected = read_flushed_end(self.directory)
        found = self._segments[-1].end if self._segments else 0
        if expected is None or found >= expected:
            return expected
        for segment in self._segments:
            segment.close()
        what = f"its segment files end at offset {found}" if self._segments else "it has no segment files"
        raise LogWentBackwards(
            f"{self.directory}: log end went backwards: offsets up to {expected} were flushed, but {what}"
            f" (segment files deleted or cut outside the broker). The partition is not served, so"
            f" offsets {found}..{expected} are not reused. To recover, restore the missing segment files"
            f" (a slave's are byte-identical at the same offsets), or accept the loss by deleting"
            f" {checkpoint_path(self.directory)}; then restart the broker",
            expected,
        )

    def _valid_end(self, segment: LogSegment, start: int | None = None) -> int:
        """Absolute offset where the whole, CRC-valid records of ``segment`` (from ``start``) end."""
        # No length limit: a record written under a larger maxMessageSize is still a
        # good record, and a garbage length is caught by the end of the file or the CRC.
        valid_end = segment.start if start is None else start
        for run in record.walk_records(segment.read, valid_end, segment.end):
            valid_end = run.end
        return valid_end

    def _recover_tail(self, checkpointed: int) -> None:
        """CRC-scan the active segment; move a torn or corrupt tail aside and cut it off.

        Bytes below the flushed-end checkpoint were fsynced, so they cannot be a torn
        write: a bad record there is corruption (a bit flip in the middle of the log), and
        cutting there would throw away every good record after it. That range is marked
        corrupt instead (never served; a slave re-fetches it, see metaq/store/scrub.py), and
        only what follows the checkpoint is scanned as the tail.
        """
        active = self._segments[-1]
        valid_end = self._valid_end(active)
        if valid_end == active.end:
            return
        if valid_end < checkpointed <= active.end:
            self.mark_corrupt(valid_end, checkpointed)
            log.error(
                "%s: records in [%d, %d) fail their CRC check below the flushed end %d: corruption, not a"
                " torn write; the range is not served (a slave re-fetches it from its master; on a master"
                " see docs/operations.md, 'Corruption')",
                active.path, valid_end, checkpointed, checkpointed,
            )
            valid_end = self._valid_end(active, checkpointed)
            if valid_end == active.end:
                return
        aside_path, bad = _save_aside(
            self.directory / f"{segment_file_name(active.start)}.corrupt-{_timestamp()}", [active], valid_end
        )
        active.truncate(valid_end - active.start)
        active.time_index.truncate(valid_end)
        active.flush()
        log.warning(
            "%s: truncated a torn or corrupt tail of %d bytes at offset %d; the bytes were moved to %s",
            active.path,
            bad,
            valid_end,
            aside_path,
        )

    # --- positions -----------------------------------------------------------------

    @property
    def segments(self) -> list[LogSegment]:
        return list(self._segments)

    @property
    def min_offset(self) -> int:
        return self._segments[0].start

    @property
    def log_end(self) -> int:
        active = self._segments[-1]
        return active.start + active.size  # its ``end`` (asked several times per request)

    @property
    def flushed_end(self) -> int:
        return self._flushed_end

    def _segment_index(self, segments: list[LogSegment], offset: int) -> int:
        """Index of the segment holding ``offset`` (the active one for ``log_end``).

        At a boundary the later segment wins, because a segment's ``end`` is the next
        one's ``start``. Caller has checked ``min_offset <= offset <= log_end``.
        """
        if offset >= segments[-1].start:
            return len(segments) - 1  # the active segment: what puts and replica fetches read
        return bisect.bisect_right(segments, offset, key=lambda s: s.start) - 1

    def mark_corrupt(self, start: int, end: int) -> bool:
        """Record ``[start, end)`` as corrupt (reads of it fail with CorruptRange); False if already known."""
        if any(s <= start and end <= e for s, e in self.corrupt_ranges):
            return False
        self.corrupt_ranges = sorted([*self.corrupt_ranges, (start, end)])
        return True

    def corrupt_end_at(self, offset: int) -> int | None:
        """The end of the corrupt range that holds ``offset``, or None (a walk of the log's
        records that stops there goes on after it: metaq/txn/rebuild.py). Inside it too: a
        transaction snapshot taken before a segment was cut short may stand in its middle."""
        return next((end for start, end in self.corrupt_ranges if start <= offset < end), None)

    def mark_if_corrupt_record(self, offset: int) -> bool:
        """Whether the record at ``offset`` of a sealed segment fails its checks (a flip the
        scrub has not reached yet); then ``[offset, the segment's end)`` is marked corrupt, as
        the scrub would. For a walk of the records that stopped there at start
        (metaq/server/partitions.py): corruption, never a torn batch to cut."""
        segments = self._segments
        if not segments[0].start <= offset < segments[-1].start:
            return False  # the active segment was CRC-scanned at open (``_recover_tail``)
        segment = segments[self._segment_index(segments, offset)]
        header = segment.read(offset, record.HEADER_SIZE)
        length = record.HEADER.unpack(header)[0] if len(header) == record.HEADER_SIZE else -1
        if length >= 0 and record.valid_prefix(segment.read(offset, record.HEADER_SIZE + length)) > 0:
            return False
        self.mark_corrupt(offset, segment.end)
        log.error("%s: the record at %d fails its checks in a sealed segment: bytes [%d, %d) are not served until"
                  " repaired", self.directory, offset, offset, segment.end)
        return True

    def first_corrupt_offset(self) -> int | None:
        return self.corrupt_ranges[0][0] if self.corrupt_ranges else None

    def repair_corrupt(self, start: int, data: bytes) -> bool:
        """Put a corrupt range's bytes back from a replica (a master's repair); False if refused.

        ``data`` must be exactly the range ``[start, end)`` marked corrupt, and whole records
        that pass every check: a replica's log is a byte-identical prefix of ours at the same
        offsets, so these are the bytes that were written. The range stays marked (unserved)
        until they are fsynced.
        """
        end = start + len(data)
        if (start, end) not in self.corrupt_ranges or record.valid_prefix(data) != len(data):
            return False
        with self._structure_lock:
            segments = self._segments
            if not segments or start < segments[0].start or end > segments[-1].end:
                return False
            segment = segments[self._segment_index(segments, start)]
            if end > segment.end or segment.closed:
                return False
            segment.restore(start, data)
            segment.flush()
            segment.time_index.invalidate()  # rebuilt from the repaired bytes on first use
            self.corrupt_ranges = [r for r in self.corrupt_ranges if r != (start, end)]
        log.warning("%s: corrupt bytes [%d, %d) restored from a replica", self.directory, start, end)
        return True

    def _drop_corrupt_from(self, offset: int) -> None:
        """Bytes at and after ``offset`` are gone (truncation): so are their corrupt marks."""
        self.corrupt_ranges = [(s, min(e, offset)) for s, e in self.corrupt_ranges if s < offset]

    def _check_offset(self, segments: list[LogSegment], offset: int) -> None:
        if offset < segments[0].start or offset > segments[-1].end:
            raise OffsetOutOfRange(offset, segments[0].start, segments[-1].end, str(self.directory.name))

    # --- writing -------------------------------------------------------------------

    def append(self, records: bytes | bytearray | memoryview) -> int:
        """Append a validated buffer of whole records; return the offset it starts at.

        The batch goes into one segment whole: the roll happens before the write, so a
        segment may exceed ``max_segment_size`` by at most one batch.
        """
        if self._vanished is not None:
            raise self._vanished
        active = self._segments[-1]
        if len(records) == 0:
            return active.end
        if active.size >= self.max_segment_size:
            active = self._roll()
        offset = active.append(records)
        # After the write, so a delete racing with it is seen too: the bytes are taken
        # back and the put fails rather than being acked from an unlinked inode.
        if not active.linked():
            active.truncate(offset - active.start)
            raise self._note_vanished(active)
        active.time_index.on_append(offset, records)
        return offset

    def _roll(self) -> LogSegment:
        old = self._segments[-1]
        if not old.linked():
            raise self._note_vanished(old)
        # The old segment is not fsynced here, on the event loop: flush() syncs every
        # segment that ends past flushed_end, so rolled-but-unsynced bytes are covered.
        old.read_only = True
        old.time_index.seal(old.end)
        new = LogSegment.create(self.directory, old.end)
        self._segments.append(new)
        self._directory_version += 1
        log.info("%s: rolled to a new segment %s", self.directory, new.path.name)
        return new

    def flush(self) -> int:
        """fsync everything appended so far; return the new ``flushed_end``.

        Safe in a worker thread while the event loop appends: the target is taken
        before the fsyncs, so bytes appended meanwhile are left for the next flush.
        """
        with self._structure_lock:
            segments = list(self._segments)
            target = segments[-1].end
            for segment in segments:
                if segment.end > self._flushed_end and not segment.closed:
                    segment.flush()
                    segment.time_index.flush()
                    if not segment.linked():
                        # The fsync went to an unlinked inode: nothing it covered is durable.
                        raise self._note_vanished(segment)
            directory_version = self._directory_version
            if directory_version != self._directory_synced_version:
                fsync_directory(self.directory)
                self._directory_synced_version = directory_version
            if target > self._flushed_end:
                self._flushed_end = target
                if time.monotonic() - self._checkpointed_at >= CHECKPOINT_INTERVAL_S:
                    self._save_checkpoint(target)
            return self._flushed_end

    def check_files(self) -> None:
        """Refuse appends from now on if a segment file of the log was deleted (the flusher
        calls it periodically, so an idle partition is noticed too).

        Deleting a file changes its directory's mtime: while that has not changed since every
        segment was last found linked, one ``stat`` of the directory is the whole check, not
        an ``fstat`` per segment (a 100 GB log at 1 GiB segments: 100 per round, at 10,000
        partitions a million every ``unflushInterval``). An mtime younger than
        FILES_SETTLED_NS is not trusted: a deletion in the same clock tick would not move it."""
        if self._vanished is not None:
            return
        try:
            changed = os.stat(self.directory).st_mtime_ns
        except OSError:
            changed = None  # moved or gone: the descriptors say whether the files are
        if changed is not None and changed == self._files_checked_mtime:
            return
        for segment in self._segments:
            if not segment.closed and not segment.linked():
                self._note_vanished(segment)
                return
        settled = changed is not None and time.time_ns() - changed > FILES_SETTLED_NS
        self._files_checked_mtime = changed if settled else None

    def _note_vanished(self, segment: LogSegment) -> SegmentVanished:
        """Remember (and log, once) that ``segment``'s file is gone; return the error appends raise."""
        if self._vanished is None:
            message = (
                f"segment file {segment.path} was deleted while in use: {self.directory.name} refuses puts;"
                " restore the file and restart the broker"
            )
            self._vanished = SegmentVanished(errno.ENOENT, message)
            log.error(
                "%s; until the broker stops its bytes are readable at /proc/%d/fd/%d (copy them back to %s"
                " before restarting, or the partition will refuse to open as its log end went backwards)",
                message, os.getpid(), segment.fileno(), segment.path,
            )
        return self._vanished

    def _save_checkpoint(self, flushed_end: int) -> None:
        """Write the flushed-end checkpoint; lowering it is made durable before returning.

        Called under ``_structure_lock`` (or before the log is shared, on open), so a
        flush in a worker thread and a truncation never write it at the same time.
        """
        write_flushed_end(self.directory, flushed_end, durable=flushed_end < self._checkpointed)
        self._checkpointed = flushed_end
        self._checkpointed_at = time.monotonic()

    def _lower_checkpoint(self, offset: int) -> None:
        """Before bytes at and after ``offset`` are cut: the checkpoint must not claim them."""
        if offset < self._checkpointed:
            self._save_checkpoint(offset)

    def truncate_to(self, offset: int) -> Path | None:
        """Remove every byte at and after ``offset`` (a record boundary), keeping a copy.

        For a returning master whose tail diverged from the new master's log. The removed
        bytes go to ``truncated-{offset:020d}-{timestamp}.meta`` in the partition
        directory (returned), which is fsynced before anything is cut. Returns None if
        ``offset == log_end``.
        """
        with self._structure_lock:
            segments = self._segments
            self._check_offset(segments, offset)
            if offset == segments[-1].end:
                return None
            index = self._segment_index(segments, offset)
            self._check_record_boundary(segments[index], offset)
            aside_path, copied = _save_aside(self._truncated_path(offset), segments[index:], offset)
            self._lower_checkpoint(offset)
            for seg in segments[index + 1 :]:
                seg.close()
                seg.path.unlink()
                seg.time_index.remove()
            kept = segments[index]
            kept.truncate(offset - kept.start)
            kept.time_index.truncate(offset)
            kept.read_only = False
            kept.flush()
            self._segments = segments[: index + 1]
            fsync_directory(self.directory)
            self._flushed_end = min(self._flushed_end, offset)
            self._drop_corrupt_from(offset)
        log.warning("%s: truncated to offset %d; %d bytes moved to %s", self.directory, offset, copied, aside_path)
        return aside_path

    def truncate_fully_and_start_at(self, offset: int) -> Path | None:
        """Drop the whole log and restart it empty at ``offset`` (Kafka's name for it).

        For a replica whose log cannot be a prefix of its master's any more, e.g. it
        ends before the master's oldest retained offset. The old bytes are saved like
        ``truncate_to``'s (returned path; None if the log was empty).
        """
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        with self._structure_lock:
            segments = self._segments
            aside_path = None
            if segments[-1].end > segments[0].start:
                aside_path, _ = _save_aside(self._truncated_path(segments[0].start), segments, segments[0].start)
            self._lower_checkpoint(offset)
            for seg in segments:
                seg.close()
                seg.path.unlink()
                seg.time_index.remove()
            self._segments = [LogSegment.create(self.directory, offset)]
            fsync_directory(self.directory)
            self._flushed_end = offset
            self.corrupt_ranges = []
        log.warning("%s: log reset to start at offset %d; old bytes moved to %s", self.directory, offset, aside_path)
        return aside_path

    def _truncated_path(self, offset: int) -> Path:
        return self.directory / f"truncated-{offset:020d}-{_timestamp()}.meta"

    def _check_record_boundary(self, segment: LogSegment, offset: int) -> None:
        """Cheap sanity check: a valid record must start at ``offset``.

        Not a proof (that needs a scan from the segment start), but it refuses the
        common mistake of passing a position inside a record.
        """
        if offset == segment.start or any(start == offset for start, _ in self.corrupt_ranges):
            return  # a corrupt range starts where a CRC walk found the last good record's end
        header = segment.read(offset, record.HEADER_SIZE)
        if len(header) == record.HEADER_SIZE:
            length = record.HEADER.unpack(header)[0]
            if 0 <= length and record.valid_prefix(segment.read(offset, record.HEADER_SIZE + length)) > 0:
                return
        raise ValueError(f"{self.directory}: offset {offset} is not the start of a record")

    # --- reading -------------------------------------------------------------------

    def file_range(self, offset: int, max_bytes: int, upto: int | None = None) -> tuple[LogSegment, int, int]:
        """``(segment, position in its file, length)`` of the bytes a fetch at ``offset`` gets.

        The range stays inside one segment, holds at most ``max_bytes`` and ends at or
        before ``upto`` (default ``log_end``; a replica passes its committed offset).
        Length 0 at or after the end. Raises OffsetOutOfRange outside [min_offset, log_end].
        """
        segments = self._segments
        self._check_offset(segments, offset)
        segment = segments[self._segment_index(segments, offset)]
        limit = segment.end if upto is None else min(upto, segment.end)
        for bad_start, bad_end in self.corrupt_ranges:
            if bad_start <= offset < bad_end:
                raise CorruptRange(self.directory.name, bad_start, bad_end, offset)
            if offset < bad_start:
                limit = min(limit, bad_start)  # the good bytes before it are served, then the error
                break
        length = max(0, min(max_bytes, limit - offset))
        return segment, offset - segment.start, length

    def read(self, offset: int, max_bytes: int, upto: int | None = None) -> bytes:
        """The bytes ``file_range`` describes (may end inside a record, as in MetaQ)."""
        segment, position, length = self.file_range(offset, max_bytes, upto)
        return segment.read(segment.start + position, length) if length else b""

    def read_as_stored(self, offset: int, max_bytes: int) -> bytes:
        """Like ``read``, corrupt ranges included: only for state the broker derives from its
        own log at start (transactions, producers), which must open also when a range is bad
        (the range itself stays unserved; a slave cuts and re-fetches it, see
        metaq/server/partitions.py ``Partition.truncate_corrupt``)."""
        segments = self._segments
        self._check_offset(segments, offset)
        segment = segments[self._segment_index(segments, offset)]
        return segment.read(offset, max(0, min(max_bytes, segment.end - offset)))

    def crc32(self, start: int, end: int) -> int:
        """CRC32 of the log bytes in [start, end) (for comparing replicas; may run in a worker thread)."""
        crc, pos = 0, start
        while pos < end:
            data = self.read(pos, end - pos, end)
            if not data:
                break
            crc = zlib.crc32(data, crc)
            pos += len(data)
        return crc

    def nearest_offset(self, offset: int) -> int:
        """MetaQ's ``offset`` command: the start of the segment holding ``offset``, clamped."""
        segments = self._segments
        if offset < segments[0].start:
            return segments[0].start
        if offset >= segments[-1].end:
            return segments[-1].end
        return segments[self._segment_index(segments, offset)].start

    def record_start_at_or_after(self, offset: int) -> int:
        """The first record start at or after ``offset``: ``offset`` itself when a record starts
        there, the log start before it, the log end at or past it, the end of a corrupt range
        holding it. For the ``offset`` request's ``realign`` (a consumer position that may have
        fallen inside a record, docs/client.md "Realigning a position").

        Walks record lengths from the segment's time-index entry at or before ``offset`` (a
        record start; entries are at most ``MAX_UNINDEXED_APPEND`` plus one record apart), never
        a whole segment, under ``_structure_lock`` as ``offset_for_time``; a segment whose index
        is not checked yet is checked (or rebuilt) first, without the lock. For a worker thread.
        """
        for _attempt in range(_LOOKUP_ATTEMPTS):
            with self._structure_lock:
                segments = self._segments
                if offset <= segments[0].start or offset >= segments[-1].end:
                    return segments[0].start if offset <= segments[0].start else segments[-1].end
                bad_end = self.corrupt_end_at(offset)
                if bad_end is not None:
                    return bad_end
                segment = segments[self._segment_index(segments, offset)]
                if segment.time_index.ready:
                    entry = segment.time_index.record_start_at_or_before(offset)
                    return self._walk_to_record_start(segment, segment.start if entry is None else entry, offset)
                corrupt = list(self.corrupt_ranges)
            self._build_time_index(segment, corrupt)
        raise OSError(errno.EAGAIN, f"{self.directory.name}: the log kept changing under a time index build; ask again")

    @staticmethod
    def _walk_to_record_start(segment: LogSegment, start: int, offset: int) -> int:
        """The first record start at or after ``offset``, walking from ``start`` (one) in ``segment``;
        the segment's end (the next one's start) when the walk stops before (a damaged length)."""
        for run in record.walk_records(segment.read, start, segment.end, boundaries_only=True):
            if run.offset >= offset:
                return run.offset
            found = next((end for end in run.ends or () if end >= offset), None)
            if found is not None:
                return found
        return segment.end

    def offset_for_time(self, time_ms: int, upto: int | None = None) -> int | None:
        """The first offset below ``upto`` (default ``log_end``) of a record whose time (its msg
        id's timestamp part) is >= ``time_ms``; None when every record below ``upto`` is older.

        Record times only grow along a log (msgid.py), so the answer lies in the last segment
        whose first record is older than ``time_ms`` (or starts the next one): segments are
        told apart by their first record's header (read once per segment, kept in memory),
        then that one segment's index file is bisected and one index interval of its log
        walked, under ``_structure_lock`` (no segment it reads is closed under it). For a
        worker thread. The first lookup in a segment reads and checks its index file, rebuilding
        it from the segment if it is missing, torn or corrupt: that may read the whole segment,
        so it runs without the lock (``_build_time_index``), and the lookup then starts again.
        """
        for _attempt in range(_LOOKUP_ATTEMPTS):
            with self._structure_lock:
                segments = self._segments
                end = segments[-1].end if upto is None else min(upto, segments[-1].end)

                def first_time(segment: LogSegment) -> float:
                    found = segment.time_index.first_time(segment.read, segment.end)
                    return float("inf") if found is None else found

                i = bisect.bisect_left(segments, time_ms, key=first_time) - 1
                unbuilt = segments[i] if i >= 0 and not segments[i].time_index.ready else None
                if unbuilt is None:
                    answer = segments[0].start if i < 0 else self._offset_for_time_in(segments[i], time_ms)
                    if answer is None and 0 <= i < len(segments) - 1:
                        answer = segments[i + 1].start
                    bad_end = self.corrupt_end_at(answer) if answer is not None else None
                    if bad_end is not None:  # a segment's first record inside a corrupt range: never answered
                        answer = bad_end
                    return answer if answer is not None and answer < end else None
                corrupt = list(self.corrupt_ranges)
            self._build_time_index(unbuilt, corrupt)
        raise OSError(errno.EAGAIN, f"{self.directory.name}: the log kept changing under a time index build; ask again")

    def _build_time_index(self, segment: LogSegment, corrupt: list[tuple[int, int]]) -> None:
        """Check or rebuild ``segment``'s time index, without ``_structure_lock``: through a
        descriptor of its own (a truncation or retention may close the segment's meanwhile; the
        index then throws the build away, see ``SegmentTimeIndex.ensure_ready``)."""
        try:
            fd = os.open(segment.path, os.O_RDONLY)
        except FileNotFoundError:
            return  # removed meanwhile: the next attempt picks the segment again
        try:
            def read(offset: int, length: int) -> bytes:
                return os.pread(fd, max(0, length), offset - segment.start)

            segment.time_index.ensure_ready(read, lambda: segment.end, lambda: segment.read_only, corrupt,
                                            self.directory.name)
        finally:
            os.close(fd)

    def _offset_for_time_in(self, segment: LogSegment, time_ms: int) -> int | None:
        low, high = segment.time_index.bracket(time_ms)
        found = first_record_at_or_after(
            segment.read, segment.start if low is None else low, segment.end if high is None else high,
            time_ms, self.corrupt_ranges,
        )
        return found if found is not None else high

    def last_msg_id(self) -> int:
        """msg_id of the last record in the log, 0 if it holds none (scans one segment)."""
        for segment in reversed(self._segments):
            last = self._last_record_start(segment)
            if last is not None:
                return record.HEADER.unpack(segment.read(last, record.HEADER_SIZE))[2]
        return 0

    def _last_record_start(self, segment: LogSegment) -> int | None:
        last_run = None
        for last_run in record.walk_records(segment.read, segment.start, segment.end, boundaries_only=True):
            pass
        if last_run is None:
            return None
        return last_run.ends[-2] if last_run.count > 1 else last_run.offset

    # --- retention -----------------------------------------------------------------

    def detach_segments_older_than(self, cutoff_mtime: float) -> list[LogSegment]:
        """Take the oldest read-only segments last modified before ``cutoff_mtime`` out of the log.

        Oldest first, stopping at the first segment that is too new (so the log stays
        contiguous), never the active one. The segments are returned still open: the
        caller disposes of their files and closes them, possibly after a grace period
        for reads in flight (a sendfile holds the descriptor, not the name).
        """
        with self._structure_lock:
            segments = self._segments
            count = 0
            for segment in segments[:-1]:
                if not segment.read_only or segment.mtime() >= cutoff_mtime:
                    break
                count += 1
            if count:
                self._segments = segments[count:]
                # A corrupt range in a segment that left is gone with it (not to be repaired).
                self.corrupt_ranges = [r for r in self.corrupt_ranges if r[1] > self._segments[0].start]
        return segments[:count]

    # --- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        with self._structure_lock:
            if self._flushed_end != self._checkpointed and not any(s.closed for s in self._segments):
                try:
                    self._save_checkpoint(self._flushed_end)
                except OSError as exc:  # closing must still close every descriptor
                    log.warning("%s: flushed-end checkpoint not written: %s", self.directory, exc)
            for segment in self._segments:
                if not segment.closed:
                    try:
                        segment.time_index.flush(everything=True)
                    except OSError as exc:  # derived data: the next lookup rebuilds what is missing
                        log.warning("%s: time index not written: %s", self.directory, exc)
                segment.close()

    def discard(self) -> None:
        """Close without writing anything (no checkpoint): the log's files are deleted, its topic was."""
        with self._structure_lock:
            for segment in self._segments:
                segment.close()

    def __repr__(self) -> str:
        return f"PartitionLog({self.directory}, [{self.min_offset}, {self.log_end}), flushed={self._flushed_end})"

