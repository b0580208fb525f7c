"""The broker's transaction journal (metaq/txn/txlog.py): replay, checkpoints, flush modes."""

from __future__ import annotations

import os
from pathlib import Path

from metaq.txn.config import FlushTxLog, TxnSettings
from metaq.txn.txlog import DIRECTORY, TxLog


class Fsyncs:
    """Counts fsyncs of the redo files (and really runs them)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, fd: int) -> None:
        self.count += 1
        os.fsync(fd)


def files(base: Path, prefix: str) -> list[str]:
    return sorted(p.name for p in (base / DIRECTORY).iterdir() if p.name.startswith(prefix))


def test_branches_survive_a_reopen(tmp_path: Path) -> None:
    txlog = TxLog.open(tmp_path, TxnSettings(), 0)
    txlog.record("XID:1:aa:bb", {"state": "prepared", "partitions": ["t-0"]}, decision=True, now_ms=1)
    txlog.record("TX:1:0", {"state": "active"}, decision=False, now_ms=2)
    txlog.record("TX:1:0", None, decision=True, now_ms=3)
    txlog.close()
    again = TxLog.open(tmp_path, TxnSettings(), 10)
    assert again.branches == {"XID:1:aa:bb": {"state": "prepared", "partitions": ["t-0"]}}
    again.close()


def test_a_torn_last_line_is_cut_and_later_files_still_replay(tmp_path: Path) -> None:
    txlog = TxLog.open(tmp_path, TxnSettings(), 0)
    txlog.record("a", {"state": "idle"}, decision=False, now_ms=0)
    txlog.record("b", {"state": "idle"}, decision=False, now_ms=0)
    txlog.close()
    (redo,) = files(tmp_path, "redo.")
    path = tmp_path / DIRECTORY / redo
    whole = path.stat().st_size
    os.truncate(path, whole - 5)  # the crash tore the last line
    second = TxLog.open(tmp_path, TxnSettings(), 1)
    assert second.branches == {"a": {"state": "idle"}} and path.stat().st_size < whole - 5
    second.record("c", {"state": "prepared"}, decision=True, now_ms=2)
    second.close()
    assert TxLog.open(tmp_path, TxnSettings(), 3).branches == {"a": {"state": "idle"}, "c": {"state": "prepared"}}


def test_a_damaged_line_is_refused_by_its_crc(tmp_path: Path) -> None:
    txlog = TxLog.open(tmp_path, TxnSettings(), 0)
    txlog.record("a", {"state": "idle"}, decision=False, now_ms=0)
    txlog.close()
    path = tmp_path / DIRECTORY / files(tmp_path, "redo.")[0]
    path.write_bytes(path.read_bytes().replace(b"idle", b"IDLE"))
    assert TxLog.open(tmp_path, TxnSettings(), 1).branches == {}


def test_flush_at_commit_1_fsyncs_every_decision_and_nothing_else(tmp_path: Path) -> None:
    fsyncs = Fsyncs()
    txlog = TxLog.open(tmp_path, TxnSettings(flush_tx_log_at_commit=FlushTxLog.AT_COMMIT), 0, fsync=fsyncs)
    start = fsyncs.count
    txlog.record("a", {"state": "active"}, decision=False, now_ms=0)
    assert fsyncs.count == start
    txlog.record("a", {"state": "prepared"}, decision=True, now_ms=0)
    txlog.record("a", {"state": "committed"}, decision=True, now_ms=0)
    assert fsyncs.count == start + 2


def test_flush_mode_0_leaves_it_to_the_os_and_mode_2_fsyncs_a_second_later(tmp_path: Path) -> None:
    fsyncs = Fsyncs()
    os_mode = TxLog.open(tmp_path / "os", TxnSettings(flush_tx_log_at_commit=FlushTxLog.OS), 0, fsync=fsyncs)
    start = fsyncs.count
    os_mode.record("a", {"state": "committed"}, decision=True, now_ms=0)
    os_mode.tick(5000)
    assert fsyncs.count == start

    timed = TxLog.open(tmp_path / "timed", TxnSettings(flush_tx_log_at_commit=FlushTxLog.EVERY_SECOND), 0,
                       fsync=fsyncs)
    start = fsyncs.count
    timed.record("a", {"state": "committed"}, decision=True, now_ms=100)
    timed.record("b", {"state": "committed"}, decision=True, now_ms=600)
    timed.tick(1000)
    assert fsyncs.count == start
    timed.tick(1100)  # one second after the first unflushed write: one fsync covers both
    assert fsyncs.count == start + 1
    timed.tick(3000)
    assert fsyncs.count == start + 1


def test_checkpoints_every_interval_keep_the_newest_and_prune_old_redo_files(tmp_path: Path) -> None:
    settings = TxnSettings(max_checkpoints=2, checkpoint_interval_ms=1000)
    txlog = TxLog.open(tmp_path, settings, 0)
    for n in range(5):
        txlog.record(f"x{n}", {"state": "prepared"}, decision=True, now_ms=n * 1000)
        txlog.tick(n * 1000 + 999)  # not yet
        txlog.tick((n + 1) * 1000)
    assert files(tmp_path, "checkpoint.") == ["checkpoint.00000000000000000004.json",
                                              "checkpoint.00000000000000000005.json"]
    assert files(tmp_path, "redo.")[0] == "redo.00000000000000000004.log"
    txlog.record("x0", None, decision=True, now_ms=6000)
    txlog.close()
    assert set(TxLog.open(tmp_path, settings, 7000).branches) == {"x1", "x2", "x3", "x4"}


def test_a_damaged_newest_checkpoint_falls_back_to_an_older_one(tmp_path: Path) -> None:
    settings = TxnSettings(max_checkpoints=3)
    txlog = TxLog.open(tmp_path, settings, 0)
    txlog.record("a", {"state": "prepared"}, decision=True, now_ms=0)
    txlog.checkpoint(1)
    txlog.record("b", {"state": "prepared"}, decision=True, now_ms=2)
    txlog.checkpoint(3)
    txlog.close()
    newest = tmp_path / DIRECTORY / files(tmp_path, "checkpoint.")[-1]
    newest.write_bytes(newest.read_bytes()[:-3])
    assert set(TxLog.open(tmp_path, settings, 4).branches) == {"a", "b"}


def test_a_record_written_while_a_checkpoint_runs_goes_to_the_new_redo_file_and_survives(tmp_path: Path) -> None:
    """The broker's split checkpoint: serialized and rotated at once, written later elsewhere."""
    settings = TxnSettings(flush_tx_log_at_commit=FlushTxLog.AT_COMMIT, checkpoint_interval_ms=1000)
    txlog = TxLog.open(tmp_path, settings, 0)
    txlog.defer_decision_fsyncs = True
    txlog.record("before", {"state": "prepared"}, decision=True, now_ms=10)
    upkeep = txlog.begin_upkeep(1000)
    assert upkeep is not None and upkeep.checkpoint is not None
    txlog.record("during", {"state": "prepared"}, decision=True, now_ms=1001)  # after the body: not in it
    # A decision sync taken now also fsyncs the retired file "before" is in (and the directory).
    handle = txlog.sync_handle()
    assert len(handle.fds) == 2 and handle.directory is not None
    txlog.fsync_handle(handle)
    txlog.synced(handle)
    assert txlog.decisions_synced == txlog.decisions_written == 2
    txlog.run_upkeep(upkeep)
    txlog.upkeep_done(upkeep, ok=True)
    assert txlog.sync_handle().directory is None  # the rotation is finished
    assert files(tmp_path, "checkpoint.") == ["checkpoint.00000000000000000001.json"]
    txlog.close()
    assert set(TxLog.open(tmp_path, settings, 2000).branches) == {"before", "during"}


def test_a_failed_mode_2_fsync_keeps_the_journal_dirty_for_the_next_tick(tmp_path: Path) -> None:
    settings = TxnSettings(flush_tx_log_at_commit=FlushTxLog.EVERY_SECOND)
    txlog = TxLog.open(tmp_path, settings, 0)
    txlog.record("a", {"state": "committed"}, decision=True, now_ms=100)
    upkeep = txlog.begin_upkeep(1100)
    assert upkeep is not None and upkeep.checkpoint is None
    assert txlog.begin_upkeep(1200) is None  # nothing written since: nothing due
    txlog.upkeep_done(upkeep, ok=False)  # its fsync failed
    again = txlog.begin_upkeep(1200)
    assert again is not None
    txlog.run_upkeep(again)
    txlog.upkeep_done(again, ok=True)
    txlog.close()
