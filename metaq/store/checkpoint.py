"""The flushed-end checkpoint of one partition log: the highest log end known durable.

Stored as ``{partition dir}/flushed-end-checkpoint``: a version line, then the offset.
``PartitionLog`` raises it after fsyncs (at most once a second, and on close) and
lowers it before a truncation cuts bytes, so the invariant is:

    the checkpoint never exceeds the bytes the segment files durably hold.

On open, segment files that end before the checkpoint mean bytes were deleted or cut
outside the broker (an active segment removed by hand, a restored old backup): the
log refuses to open instead of silently reusing the lost offsets. A checkpoint that
lags behind (a crash before the next write) only makes that check weaker, never wrong.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from metaq.private_files import fsync_directory, write_private_temporary
from metaq.store.batch_sync import run_all

log = logging.getLogger(__name__)

FILE_NAME = "flushed-end-checkpoint"
_VERSION = "0"


def checkpoint_path(directory: Path) -> Path:
    return directory / FILE_NAME


def read_flushed_end(directory: Path) -> int | None:
    """The offset in the checkpoint; None if there is none or it cannot be read (logged)."""
    path = checkpoint_path(directory)
    try:
        lines = path.read_text().split("\n")
    except FileNotFoundError:
        return None
    if len(lines) >= 2 and lines[0] == _VERSION and lines[1].isdigit():
        return int(lines[1])
    # Never written half (see write_flushed_end), so this is a hand edit or disk damage:
    # nothing to check against; the next write replaces it.
    log.warning("%s: unreadable flushed-end checkpoint %r ignored", path, lines[:2])
    return None


def write_flushed_end(directory: Path, offset: int, *, durable: bool) -> None:
    """Replace the checkpoint atomically (temporary file, fsync, rename).

    ``durable`` also fsyncs the directory, so the new value survives a crash: needed
    when lowering it before a truncation. Raising it needs no such wait: if the rename
    is lost in a crash, the older, lower value is still true.
    """
    path = checkpoint_path(directory)
    os.replace(_write_temporary(path, offset, fsync=True), path)
    if durable:
        fsync_directory(directory)


def write_first_checkpoints(offsets: dict[Path, int]) -> None:
    """The first checkpoints of new logs (``{directory: offset}``), as one batch: every
    temporary file written and fsynced, all at once (``run_all``), then renamed. No directory
    fsync, for the reason in ``write_flushed_end``: a rename lost in a crash leaves no
    checkpoint, which claims less, never more."""
    paths = [checkpoint_path(directory) for directory in offsets]
    temporaries = run_all(lambda item: _write_temporary(item[0], item[1], fsync=True), list(zip(paths, offsets.values())))
    run_all(lambda item: os.replace(*item), list(zip(temporaries, paths)))


def _write_temporary(path: Path, offset: int, *, fsync: bool) -> Path:
    return write_private_temporary(path, f"{_VERSION}\n{offset}\n", fsync=fsync)
