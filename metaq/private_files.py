"""A broker's data belongs to its OS user alone: files 0600, directories 0700.

Segments hold every message; checkpoints, the transaction journal and the id files say
who produced what. Every file or directory a broker creates under its data directories
goes through here (``open(..., opener=private_opener)``, ``os.open(..., FILE_MODE)``,
``make_private_dir``), so no local user but the broker's reads them, whatever the umask.
``tests/integration/test_trust_file_modes.py`` walks a real broker's data directory.
"""

from __future__ import annotations

import itertools
import os
import stat
from pathlib import Path
from typing import Callable

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_opener(path: str, flags: int) -> int:
    """For ``open(path, mode, opener=private_opener)``: a file it creates is 0600."""
    return os.open(path, flags, FILE_MODE)


def fsync_directory(directory: Path, fsync: Callable[[int], None] = os.fsync) -> None:
    """Make a created, renamed or removed entry of ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def make_private_dir(path: Path, fsync: Callable[[int], None] = os.fsync) -> None:
    """``path`` and any missing parent, created 0700 and durably (an existing directory is left
    as it is).

    A new directory's name lives in its parent: until the parent is fsynced, a power loss may
    take the directory away with every file in it, however often those were fsynced.
    """
    missing = [directory for directory in (path, *path.parents) if not directory.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=DIR_MODE, exist_ok=True)
        fsync_directory(directory.parent, fsync)


def tighten_dir(path: Path) -> bool:
    """Make an existing data directory 0700 (its files made before by a looser broker become
    unreachable to others with it); True if it had group or other bits."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & (stat.S_IRWXG | stat.S_IRWXO):
        return False
    os.chmod(path, DIR_MODE)
    return True


#: Distinguishes the temporary files of concurrent writers in this process.
_temporaries = itertools.count()


def write_private_temporary(path: Path, text: str, *, fsync: bool) -> Path:
    """Write ``text`` to a new owner-only temporary file beside ``path`` (fsynced if asked)
    and return it, for the caller to rename over ``path``.

    Each call has a name of its own (``{name}.tmp.{pid}.{n}``): two writers of one file (a
    partition's first checkpoint written by a batch while its flusher saves the next one)
    sharing one temporary name would rename each other's file away, and the second rename
    fails with FileNotFoundError."""
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}.{next(_temporaries)}")
    with open(tmp, "w", opener=private_opener) as handle:
        handle.write(text)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
    return tmp
