"""The broker's transaction journal: a redo log of branch states, with MetaQ's checkpoints.

What it is for
--------------
The partition logs are the replicated truth about transactions (BATCH headers,
PREPARE, COMMIT and ABORT markers: see index.py). This journal is the broker's
own memory of its coordinator state (branch states, which partitions each
branch wrote to, timeouts) so that a restarted broker gets its branches back
without waiting for a client; ``coordinator.reconcile`` merges both, and where
they disagree the partition markers win. A new master after a failover starts
from an empty journal and learns the branches from the partition logs.

Files, in ``{dataLogPath}/transactions/``:

* ``redo.{n:020d}.log``: one line per change, ``{crc32:08x} {json}``, the json
  being ``{"xid": ..., "branch": {...}}`` (the branch's whole new record) or
  ``{"xid": ..., "branch": null}`` (forgotten). Replay applies them in order.
* ``checkpoint.{n:020d}.json``: ``{crc32}\\n{json}``, every live branch, and
  ``n`` = the first redo file the checkpoint does not cover.

Settings (MetaQ's): a checkpoint every ``checkpointInterval`` ms (``tick``),
the newest ``maxCheckpoints`` kept (so a damaged newest one falls back to an
older one, whose redo files are kept too); ``flushTxLogAtCommit``: 0 the OS
flushes, 1 every decision record (prepare, commit, rollback) is fsynced before
``record`` returns, 2 ``tick`` fsyncs at most one second after a write.

Recovery (``TxLog.open``): the newest checkpoint with a valid CRC, then the redo
files from its ``n`` on, each up to its first line that is torn or fails its
CRC (a crash mid-write), which is cut off as in the partition logs. Appends
then go to a new redo file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable, NamedTuple

from metaq.private_files import fsync_directory, make_private_dir, private_opener
from metaq.txn.config import FlushTxLog, TxnSettings
from metaq.txn.crcfile import read_crc_file, write_crc_file

log = logging.getLogger(__name__)

DIRECTORY = "transactions"
_REDO = re.compile(r"^redo\.(\d{20})\.log$")
_CHECKPOINT = re.compile(r"^checkpoint\.(\d{20})\.json$")
_VERSION = 1
#: fsync delay bound of flushTxLogAtCommit=2 (MetaQ: once a second)
EVERY_SECOND_MS = 1000
Branches = dict[str, dict[str, Any]]


def _redo_name(n: int) -> str:
    return f"redo.{n:020d}.log"


def _checkpoint_name(n: int) -> str:
    return f"checkpoint.{n:020d}.json"


def _numbered(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    found = []
    for path in directory.iterdir():
        match = pattern.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def _encode_line(entry: dict[str, Any]) -> bytes:
    raw = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(raw), raw)


def _decode_line(line: bytes) -> dict[str, Any] | None:
    if not line.endswith(b"\n") or len(line) < 10 or line[8:9] != b" ":
        return None
    raw = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(raw):
            return None
        return json.loads(raw)
    except ValueError:
        return None


class TxLog:
    def __init__(self, directory: Path, settings: TxnSettings, branches: Branches, redo_number: int,
                 now_ms: int, fsync: Callable[[int], None] = os.fsync) -> None:
        self.directory = directory
        self.settings = settings
        self.branches = branches
        self._fsync = fsync
        self._redo_number = redo_number
        self._redo: BinaryIO = open(directory / _redo_name(redo_number), "ab", opener=private_opener)
        #: Redo files a checkpoint rotated out whose fsync has not finished (``begin_upkeep``).
        self._retired: list[BinaryIO] = []
        self._dirty_since_ms: int | None = None
        self._last_checkpoint_ms = now_ms
        #: flushTxLogAtCommit=1: when set, ``record`` does not fsync a decision itself; its caller
        #: fsyncs off its event loop (``sync_handle`` / ``fsync_handle`` / ``synced``) and lets no
        #: marker of a decision reach a log, nor any answer leave, before ``decisions_synced`` covers it.
        self.defer_decision_fsyncs = False
        self.decisions_written = 0  # decision records written under flushTxLogAtCommit=1
        self.decisions_synced = 0  # of those, how many are known fsynced
        fsync_directory(directory, fsync)

    @classmethod
    def open(cls, base: Path, settings: TxnSettings, now_ms: int,
             fsync: Callable[[int], None] = os.fsync) -> TxLog:
        directory = base / DIRECTORY
        make_private_dir(directory, fsync)  # durable: its fsynced journal must not vanish with it
        branches, first_redo = _load_checkpoint(directory)
        redo_files = [(n, p) for n, p in _numbered(directory, _REDO) if n >= first_redo]
        for _n, path in redo_files:
            _replay(path, branches)
        next_number = max([first_redo - 1] + [n for n, _ in redo_files]) + 1
        return cls(directory, settings, branches, next_number, now_ms, fsync)

    def record(self, xid: str, branch: dict[str, Any] | None, *, decision: bool, now_ms: int) -> None:
        """Journal a branch's new record (None: forgotten); a decision is fsynced under flushTxLogAtCommit=1."""
        if branch is None:
            self.branches.pop(xid, None)
        else:
            self.branches[xid] = branch
        self._redo.write(_encode_line({"xid": xid, "branch": branch}))
        self._redo.flush()  # to the OS: mode 0 durability, and what a reader of the file sees
        if decision and self.settings.flush_tx_log_at_commit is FlushTxLog.AT_COMMIT:
            self.decisions_written += 1
            if not self.defer_decision_fsyncs:
                self._fsync(self._redo.fileno())
                self.decisions_synced = self.decisions_written
        elif self._dirty_since_ms is None:
            self._dirty_since_ms = now_ms

    def tick(self, now_ms: int) -> None:
        """Mode-2 fsyncs and periodic checkpoints, all on the caller's thread (tools, tests);
        the broker splits it: ``begin_upkeep`` on its event loop, ``run_upkeep`` in a worker thread."""
        upkeep = self.begin_upkeep(now_ms)
        if upkeep is not None:
            self._finish(upkeep)

    def checkpoint(self, now_ms: int) -> None:
        """Write every live branch, start a new redo file, keep the newest maxCheckpoints checkpoints."""
        self._finish(self.begin_upkeep(now_ms, checkpoint=True))

    def _finish(self, upkeep: "Upkeep") -> None:
        try:
            self.run_upkeep(upkeep)
        except BaseException:
            self.upkeep_done(upkeep, ok=False)
            raise
        self.upkeep_done(upkeep, ok=True)

    def begin_upkeep(self, now_ms: int, *, checkpoint: bool = False) -> "Upkeep | None":
        """What is due now (a mode-2 fsync, a checkpoint), or None: the part that must see the
        journal as it is (the branches serialized, the redo file rotated), done at once on the
        thread that writes records; hand the result to ``run_upkeep`` (any thread), then
        ``upkeep_done`` (the writing thread again). At most one upkeep at a time."""
        fsync_due = (self._dirty_since_ms is not None and self.settings.flush_tx_log_at_commit is FlushTxLog.EVERY_SECOND
                     and now_ms - self._dirty_since_ms >= EVERY_SECOND_MS)
        checkpoint = checkpoint or now_ms - self._last_checkpoint_ms >= self.settings.checkpoint_interval_ms
        if not (fsync_due or checkpoint):
            return None
        body = None
        if checkpoint:
            # Invariant: checkpoint n covers exactly the redo files below n. The branches are
            # serialized and the redo file rotated in one step, with no record in between, so
            # every record after this body goes to redo file n.
            body = json.dumps({"version": _VERSION, "branches": self.branches}, sort_keys=True).encode()
            self._retired.append(self._redo)  # fsynced by the upkeep (and any sync meanwhile), closed after it
            self._redo_number += 1
            self._redo = open(self.directory / _redo_name(self._redo_number), "ab", opener=private_opener)
            self._last_checkpoint_ms = now_ms
        # Every write before now is covered by the fsync below (of the current file, or of the
        # retired one the checkpoint covers); a later write marks the journal dirty again.
        dirty_since, self._dirty_since_ms = self._dirty_since_ms, None
        return Upkeep(self.sync_handle(), None if body is None else (self._redo_number, body), dirty_since)

    def run_upkeep(self, upkeep: "Upkeep") -> None:
        """The slow part (fsyncs, the checkpoint file, pruning): safe in a worker thread, it
        touches no file the writing thread appends to but through its own descriptors."""
        self.fsync_handle(upkeep.sync)
        if upkeep.checkpoint is None:
            return
        number, body = upkeep.checkpoint
        # After the redo files it covers are fsynced: a crash finds either this checkpoint or
        # the older one with every redo file it needs.
        write_crc_file(self.directory / _checkpoint_name(number), body, self._fsync)
        checkpoints = [entry for entry in _numbered(self.directory, _CHECKPOINT) if entry[0] <= number]
        for _n, old in checkpoints[: -self.settings.max_checkpoints]:
            old.unlink()
        oldest_kept = checkpoints[-self.settings.max_checkpoints:][0][0]
        for n, redo in _numbered(self.directory, _REDO):
            if n < oldest_kept:
                redo.unlink()
        fsync_directory(self.directory, self._fsync)

    def upkeep_done(self, upkeep: "Upkeep", *, ok: bool) -> None:
        """On the writing thread, after ``run_upkeep``: what it made durable counts now. A failed
        one keeps the retired files (every later sync fsyncs them again) and the dirty mark."""
        if not ok:
            if upkeep.dirty_since_ms is not None and self._dirty_since_ms is None:
                self._dirty_since_ms = upkeep.dirty_since_ms
            return
        self.synced(upkeep.sync)
        for retired in upkeep.sync.retired:
            self._retired.remove(retired)
            retired.close()

    def sync_handle(self) -> "SyncHandle":
        """For an fsync on another thread: duplicates of the descriptors of the redo file and of
        those a checkpoint retired and whose fsync has not finished (they stay valid across a
        rotation), and the count of decisions written so far, which that fsync makes durable.
        Pass it to ``fsync_handle``."""
        files = [*self._retired, self._redo]
        return SyncHandle([os.dup(f.fileno()) for f in files], self.decisions_written, tuple(self._retired),
                          self.directory if self._retired else None)

    def synced(self, handle: "SyncHandle") -> None:
        """On the writing thread, after ``fsync_handle(handle)`` returned: its decisions are durable."""
        self.decisions_synced = max(self.decisions_synced, handle.covered)

    def fsync_handle(self, handle: "SyncHandle") -> None:
        """fsync (and close) a ``sync_handle``'s descriptors: safe in a worker thread, the event loop
        only appends whole lines to the files. While a rotation is unfinished the directory too:
        a decision in the new redo file is durable only with that file's name."""
        try:
            for fd in handle.fds:
                self._fsync(fd)
            if handle.directory is not None:
                fsync_directory(handle.directory, self._fsync)
        finally:
            for fd in handle.fds:
                os.close(fd)

    def close(self) -> None:
        for retired in self._retired:
            self._fsync(retired.fileno())
            retired.close()
        self._retired.clear()
        if not self._redo.closed:
            self._fsync(self._redo.fileno())
            self._redo.close()


class SyncHandle(NamedTuple):
    """``TxLog.sync_handle``: what one fsync off the writing thread covers."""

    fds: list[int]  # duplicates, closed by ``fsync_handle``
    covered: int  # decisions durable once they are fsynced
    retired: tuple[BinaryIO, ...]  # redo files a checkpoint rotated out, closed once fsynced
    directory: Path | None  # fsynced too while a rotation's new file name may not be durable yet


class Upkeep(NamedTuple):
    """``TxLog.begin_upkeep``: a mode-2 fsync and/or a checkpoint, to run off the writing thread."""

    sync: SyncHandle
    checkpoint: tuple[int, bytes] | None  # (its number: the first redo file it does not cover, body)
    dirty_since_ms: int | None  # the dirty mark the fsync clears (restored if it fails)


def _load_checkpoint(directory: Path) -> tuple[Branches, int]:
    for n, path in reversed(_numbered(directory, _CHECKPOINT)):
        try:
            body = json.loads(read_crc_file(path) or b"null")
        except ValueError:  # DamagedFile, or a body that is not JSON
            body = None
        if isinstance(body, dict) and body.get("version") == _VERSION:
            return body["branches"], n
        log.warning("%s: damaged transaction checkpoint skipped; trying an older one", path)
    return {}, 0


def _replay(path: Path, branches: Branches) -> None:
    """Apply one redo file up to its first torn or damaged line, and cut the file there.

    Only the newest file can end torn (every open starts a new one), so the cut
    loses nothing that was complete; it keeps later files replayable after it.
    """
    good = 0
    with open(path, "rb") as handle:
        for line in handle:
            entry = _decode_line(line)
            if entry is None:
                break
            if entry["branch"] is None:
                branches.pop(entry["xid"], None)
            else:
                branches[entry["xid"]] = entry["branch"]
            good += len(line)
    size = path.stat().st_size
    if good < size:
        log.warning("%s: %d bytes after offset %d are a torn or damaged entry; cut off", path, size - good, good)
        os.truncate(path, good)


