"""fsync (and create) many files and directories at once: what a batch of new partitions or epochs costs.

One ``fsync`` waits for a journal commit (milliseconds on a real disk); done one after
another for thousands of new partitions it took most of a slave's start. The kernel
commits concurrent ``fsync`` calls of one file system together, so ``fsync_all`` runs them
from a small pool of worker threads: the same guarantee per path (each is fsynced, and an
error is raised), a fraction of the time. Called from a worker thread, never the event loop.
"""

from __future__ import annotations

import concurrent.futures
import os
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
