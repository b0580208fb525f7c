"""fsync (and create) many files and directories at once: what a batch of new partitions or epochs costs.

One ``fsync`` waits for a journal commit (milliseconds on a real disk); done one after
another for thousands of new partitions it took most of a slave's start. The kernel
commits concurrent ``fsync`` calls of one file system together, so ``fsync_all`` runs them
from a small pool of worker threads: the same guarantee per path (each is fsynced, and an
error is raised), a fraction of the time. Called from a worker thread, never the event loop.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: fsyncs in flight at once; more stops paying on one disk.
SYNC_WORKERS = 16


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by name (Linux allows fsync on a read-only descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_all(paths: Iterable[Path]) -> None:
    """fsync every path (each once), concurrently; raise the first error once all were tried."""
    run_all(fsync_path, list(dict.fromkeys(paths)))


def run_all(work: Callable[[T], R], items: list[T]) -> list[R]:
    """``[work(item) for item in items]``, SYNC_WORKERS at a time (file-system calls release the
    GIL, and metadata updates of different directories proceed together); the first error is
    raised once all were tried."""
    if len(items) <= 1:
        return [work(item) for item in items]
    futures = [_pool().submit(work, item) for item in items]
    concurrent.futures.wait(futures)
    return [future.result() for future in futures]


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """One pool for the process, made on first use (a slave starting thousands of partitions
    runs hundreds of batches). ``work`` given to ``run_all`` must not call ``run_all`` itself:
    a pool of busy workers waiting on their own queue would never finish."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=SYNC_WORKERS, thread_name_prefix="batch-files")
        return _POOL



# --- one syncfs(2) for a batch of small files ----------------------------------------------------
#
# A takeover writes every partition's epoch history, and a slave starting copies its master's:
# at 10,000 partitions ``fsync_all`` is 20,000 fsyncs (each file, then each directory after the
# rename), hundreds of journal commits even when concurrent. syncfs(2) writes back every dirty
# inode of one file system and commits its journal once: the same guarantee for every file and
# directory entry of the batch, in one commit. Used only where it is known to mean that and to
# report errors: Linux 5.8 or later (syncfs returns a writeback error of the file system since
# the descriptor was opened, so it is opened before the batch writes anything), on ext4, XFS and
# btrfs. Anywhere else each path is fsynced (``fsync_all``), and so it is when ``fsync`` itself
# is interposed (an ``LD_PRELOAD`` library, such as a power-loss simulator that records every
# fsync, or one that makes fsync a no-op): its author expects to see each sync. Its cost is
# whatever else is dirty on that file system: for a broker's data dir, its own unflushed logs.

#: statfs(2) f_type of the file systems whose syncfs commits everything dirty and reports errors.
SYNCFS_FILE_SYSTEMS = {0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs"}


def _syncfs_kernel() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 8)


def _libc_unless_fsync_interposed() -> ctypes.CDLL | None:
    """The C library for syncfs, or None where it must not be used (see above)."""
    if not _syncfs_kernel():
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)  # its own symbols
    process = ctypes.CDLL(None)  # the process's scope: a preloaded library's fsync comes first
    own, seen = (ctypes.cast(lib.fsync, ctypes.c_void_p).value for lib in (libc, process))
    return libc if own == seen else None


_LIBC = _libc_unless_fsync_interposed()


def _syncfs_capable(fd: int) -> bool:
    """Whether the file system ``fd`` is on is one of SYNCFS_FILE_SYSTEMS (statfs: f_type first)."""
    if _LIBC is None:
        return False
    buffer = ctypes.create_string_buffer(256)  # larger than struct statfs
    if _LIBC.fstatfs(fd, buffer) != 0:
        return False
    return (ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF) in SYNCFS_FILE_SYSTEMS


class FileSystemSync:
    """Makes a batch of paths durable with one syncfs(2) per file system (see above).

    Entered (``with``) before the batch writes anything, naming the directories it writes in;
    ``sync(paths)`` then returns once every path given (files in those directories, or the
    directories themselves) is durable, data and directory entries alike, or raises OSError.
    Paths on a file system without a trustworthy syncfs are fsynced one by one (``fsync_all``).
    Blocking: call it from a worker thread.
    """

    def __init__(self, directories: Iterable[Path]) -> None:
        self._directories = list(dict.fromkeys(Path(d) for d in directories))
        self._device: dict[Path, int] = {}  # directory -> its file system (st_dev)
        self._syncfs: dict[int, int] = {}  # st_dev -> a descriptor for syncfs there, -1: fsync each

    def __enter__(self) -> "FileSystemSync":
        if _LIBC is None:
            return self
        try:
            for directory in self._directories:
                device = self._device[directory] = os.stat(directory).st_dev
                if device not in self._syncfs:
                    fd = os.open(directory, os.O_RDONLY)
                    if _syncfs_capable(fd):
                        self._syncfs[device] = fd
                    else:
                        os.close(fd)
                        self._syncfs[device] = -1
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._syncfs.values():
            if fd >= 0:
                os.close(fd)
        self._syncfs.clear()
        self._device.clear()

    def sync(self, paths: Iterable[Path]) -> None:
        """Every path in ``paths`` durable: one syncfs per file system, else an fsync each."""
        descriptors: set[int] = set()
        one_by_one: list[Path] = []
        for path in dict.fromkeys(paths):
            device = self._device.get(path, self._device.get(path.parent))
            fd = self._syncfs.get(device, -1) if device is not None else -1
            if fd >= 0:
                descriptors.add(fd)
            else:
                one_by_one.append(path)
        for fd in descriptors:
            assert _LIBC is not None
            if _LIBC.syncfs(fd) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, f"syncfs: {os.strerror(errno)}")
        fsync_all(one_by_one)
