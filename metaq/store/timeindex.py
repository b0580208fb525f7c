"""The sparse time index of one segment: ``{dir}/{start:020d}.timeindex``.

Every record already carries a time: the timestamp part of its msg id (metaq/store/msgid.py),
a logical clock that never goes backwards, so within one partition log record times only
grow. The index maps times to offsets without reading the log: a list of entries
``(time ms, offset)``, each naming a record start and its time, at most one per
``interval`` bytes of log (Kafka's ``.timeindex`` and ``index.interval.bytes``).

Theory of operation
-------------------
*Where entries go.* An append (a put's batch on a master, a piece of a fetch reply on a
slave) gets an entry for its first record when ``interval`` bytes or more passed since the
last entry, without reading a record header beyond that first one: appending stays O(1)
per append. An append longer than ``MAX_UNINDEXED_APPEND`` is walked record by record and
gets an entry every ``interval`` bytes too, so two entries are never more than
``MAX_UNINDEXED_APPEND`` plus one record apart. A rebuild walks the segment with the same
per-record rule. The index is derived from the log's bytes by each replica and never
replicated: a master's and a slave's entries may sit at different records (their appends
are cut differently), and both are exact, because a lookup only relies on "entry = a record
start and its time".

*Lookup.* The first record whose time is >= T lies between the last entry older than T and
the next entry: one bisection over the entries, then a walk of one interval of the log
(``PartitionLog.offset_for_time``).

*File format.* A run of 20-byte entries, big-endian ``int64 time_ms, int64 offset (absolute),
uint32 crc32 of the 16 bytes before it``. A sealed segment's file ends with a seal entry
(time ``SEAL``, offset = the segment's end): the index is complete. The active segment's
file has no seal; its newest entries are kept in memory (``_pending``) and written on every
flush of the log, the roll and close.

*Descriptors.* No descriptor is kept open: the file is opened, written and closed on each
flush, and opened for a lookup. A broker with 10,000 partitions keeps its segment
descriptors and no more.

*States.* ``ready`` False: entries on disk are not trusted yet (at open, after a repair);
appends add none. The first lookup (``ensure_ready``) reads the file, keeps its valid
prefix, walks the segment from the last good entry to its end, rewrites the file if it
changed, and from then on appends add entries. A missing, torn or corrupt file is so
rebuilt on first use: logged and counted (``REBUILDS``).

Threads: appends and rolls run on the event loop, flushes and lookups in worker threads;
every change of the in-memory state and every write of the file happens under ``_lock``.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Callable, Iterable

from metaq import record
from metaq.private_files import FILE_MODE
from metaq.store.msgid import msg_id_timestamp_ms

log = logging.getLogger(__name__)

INDEX_SUFFIX = ".timeindex"
#: Bytes of log between two entries, at least (Kafka's ``index.interval.bytes``).
DEFAULT_INTERVAL = 4096
#: An append longer than this is indexed inside too (a slave's large fetch reply).
MAX_UNINDEXED_APPEND = 256 * 1024
#: The log's flushes write the active segment's new entries once this many are pending (one
#: small write per ~64 puts instead of one per flush); the roll and close write them all.
WRITE_AFTER_ENTRIES = 64
ENTRY = struct.Struct(">qqI")
ENTRY_SIZE = ENTRY.size  # 20
_PAYLOAD = struct.Struct(">qq")
_MSG_ID = struct.Struct(">q")
_LENGTH = struct.Struct(">i")
#: The time field of the seal entry that ends a sealed segment's file.
SEAL = -1


class RebuildCounter:
    """How many index files were rebuilt (missing, torn, corrupt or stale): the metric's source."""

    def __init__(self) -> None:
        self.total = 0


REBUILDS = RebuildCounter()


def index_path(segment_path: Path) -> Path:
    return segment_path.with_name(segment_path.name.rsplit(".", 1)[0] + INDEX_SUFFIX)


def pack_entry(time_ms: int, offset: int) -> bytes:
    payload = _PAYLOAD.pack(time_ms, offset)
    return payload + struct.pack(">I", zlib.crc32(payload))


def record_time(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """The time (ms) of the record whose header starts at ``buf[pos]``: its msg id's timestamp part."""
    return msg_id_timestamp_ms(_MSG_ID.unpack_from(buf, pos + 8)[0])


def parse_entries(data: bytes, start: int, end: int) -> tuple[list[tuple[int, int]], bool, str | None]:
    """``(entries, sealed, problem)`` of an index file's bytes for a segment [start, end).

    Keeps the longest valid prefix: entries whose CRC matches, inside the segment, offsets
    increasing, times not decreasing. ``problem`` says why the rest was dropped (None: nothing was).
    """
    entries: list[tuple[int, int]] = []
    whole = len(data) - len(data) % ENTRY_SIZE
    last_offset, last_time = start - 1, None
    for pos in range(0, whole, ENTRY_SIZE):
        time_ms, offset, crc = ENTRY.unpack_from(data, pos)
        if zlib.crc32(data[pos : pos + 16]) != crc:
            return entries, False, f"entry {pos // ENTRY_SIZE} fails its CRC"
        if time_ms == SEAL:
            if offset != end or pos + ENTRY_SIZE != len(data):
                return entries, False, f"seal at {offset} but the segment ends at {end}"
            return entries, True, None
        if not last_offset < offset < end or (last_time is not None and time_ms < last_time):
            return entries, False, f"entry {pos // ENTRY_SIZE} ({time_ms}, {offset}) is out of order or past the end {end}"
        entries.append((time_ms, offset))
        last_offset, last_time = offset, time_ms
    if whole != len(data):
        return entries, False, f"torn: {len(data) - whole} bytes after the last whole entry"
    return entries, False, None


def index_records(
    buf: bytes | bytearray | memoryview, base: int, last: int | None, interval: int, every_record: bool
) -> list[tuple[int, int]]:
    """The entries for the whole records in ``buf`` (``buf[0]`` at offset ``base``).

    ``last``: the offset of the previous entry of the segment (None: there is none yet).
    ``every_record`` False: only the first record is looked at (the O(1) append rule).
    """
    out: list[tuple[int, int]] = []
    if last is None or base - last >= interval:
        out.append((record_time(buf, 0), base))
        last = base
    if not every_record:
        return out
    unpack, pos, end = _LENGTH.unpack_from, 0, len(buf)
    due = last + interval - base
    while end - pos >= record.HEADER_SIZE:
        if pos >= due:
            out.append((record_time(buf, pos), base + pos))
            due = pos + interval
        pos += record.HEADER_SIZE + unpack(buf, pos)[0]
    return out


class SegmentTimeIndex:
    """The time index of one segment (see the module's theory of operation)."""

    def __init__(self, segment_path: Path, start: int, *, interval: int = DEFAULT_INTERVAL, ready: bool) -> None:
        self.path = index_path(segment_path)
        self.start = start
        self.interval = interval
        self._lock = threading.Lock()
        #: Whether the entries (file + pending) describe every record in [start, covered).
        self.ready = ready
        self.covered = start
        self._written = 0  # entries in the file (when ready)
        self._sealed = False
        self._pending: list[tuple[int, int]] = []
        self._last: int | None = None  # offset of the newest entry
        self._first_time: int | None = None
        #: Bumped by every change of the segment's bytes (truncate, invalidate, remove): a build
        #: that started before one is thrown away (``ensure_ready``).
        self._generation = 0

    # --- appends (event loop) ----------------------------------------------------------

    def on_append(self, offset: int, buf: bytes | bytearray | memoryview) -> None:
        """``buf`` (whole records) was appended at ``offset``."""
        size = buf.nbytes if isinstance(buf, memoryview) else len(buf)
        with self._lock:
            if not self.ready or offset != self.covered:
                return  # not built yet (the first lookup walks these bytes), or already covered
            self.covered = offset + size
            last = self._last
            if size <= MAX_UNINDEXED_APPEND:  # the common case, inline: one header read at most
                if last is None or offset - last >= self.interval:
                    self._pending.append((record_time(buf, 0), offset))
                    self._last = offset
                return
            added = index_records(buf, offset, last, self.interval, every_record=True)
            if added:
                self._pending.extend(added)
                self._last = added[-1][1]

    # --- writing the file --------------------------------------------------------------

    def _append_file(self, entries: Iterable[tuple[int, int]], seal_end: int | None = None) -> None:
        data = _file_bytes(entries, seal_end)
        if data:
            _write_new(self.path, data, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def _rewrite_file(self, entries: list[tuple[int, int]], seal_end: int | None) -> None:
        """Replace the file whole (a crash in between leaves the old or the new one, never a mix)."""
        partial = self.path.with_name(self.path.name + ".partial")
        partial.unlink(missing_ok=True)
        _write_new(partial, _file_bytes(entries, seal_end), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.replace(partial, self.path)

    def flush(self, everything: bool = False) -> None:
        """Write the pending entries once there are ``WRITE_AFTER_ENTRIES`` (or all of them, with
        ``everything``: at close). No fsync: a lost tail is walked again on first use."""
        with self._lock:
            if self._pending and not self._sealed and (everything or len(self._pending) >= WRITE_AFTER_ENTRIES):
                self._write_pending(None)

    def seal(self, end: int) -> None:
        """The segment was rolled at ``end``: write the rest and the seal."""
        with self._lock:
            if self.ready and self.covered == end and not self._sealed:
                self._write_pending(end)
                self._sealed = True

    def _write_pending(self, seal_end: int | None) -> None:
        try:
            self._append_file(self._pending, seal_end)
        except OSError as exc:
            # Derived data must never fail a put or a flush: forget it, the first lookup rebuilds it.
            log.warning("%s: time index not written (%s); it is rebuilt on first use", self.path, exc)
            self.ready, self._written, self._last, self.covered = False, 0, None, self.start
        else:
            self._written += len(self._pending)
        self._pending = []

    # --- building (first use) ------------------------------------------------------------

    def ensure_ready(self, read: Callable[[int, int], bytes], end: Callable[[], int], sealed: Callable[[], bool],
                     corrupt: list[tuple[int, int]], where: str) -> bool:
        """Make the entries exact for the segment as it is now (read the file, walk what it lacks);
        False when the segment was cut, repaired or removed meanwhile (nothing kept: ask again).

        Runs without the log's lock (a first use may walk a whole segment; flushes must not wait
        for it): ``read(offset, length)`` reads the segment through a descriptor of the caller's,
        ``end()`` is its current end (appends go on: the last part is walked under this index's
        lock, which holds them back briefly), ``sealed()`` whether it is rolled.
        """
        with self._lock:
            if self.ready:
                return True
            generation = self._generation
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = None
        segment_end = end()
        entries, was_sealed, problem = parse_entries(data or b"", self.start, segment_end)
        if data is None and segment_end > self.start:
            problem = "missing"
        complete = was_sealed and sealed()
        walked_from = entries[-1][1] if entries else self.start
        if not complete:
            entries = entries[:-1] if entries else entries  # the walk re-adds the last entry
            entries += _walk(read, walked_from, segment_end, entries[-1][1] if entries else None, self.interval, corrupt)
        with self._lock:
            if self.ready:
                return True
            if generation != self._generation:
                return False  # cut, repaired or removed while we read: what we found may be stale
            now_end, is_sealed = end(), sealed()
            if now_end > segment_end:
                entries += _walk(read, segment_end, now_end, entries[-1][1] if entries else None, self.interval, corrupt)
            if complete:
                pass  # the file is the whole index
            elif data is not None and not problem and not was_sealed and not is_sealed:
                # The active segment's file is a good prefix: append what the walk found.
                self._append_file(entries[len(data) // ENTRY_SIZE :])
            else:  # missing, damaged, to be sealed, or sealed for an end the segment no longer has
                self._rewrite_file(entries, now_end if is_sealed else None)
            if problem:
                REBUILDS.total += 1
                log.warning("%s: time index %s (%s): rebuilt from the segment, %d entries",
                            where, self.path.name, problem or "not sealed", len(entries))
            self._written, self._pending = len(entries), []
            self._last = entries[-1][1] if entries else None
            self._sealed = is_sealed
            self.covered = now_end
            self.ready = True
        return True

    # --- reading (lookups) ---------------------------------------------------------------

    def first_time(self, read: Callable[[int, int], bytes], end: int) -> int | None:
        """The time of the segment's first record (None if it has none), read once."""
        if self._first_time is None and end > self.start:
            header = read(self.start, record.HEADER_SIZE)
            if len(header) == record.HEADER_SIZE:
                self._first_time = record_time(header, 0)
        return self._first_time

    def bracket(self, time_ms: int) -> tuple[int | None, int | None]:
        """``(low, high)``: the offsets of the last entry older than ``time_ms`` and of the first
        entry at or after it (None: no such entry). Reads at most log2(entries) entries of the file."""
        return self._bisect(time_ms, 0)

    def record_start_at_or_before(self, offset: int) -> int | None:
        """The offset of the last entry at or before ``offset`` (a record start), None if none is.
        Entries grow in offset as in time, so this is the same bisection by the other field."""
        low, high = self._bisect(offset, 1)
        return high if high == offset else low

    def _bisect(self, value: int, field: int) -> tuple[int | None, int | None]:
        """``(low, high)``: the offsets of the last entry whose ``field`` (0 time, 1 offset) is
        below ``value`` and of the first one at or after it."""
        with self._lock:
            written, pending = self._written, list(self._pending)
        count = written + len(pending)
        if not count:
            return None, None
        fd = os.open(self.path, os.O_RDONLY) if written else -1
        try:
            def entry(k: int) -> tuple[int, int]:
                if k >= written:
                    return pending[k - written]
                time_k, offset_k, _ = ENTRY.unpack(os.pread(fd, ENTRY_SIZE, k * ENTRY_SIZE))
                return time_k, offset_k

            k = bisect.bisect_left(range(count), value, key=lambda i: entry(i)[field])
            low = entry(k - 1)[1] if k > 0 else None
            high = entry(k)[1] if k < count else None
            return low, high
        finally:
            if fd >= 0:
                os.close(fd)

    # --- truncation, repair, removal --------------------------------------------------------

    def truncate(self, offset: int) -> None:
        """The segment was cut at ``offset`` (a record boundary): drop the entries at and after it.
        The file is rewritten now (a stale entry must never point into bytes appended later)."""
        with self._lock:
            self._generation += 1
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                data = b""
            kept, _, _ = parse_entries(data, self.start, offset + 1)
            kept = [e for e in kept if e[1] < offset]
            if self.ready:
                kept += [e for e in self._pending if e[1] < offset]
                self.covered = min(self.covered, offset)
            self._rewrite_file(kept, None)
            self._written, self._pending = len(kept), []
            self._last = kept[-1][1] if kept else None
            self._sealed = False
            if offset <= self.start:
                self._first_time = None

    def invalidate(self) -> None:
        """The segment's bytes changed in place (a repair): rebuild on first use."""
        with self._lock:
            self._generation += 1
            self.path.unlink(missing_ok=True)
            self.ready, self._written, self._pending, self._last, self._sealed = False, 0, [], None, False
            self.covered = self.start
            self._first_time = None

    def remove(self) -> None:
        """The segment left the log (retention, truncation, a reset): its file goes, no build may write it again."""
        with self._lock:
            self._generation += 1
            self.ready = False
            self.path.unlink(missing_ok=True)


def _file_bytes(entries: Iterable[tuple[int, int]], seal_end: int | None) -> bytes:
    data = b"".join(pack_entry(t, o) for t, o in entries)
    return data + pack_entry(SEAL, seal_end) if seal_end is not None else data


def _write_new(path: Path, data: bytes, flags: int) -> None:
    """Write all of ``data`` through a descriptor opened for this write alone (none is kept)."""
    fd = os.open(path, flags, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def first_record_at_or_after(read: Callable[[int, int], bytes], low: int, high: int, time_ms: int,
                              corrupt: list[tuple[int, int]]) -> int | None:
    """The offset of the first record in [low, high) whose time is >= ``time_ms`` (``low`` a record
    start), None if there is none; records in a corrupt range are never answered (skipped)."""
    data = read(low, high - low)
    pos, unpack = 0, _LENGTH.unpack_from
    while len(data) - pos >= record.HEADER_SIZE:
        at = low + pos
        bad_end = next((e for s, e in corrupt if s <= at < e), None)
        if bad_end is not None:
            pos = bad_end - low
            continue
        if record_time(data, pos) >= time_ms:
            return at
        length = unpack(data, pos)[0]
        if length < 0:
            return None
        pos += record.HEADER_SIZE + length
    return None


def _walk(read: Callable[[int, int], bytes], start: int, end: int, last: int | None, interval: int,
          corrupt: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Entries for the records in [start, end) by the per-record rule, around corrupt ranges."""
    out: list[tuple[int, int]] = []
    pos = start
    for bad_start, bad_end in [*sorted(corrupt), (end, end)]:
        if bad_end <= pos:
            continue
        stop = min(bad_start, end)
        for run in record.walk_records(read, pos, stop, boundaries_only=True) if pos < stop else ():
            added = index_records(run.data, run.offset, last, interval, every_record=True)
            out += added
            if added:
                last = added[-1][1]
        pos = max(pos, bad_end)
        if pos >= end:
            break
    return out
