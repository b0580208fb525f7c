"""One segment file of a partition log: ``{dir}/{start:020d}.meta``.

A segment only knows bytes and positions; it does not parse records (that is
``metaq.record``'s job) and does not decide when to roll (that is ``PartitionLog``'s).
Offsets in its API are absolute partition offsets, like everywhere else in the store,
so callers never juggle two coordinate systems.

Invariant: the file holds exactly ``size`` bytes. ``append`` keeps it even when a
write fails halfway, by cutting the file back, so a failed put never leaves a
partial record that a later append would bury in the middle of the log. One
exception, never written to by appends: a sealed segment whose file was cut short
outside the broker (``claim_missing_tail``); its missing bytes are a corrupt range of
the log, never read, until ``restore`` writes them back.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from metaq.private_files import FILE_MODE
from metaq.store.timeindex import SegmentTimeIndex

SEGMENT_SUFFIX = ".meta"
_SEGMENT_NAME = re.compile(r"^(\d{20})\.meta$")


def segment_file_name(start: int) -> str:
    return f"{start:020d}{SEGMENT_SUFFIX}"


def parse_segment_start(path: Path) -> int | None:
    """The start offset encoded in a segment file's name, or None if it is not one."""
    match = _SEGMENT_NAME.match(path.name)
    return int(match.group(1)) if match else None


class LogSegment:
    """An open segment file. Offsets are absolute; ``start`` is its first byte's offset."""

    def __init__(self, path: Path, start: int, fd: int, size: int, read_only: bool, *, new: bool = False) -> None:
        self.path = path
        self.start = start
        self.size = size
        self.read_only = read_only
        self._fd = fd
        #: Its sparse time index (metaq/store/timeindex.py): a new segment's is exact from the
        #: start; an opened one's is read and checked on first use. Holds no descriptor.
        self.time_index = SegmentTimeIndex(path, start, ready=new)

    @classmethod
    def create(cls, directory: Path, start: int) -> LogSegment:
        """A new empty, writable segment. Fails if the file already exists: never clobber data."""
        path = directory / segment_file_name(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE)
        segment = cls(path, start, fd, 0, read_only=False, new=True)
        segment.time_index.path.unlink(missing_ok=True)  # a leftover of an earlier log here describes other bytes
        return segment

    @classmethod
    def open(cls, path: Path, read_only: bool) -> LogSegment:
        start = parse_segment_start(path)
        if start is None:
            raise ValueError(f"{path}: not a segment file name (expected 20 digits + {SEGMENT_SUFFIX})")
        fd = os.open(path, os.O_RDWR)
        size = os.fstat(fd).st_size
        if size == 0 and not read_only:
            # An empty active segment (a log laid out in a batch and opened as existing, or one
            # cut back to nothing) has an exact index from the start, like a created one: no
            # rebuild at its first lookup, and its entries are written as it fills.
            segment = cls(path, start, fd, 0, read_only=False, new=True)
            segment.time_index.path.unlink(missing_ok=True)  # a leftover describes other bytes
            return segment
        return cls(path, start, fd, size, read_only)

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def fileno(self) -> int:
        return self._fd

    def linked(self) -> bool:
        """Whether the file still has a name (False once it was deleted while open)."""
        return os.fstat(self._fd).st_nlink > 0

    def append(self, buf: bytes | bytearray | memoryview) -> int:
        """Write all of ``buf`` at the end; return the absolute offset it starts at."""
        if self.read_only:
            raise PermissionError(f"{self.path}: segment is read-only")
        offset = self.start + self.size  # ``end`` (asked per put: without the property's call)
        total = buf.nbytes if isinstance(buf, memoryview) else len(buf)
        written = 0
        try:
            while written < total:
                # pwrite at an explicit position: independent of the file pointer, and a short
                # write simply continues where it stopped (the first write, nearly always whole,
                # takes the buffer as it is).
                rest = buf if not written else memoryview(buf).cast("B")[written:]
                written += os.pwrite(self._fd, rest, self.size + written)
        except OSError:
            if written:
                # Keep the invariant (file == size bytes); a half batch must not survive.
                os.ftruncate(self._fd, self.size)
            raise
        self.size += written
        return offset

    def claim_missing_tail(self, end: int) -> None:
        """A sealed segment whose file was cut short keeps its place in the log: it still
        ends at ``end`` (the next segment's start), so offsets stay contiguous and the missing
        bytes can be put back in place. The caller marks them corrupt (never read)."""
        if not self.read_only or end < self.end:
            raise ValueError(f"{self.path}: cannot claim a missing tail up to {end} (ends at {self.end})")
        self.size = end - self.start

    def restore(self, offset: int, data: bytes) -> None:
        """Write ``data`` over bytes already in the file at absolute ``offset`` (a corrupt
        range put back from a replica); never past ``end``, so ``size`` does not change
        (a missing tail, see ``claim_missing_tail``, is written past the file's end)."""
        if offset < self.start or offset + len(data) > self.end:
            raise ValueError(f"{self.path}: [{offset}, {offset + len(data)}) is not inside [{self.start}, {self.end})")
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.pwrite(self._fd, view[written:], offset - self.start + written)

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from absolute ``offset``, never past ``end``."""
        end = self.start + self.size  # ``end``, read once
        if offset < self.start or offset > end:
            raise ValueError(f"{self.path}: offset {offset} outside [{self.start}, {end}]")
        length = max(0, min(length, end - offset))
        chunks: list[bytes] = []
        got = 0
        while got < length:
            chunk = os.pread(self._fd, length - got, offset - self.start + got)
            if not chunk:  # file shorter than we think: report what is there
                break
            chunks.append(chunk)
            got += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def flush(self) -> None:
        os.fsync(self._fd)

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (only shrinking is meaningful for a log)."""
        if not 0 <= size <= self.size:
            raise ValueError(f"{self.path}: cannot truncate a {self.size}-byte segment to {size}")
        os.ftruncate(self._fd, size)
        self.size = size

    def mtime(self) -> float:
        return os.fstat(self._fd).st_mtime

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __repr__(self) -> str:
        state = "ro" if self.read_only else "rw"
        return f"LogSegment({self.path.name}, start={self.start}, size={self.size}, {state})"
