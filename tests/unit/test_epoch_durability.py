"""A takeover's epoch histories made durable as one batch: one syncfs per file system
(``FileSystemSync``) for ``save_all``. The invariant kept: every history names the epoch,
durably, before ``assign_epoch`` returns (the master acks in the epoch only after it), and
every file holds its old or its new history at every point (a temporary file durable before
it is renamed over the old one).
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


def test_no_syncfs_where_fsync_is_interposed(tmp_path):
    """Under an LD_PRELOAD library that interposes fsync (the chaos power-loss shim records
    every fsync to decide what a power loss keeps) each path is fsynced: a syncfs would make
    the files durable behind its back."""
    import shutil
    import subprocess
    import sys

    from chaos.power_loss import build_shim

    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the power-loss shim")
    shim = build_shim(tmp_path / "shim")
    probe = "import metaq.store.batch_sync as b; print(b._LIBC is None)"
    env = {**os.environ, "POWERLOSS_ROOT": str(tmp_path / "root"), "POWERLOSS_JOURNAL": str(tmp_path / "journal"),
           "POWERLOSS_STASH": str(tmp_path / "stash")}
    plain = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    shimmed = subprocess.run([sys.executable, "-c", probe], env={**env, "LD_PRELOAD": str(shim)},
                             capture_output=True, text=True, check=True)
    assert shimmed.stdout.strip() == "True"
    assert plain.stdout.strip() == str(batch_sync._LIBC is None)
