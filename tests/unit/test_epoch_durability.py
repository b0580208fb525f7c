"""Epoch histories of many partitions made durable in batches: one syncfs per file system
(``FileSystemSync``), a takeover's ``save_all`` and a starting slave's group-committed
``adopt_epochs`` (``GroupSaves``). The invariant kept: a history is durable before the caller
goes on (a master acks in the epoch, a slave replicates), and every file holds its old or its
new history at every point (a temporary file durable before it is renamed over the old one).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from metaq.config import TopicConfig
from metaq.ha import epochs
from metaq.server.partitions import Partitions
from metaq.store import batch_sync
from metaq.store.manager import MessageStoreManager


def store_of(tmp_path: Path, partitions: int) -> MessageStoreManager:
    config = {"t": TopicConfig(name="t", incarnation="t-life", data_path=str(tmp_path / "data"), num_partitions=partitions,
                               unflush_threshold=0)}
    store = MessageStoreManager(config, max_message_size=1024)
    asyncio.run(store.create_logs([("t", p, 0) for p in range(partitions)]))
    return store


@pytest.fixture
def steps(monkeypatch) -> list[tuple[str, Path]]:
    """Each path made durable (``sync``) or renamed (``replace``), in order, from any thread."""
    seen: list[tuple[str, Path]] = []
    real_sync, real_replace = batch_sync.FileSystemSync.sync, os.replace

    def sync(self, paths):  # noqa: ANN001
        paths = list(paths)
        seen.extend(("sync", Path(p)) for p in paths)
        return real_sync(self, paths)

    def replace(src, dst):  # noqa: ANN001
        seen.append(("replace", Path(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(batch_sync.FileSystemSync, "sync", sync)
    monkeypatch.setattr(epochs.os, "replace", replace)
    return seen


def test_every_temporary_is_durable_before_any_rename_and_every_directory_after_all(tmp_path, steps):
    dirs = [tmp_path / f"p{n}" for n in range(20)]
    for directory in dirs:
        directory.mkdir()
    epochs.write_all({d / epochs.FILE_NAME: f"0\n1\n{n} 0\n" for n, d in enumerate(dirs)})
    kinds = [kind for kind, _ in steps]
    first_rename, last_rename = kinds.index("replace"), len(kinds) - 1 - kinds[::-1].index("replace")
    temporaries = [path for kind, path in steps[:first_rename] if kind == "sync"]
    assert len(temporaries) == 20 and all(".tmp." in path.name for path in temporaries)
    assert kinds[first_rename:last_rename + 1] == ["replace"] * 20
    assert {path for kind, path in steps[last_rename + 1:] if kind == "sync"} == set(dirs)
    assert [epochs.EpochCache.load(d).entries for d in dirs] == [[(n, 0)] for n in range(20)]


def test_a_failure_before_the_temporaries_are_durable_leaves_every_old_history_and_no_epoch_taken(tmp_path, monkeypatch):
    """A crash between the writes and their sync (the sync fails here): nothing is renamed, every
    partition keeps its old history, and ``assign_epoch`` raises, so the takeover acks nothing in
    the new epoch. A power loss then (the temporaries were never durable: removed) changes nothing."""
    store = store_of(tmp_path, 12)
    partitions = Partitions(store)
    assert asyncio.run(partitions.assign_epoch(store.topics, 1)) == 12

    def crash(self, paths):  # noqa: ANN001
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(batch_sync.FileSystemSync, "sync", crash)
    with pytest.raises(OSError, match="Input/output"):
        asyncio.run(partitions.assign_epoch(store.topics, 2))
    for path in (tmp_path / "data").rglob(f"{epochs.FILE_NAME}.tmp.*"):
        path.unlink()  # never durable
    assert {p: epochs.EpochCache.load(store.partition_dir("t", p)).entries for p in range(12)} == {
        p: [(1, 0)] for p in range(12)}
    store.close()


def test_syncfs_once_per_file_system_where_trustworthy_else_an_fsync_each(tmp_path, monkeypatch):
    files = [tmp_path / f"f{n}" for n in range(5)]
    fsynced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsynced.append(fd) or real_fsync(fd))
    capable = batch_sync._LIBC is not None and batch_sync._syncfs_capable(os.open(tmp_path, os.O_RDONLY))
    with batch_sync.FileSystemSync([tmp_path]) as durable:
        for path in files:
            path.write_text("x")
        durable.sync([*files, tmp_path])
    assert len(fsynced) == (0 if capable else 6)
    # A file system not known to commit everything on syncfs (or no syncfs): each path fsynced.
    fsynced.clear()
    monkeypatch.setattr(batch_sync, "_syncfs_capable", lambda fd: False)
    with batch_sync.FileSystemSync([tmp_path]) as durable:
        durable.sync([*files, tmp_path])
    assert len(fsynced) == 6


def test_a_failed_syncfs_is_an_error(tmp_path, monkeypatch):
    class FailingLibc:
        def fstatfs(self, fd, buffer):  # noqa: ANN001
            return batch_sync._LIBC.fstatfs(fd, buffer) if batch_sync._LIBC is not None else -1

        def syncfs(self, fd):  # noqa: ANN001
            batch_sync.ctypes.set_errno(5)
            return -1

    monkeypatch.setattr(batch_sync, "_LIBC", FailingLibc())
    monkeypatch.setattr(batch_sync, "_syncfs_capable", lambda fd: True)
    with batch_sync.FileSystemSync([tmp_path]) as durable, pytest.raises(OSError, match="syncfs"):
        durable.sync([tmp_path])


def test_a_slave_adopting_many_histories_at_once_commits_them_in_batches(tmp_path, steps):
    """Each ``adopt_epochs`` returns only once its history is durable; saves asked together
    share a batch (group commit), not two fsyncs each."""
    store = store_of(tmp_path, 40)
    partitions = Partitions(store)
    returned_after: dict[int, int] = {}

    async def adopt(p: int) -> None:
        await partitions.adopt_epochs("t", p, [(1, 0), (p + 2, 0)])
        directory = store.partition_dir("t", p)
        # The position in ``steps`` when this returned: its directory's sync is already there.
        returned_after[p] = max(i for i, (kind, path) in enumerate(steps) if kind == "sync" and path == directory)

    async def start() -> None:
        await asyncio.gather(*(adopt(p) for p in range(40)))

    asyncio.run(start())
    assert sorted(returned_after) == list(range(40))
    assert 1 <= partitions.epoch_saves.batches < 40
    assert {p: epochs.EpochCache.load(store.partition_dir("t", p)).entries for p in range(40)} == {
        p: [(1, 0), (p + 2, 0)] for p in range(40)}
    store.close()


def test_a_failed_batch_fails_every_adoption_in_it_and_the_next_one_is_written(tmp_path, monkeypatch):
    store = store_of(tmp_path, 6)
    partitions = Partitions(store)
    real = epochs.write_all
    failures = [OSError(28, "No space left on device")]

    def write_all(bodies):  # noqa: ANN001
        if failures:
            raise failures.pop()
        return real(bodies)

    monkeypatch.setattr(epochs, "write_all", write_all)

    async def adopt_all(entries) -> list:  # noqa: ANN001
        return await asyncio.gather(*(partitions.adopt_epochs("t", p, entries) for p in range(6)),
                                    return_exceptions=True)

    results = asyncio.run(adopt_all([(1, 0)]))
    assert all(isinstance(r, OSError) for r in results), results
    assert epochs.EpochCache.load(store.partition_dir("t", 0)).entries == []
    # The next start adopts the master's history again (the files were never replaced) and writes it.
    for p in range(6):
        partitions.get("t", p).epochs.entries = []
    assert asyncio.run(adopt_all([(1, 0), (2, 0)])) == [True] * 6
    assert epochs.EpochCache.load(store.partition_dir("t", 5)).entries == [(1, 0), (2, 0)]
    store.close()


def test_a_batch_writes_each_history_as_it_was_asked_and_a_later_change_goes_in_the_next(tmp_path):
    store = store_of(tmp_path, 1)
    partitions = Partitions(store)
    owner = partitions.get("t", 0)

    async def two_adoptions() -> None:
        first = asyncio.ensure_future(owner.adopt_epochs([(1, 0)]))
        await asyncio.sleep(0)  # the first batch is in its worker thread
        second = asyncio.ensure_future(owner.adopt_epochs([(1, 0), (3, 0)]))
        await asyncio.gather(first, second)

    asyncio.run(two_adoptions())
    assert epochs.EpochCache.load(store.partition_dir("t", 0)).entries == [(1, 0), (3, 0)]
    assert partitions.epoch_saves.batches == 2
    store.close()
