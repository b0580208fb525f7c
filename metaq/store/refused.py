"""A partition the broker refuses to serve: its files on disk cannot be the log it knew.

``MessageStoreManager`` puts a ``RefusedLog`` where the ``PartitionLog`` would be when
opening it fails with ``LogCorruptError`` (segments not contiguous, or a log end that
went backwards). The other partitions keep serving; this one answers every read and
write with the reason, and the store leaves its segment files as they are (no
recovery, no new segment), so an operator can still restore them. The broker's request handlers turn the reason
into an error reply; the replication and HA code that only look at log ends see an
empty log at the end the broker knew, so they neither crash nor reuse those offsets.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from metaq.store.segment import LogSegment

if TYPE_CHECKING:
    from metaq.store.flush import LogFlusher


class PartitionRefused(OSError):
    """Raised by every operation of a RefusedLog that would read or write the log."""


class RefusedLog:
    """Stands in for a PartitionLog that refused to open (same attributes, no data)."""

    def __init__(self, directory: Path, reason: str, known_end: int, max_segment_size: int, max_message_size: int) -> None:
        self.directory = directory
        self.reason = reason
        self.max_segment_size = max_segment_size
        self.max_message_size = max_message_size
        # Offsets below the end the broker knew stay taken: anything that asks for
        # where to append (a new master's epoch start, a slave's fetch) gets this end.
        self.min_offset = self.log_end = self.flushed_end = known_end
        self.corrupt_ranges: list[tuple[int, int]] = []
        #: Its flusher, as a PartitionLog's (set by the store that opened it).
        self.flusher: LogFlusher | None = None

    def first_corrupt_offset(self) -> None:
        return None

    def corrupt_end_at(self, offset: int) -> None:
        return None

    def mark_if_corrupt_record(self, offset: int) -> bool:
        return False

    def mark_corrupt(self, start: int, end: int) -> bool:
        return False

    @property
    def segments(self) -> list[LogSegment]:
        return []

    def _refuse(self) -> NoReturn:
        raise PartitionRefused(errno.EIO, self.reason)

    def append(self, records: object) -> int:
        self._refuse()

    def read(self, offset: int, max_bytes: int, upto: int | None = None) -> bytes:
        self._refuse()

    def read_as_stored(self, offset: int, max_bytes: int) -> bytes:
        self._refuse()

    def file_range(self, offset: int, max_bytes: int, upto: int | None = None) -> tuple[LogSegment, int, int]:
        self._refuse()

    def crc32(self, start: int, end: int) -> int:
        self._refuse()

    def nearest_offset(self, offset: int) -> int:
        self._refuse()

    def truncate_to(self, offset: int) -> None:
        self._refuse()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self._refuse()

    def last_msg_id(self) -> int:
        return 0

    def flush(self) -> int:
        return self.flushed_end

    def check_files(self) -> None:
        pass

    def detach_segments_older_than(self, cutoff_mtime: float) -> list[LogSegment]:
        return []

    def close(self) -> None:
        pass

    def discard(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"RefusedLog({self.directory}: {self.reason})"
