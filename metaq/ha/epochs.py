"""The epoch checkpoint of one partition log: which master epoch wrote which bytes.

Each entry ``(epoch, start_offset)`` says: from ``start_offset`` on, the bytes
were written by the master of ``epoch`` (until the next entry's start). A new
master appends ``(new_epoch, log_end)`` to every partition; a slave copies its
master's entries. With it, a broker that comes back after a failover can ask
the new master "where did my last epoch end in *your* log?" and cut its own log
there: everything after that point was written by it alone (never acked in sync
mode, or inside the async loss window) and is moved aside (Kafka's leader
epochs, KIP-101 / KIP-279).

Invariants (enforced by ``assign`` and ``truncate_from_end``):
* epochs strictly increase along the list, and so do start offsets (an epoch
  that wrote nothing is replaced by the next one at the same start);
* no entry starts past the log end after a truncation.

Stored as ``{partition dir}/leader-epoch-checkpoint``: a version line, a
count line, then ``epoch start`` lines; written to a temporary file, fsynced and
renamed, so a crash leaves the old or the new list, never half of one.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..private_files import fsync_directory, make_private_dir, write_private_temporary
from ..store.batch_sync import FileSystemSync, run_all

FILE_NAME = "leader-epoch-checkpoint"
_VERSION = "0"
#: ``{dataPath}/led-epoch``: the newest epoch this broker led (see ``record_led_epoch``).
LED_EPOCH_FILE = "led-epoch"


class EpochCacheError(ValueError):
    """The checkpoint file is unreadable."""


class EpochCache:
    def __init__(self, directory: Path, entries: list[tuple[int, int]] | None = None) -> None:
        self.path = Path(directory) / FILE_NAME
        self.entries: list[tuple[int, int]] = list(entries or [])

    @classmethod
    def load(cls, directory: Path) -> "EpochCache":
        cache = cls(directory)
        if not cache.path.exists():
            return cache
        lines = cache.path.read_text().split("\n")
        try:
            if lines[0] != _VERSION:
                raise EpochCacheError(f"{cache.path}: unknown version {lines[0]!r}")
            count = int(lines[1])
            entries = [tuple(int(x) for x in line.split()) for line in lines[2 : 2 + count]]
            if any(len(e) != 2 for e in entries) or len(entries) != count:
                raise EpochCacheError(f"{cache.path}: expected {count} 'epoch start' lines")
        except (IndexError, ValueError) as exc:
            raise EpochCacheError(f"{cache.path}: unreadable epoch checkpoint: {exc}") from None
        cache.entries = [(e[0], e[1]) for e in entries]
        return cache

    def save(self) -> None:
        _write_durably(self.path, self._text())

    def _text(self) -> str:
        return "\n".join([_VERSION, str(len(self.entries))] + [f"{e} {s}" for e, s in self.entries]) + "\n"

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` writes from ``start_offset`` on; True if the list changed."""
        if self.entries and epoch < self.entries[-1][0]:
            raise ValueError(f"epoch {epoch} is older than the latest one, {self.entries[-1][0]}")
        if self.entries and self.entries[-1][0] == epoch:
            return False
        # Entries at or past the new start wrote nothing this log keeps: drop them.
        self.entries = [(e, s) for e, s in self.entries if s < start_offset]
        self.entries.append((epoch, start_offset))
        return True

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """``(found_epoch, end)``: the largest epoch <= ``epoch`` and where it ends in this log.

        ``end`` is the start of the next epoch, or ``log_end`` for the latest one.
        ``(-1, first start)`` if every entry is newer than ``epoch``.
        """
        found = -1
        end = self.entries[0][1] if self.entries else 0
        for index, (e, _start) in enumerate(self.entries):
            if e > epoch:
                break
            found = e
            end = self.entries[index + 1][1] if index + 1 < len(self.entries) else log_end
        return found, min(end, log_end) if found >= 0 else end

    def truncate_from_end(self, offset: int) -> None:
        """After the log was cut to ``offset``: forget epochs that start at or past it."""
        self.entries = [(e, s) for e, s in self.entries if s < offset] or self.entries[:0]

    def replace_all(self, entries: list[tuple[int, int]]) -> bool:
        """A slave adopting its master's history; True if it changed."""
        new = [(int(e), int(s)) for e, s in entries]
        if new == self.entries:
            return False
        self.entries = new
        return True


def save_all(caches: list[EpochCache]) -> None:
    """``save`` for many partitions as one batch (a takeover assigns its epoch to every
    partition). Blocking: one worker-thread hop for the whole batch."""
    write_all({cache.path: cache._text() for cache in caches})


def write_all(bodies: dict[Path, str]) -> None:
    """Each file replaced by its body, all durable when this returns: the steps of
    ``_write_durably``, each for all files at once, made durable by one syncfs(2) per file
    system where that is trustworthy (store/batch_sync.py: ``FileSystemSync``; an fsync per
    file and per directory elsewhere). Every temporary file is durable before any rename, so
    each file holds its old or its new history at every point, also across a power loss. The
    writes and the renames run SYNC_WORKERS at a time (``run_all``: each in its own directory,
    they proceed together where one after another each waited its turn at the file system)."""
    paths = list(bodies)
    with FileSystemSync(path.parent for path in paths) as durable:
        temporaries = run_all(lambda path: _write_temporary(path, bodies[path], fsync=False), paths)
        durable.sync(temporaries)
        run_all(lambda pair: os.replace(pair[1], pair[0]), list(zip(paths, temporaries)))
        durable.sync(path.parent for path in paths)


def _write_durably(path: Path, body: str) -> None:
    """Write to a temporary file, fsync, rename, fsync the directory: a crash or a power loss
    leaves the old or the new text (the directory fsync: a power loss must not bring back an
    epoch history that lacks an epoch whose fsynced records the log keeps)."""
    os.replace(_write_temporary(path, body, fsync=True), path)
    fsync_directory(path.parent)


def _write_temporary(path: Path, body: str, *, fsync: bool) -> Path:
    return write_private_temporary(path, body, fsync=fsync)


def record_led_epoch(data_path: str, epoch: int) -> None:
    """Remember, durably, that this broker led ``epoch`` (before it acks anything in it).

    A slave copies its master's epoch checkpoints, so they cannot say who led an epoch;
    ZooKeeper's epoch node can, until ZooKeeper loses its data. Then this file is what
    lets the broker that led the newest epoch know it holds every message acked in it,
    and re-seed the group (metaq/ha/election.py, "ZooKeeper lost its data").
    """
    path = Path(data_path) / LED_EPOCH_FILE
    make_private_dir(path.parent)
    _write_durably(path, f"{epoch}\n")


def read_led_epoch(data_path: str) -> int:
    """The newest epoch this broker led, 0 if none (or the file is unreadable: then it claims nothing)."""
    try:
        return int((Path(data_path) / LED_EPOCH_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0
