"""The power-loss tool (chaos/power_loss.py + chaos/powerloss/shim.c) against a known
write/fsync sequence: a tiny program run with the shim preloaded does the same system
calls the store does (os.open + os.pwrite + os.fsync, file objects, os.replace, mkdir,
directory fsync, ftruncate), is SIGKILLed, and the disk must then hold exactly what
was fsynced."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chaos.power_loss import PowerLossDisk, build_shim

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shim is for glibc on Linux")

# Each step prints a line once done, so the test knows where the program is before killing it.
PROGRAM = textwrap.dedent(
    """
    import os, sys, time
    root = sys.argv[1]
    def dir_fsync(path):
        fd = os.open(path, os.O_RDONLY); os.fsync(fd); os.close(fd)

    os.mkdir(os.path.join(root, "synced-dir"))
    dir_fsync(root)

    seg = os.open(os.path.join(root, "synced-dir", "seg"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    dir_fsync(os.path.join(root, "synced-dir"))
    os.pwrite(seg, b"a" * 100, 0)
    os.fsync(seg)                         # 100 durable
    os.pwrite(seg, b"b" * 50, 100)        # lost
    with open(os.path.join(root, "synced-dir", "journal"), "ab") as j:
        j.write(b"x" * 10); j.flush(); os.fdatasync(j.fileno())   # 10 durable
        j.write(b"y" * 5); j.flush()                                # lost
    # the existing file 'old' (40 bytes, durable before the program ran): cut, then appended
    old = os.open(os.path.join(root, "old"), os.O_RDWR)
    os.ftruncate(old, 30); os.pwrite(old, b"z" * 20, 30)           # durable: 30
    # the existing file 'redo' (40 bytes): cut by name (os.truncate, as the transaction journal does), appended
    os.truncate(os.path.join(root, "redo"), 25)
    with open(os.path.join(root, "redo"), "ab") as r:
        r.write(b"r" * 9)                                           # durable: 25
    # a file never fsynced, in a synced directory: empty after the loss
    with open(os.path.join(root, "synced-dir", "never"), "wb") as f:
        f.write(b"n" * 7)
    dir_fsync(os.path.join(root, "synced-dir"))
    # checkpoint-style replace: durable one (dir fsynced), and one without the dir fsync
    for name, body, durable in (("cp-durable", b"new1", True), ("cp-lazy", b"new2", False)):
        with open(os.path.join(root, name + ".tmp"), "wb") as f:
            f.write(body); f.flush(); os.fsync(f.fileno())
        os.replace(os.path.join(root, name + ".tmp"), os.path.join(root, name))
        if durable:
            dir_fsync(root)
    # a directory made after the last fsync of its parent: vanishes with what it holds
    os.mkdir(os.path.join(root, "unsynced-dir"))
    open(os.path.join(root, "unsynced-dir", "inner"), "wb").close()
    # a file created with no directory fsync after it: vanishes even though it was fsynced
    with open(os.path.join(root, "orphan"), "wb") as f:
        f.write(b"o"); f.flush(); os.fsync(f.fileno())
    print("done", flush=True)
    time.sleep(60)
    """
)


def test_power_loss_keeps_exactly_what_was_fsynced(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "old").write_bytes(b"o" * 40)
    (root / "redo").write_bytes(b"d" * 40)
    (root / "cp-durable").write_bytes(b"old1")
    (root / "cp-lazy").write_bytes(b"old2")
    disk = PowerLossDisk(root, tmp_path / "powerloss", build_shim(tmp_path / "shim"))
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(root)], env={**os.environ, **disk.env()}, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        # Before the loss every byte written is there (the page cache).
        assert (root / "synced-dir" / "seg").stat().st_size == 150
        assert disk.unsynced_bytes() == 50 + 5 + 20 + 9 + 7  # what the loss below must cut
    finally:
        proc.kill()
        proc.wait()
    report = disk.lose_power()

    assert (root / "synced-dir" / "seg").read_bytes() == b"a" * 100
    assert (root / "synced-dir" / "journal").read_bytes() == b"x" * 10
    assert (root / "old").read_bytes() == b"o" * 30
    assert (root / "redo").read_bytes() == b"d" * 25
    assert (root / "synced-dir" / "never").read_bytes() == b""
    assert (root / "cp-durable").read_bytes() == b"new1"
    assert (root / "cp-lazy").read_bytes() == b"old2"  # the rename is undone, the old file is back
    # ...and the temporary file, created after the last fsync of its directory, vanishes too
    assert not (root / "cp-lazy.tmp").exists()
    assert not (root / "orphan").exists()
    assert not (root / "unsynced-dir").exists()
    assert (root / "synced-dir").is_dir()
    assert report.bytes_lost == 50 + 5 + 20 + 9 + 7  # the orphan's byte was fsynced: it is its name that is lost
    assert sorted(report.vanished) == ["cp-lazy.tmp", "orphan", "unsynced-dir", "unsynced-dir/inner"]
    assert report.renames_undone == [("cp-lazy", "cp-lazy.tmp")]


def test_a_second_loss_starts_from_what_survived_the_first(tmp_path: Path) -> None:
    """After ``lose_power`` the disk is re-armed: what is there now counts as durable."""
    root = tmp_path / "root"
    disk = PowerLossDisk(root, tmp_path / "powerloss", build_shim(tmp_path / "shim"))
    (root / "f").write_bytes(b"12345")
    disk.arm()
    program = "import os,sys; fd=os.open(sys.argv[1], os.O_WRONLY|os.O_APPEND); os.write(fd, b'678'); os.fsync(fd); os.write(fd, b'9')"
    subprocess.run([sys.executable, "-c", program, str(root / "f")], env={**os.environ, **disk.env()}, check=True)
    assert disk.lose_power().truncated == {"f": (9, 8)}
    assert (root / "f").read_bytes() == b"12345678"
    assert disk.lose_power().truncated == {}


def test_an_fsync_still_in_flight_at_the_power_loss_keeps_nothing(tmp_path: Path) -> None:
    """``slow_fsyncs`` (here only of ``*.log`` files): the power is cut while that fsync
    sleeps, so its bytes are lost; another file's quick fsync still counts."""
    root = tmp_path / "root"
    disk = PowerLossDisk(root, tmp_path / "powerloss", build_shim(tmp_path / "shim"))
    (root / "f.log").write_bytes(b"")
    (root / "quick").write_bytes(b"")
    disk.arm()
    disk.slow_fsyncs(60_000, ".log")
    program = (
        "import os,sys\n"
        "q=os.open(sys.argv[2], os.O_WRONLY|os.O_APPEND); os.write(q, b'kept'); os.fsync(q)\n"
        "fd=os.open(sys.argv[1], os.O_WRONLY|os.O_APPEND); os.write(fd, b'unsynced')\n"
        "print('fsyncing', flush=True); os.fsync(fd)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", program, str(root / "f.log"), str(root / "quick")],
                            env={**os.environ, **disk.env()}, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "fsyncing"
        time.sleep(0.2)  # into the fsync's sleep
        assert proc.poll() is None, "the slow fsync returned"
    finally:
        proc.kill()
        proc.wait()
    assert disk.lose_power().truncated == {"f.log": (8, 0)}
    assert (root / "quick").read_bytes() == b"kept"
    assert not disk.slow_flag.exists()  # the next run of the process has a normal disk


def test_a_replace_in_a_directory_deleted_since_is_not_undone_there(tmp_path: Path) -> None:
    """A checkpoint replaced without a directory fsync, then its whole directory deleted (a
    topic deleted by the chaos topic operations): the deletion is durable at once, so the
    loss does not put the replaced file back into a directory that is gone (before: the tool
    raised FileNotFoundError and ended a campaign run, seed 2040)."""
    root = tmp_path / "root"
    (root / "side-2").mkdir(parents=True)
    (root / "side-2" / "cp").write_bytes(b"old")
    disk = PowerLossDisk(root, tmp_path / "powerloss", build_shim(tmp_path / "shim"))
    program = textwrap.dedent(
        """
        import os, shutil, sys
        d = os.path.join(sys.argv[1], "side-2")
        with open(os.path.join(d, "cp.tmp"), "wb") as f:
            f.write(b"new"); f.flush(); os.fsync(f.fileno())
        os.replace(os.path.join(d, "cp.tmp"), os.path.join(d, "cp"))
        shutil.rmtree(d)
        """
    )
    subprocess.run([sys.executable, "-c", program, str(root)], env={**os.environ, **disk.env()}, check=True)
    disk.lose_power()
    assert not (root / "side-2").exists()


def test_a_deleted_directory_s_undone_renames_stay_out_of_the_one_re_created_at_its_path(tmp_path: Path) -> None:
    """A topic deleted (its partition directory renamed aside, then removed) and re-created at
    once (a new directory of the same name, synced in its parent), then the power cut: the old
    directory's unsynced checkpoint replace is of files that are gone, so its undo must not put
    the replaced checkpoint into the new directory. Before: the old life's flushed-end
    checkpoint came back into the new, empty partition directory, and the broker refused the
    partition at start ("log end went backwards: offsets up to 205 were flushed, but it has no
    segment files"), a state no real disk reaches: the old directory's files were unlinked."""
    root = tmp_path / "root"
    (root / "side-0").mkdir(parents=True)
    (root / "side-0" / "flushed-end-checkpoint").write_bytes(b"0\n205\n")
    disk = PowerLossDisk(root, tmp_path / "powerloss", build_shim(tmp_path / "shim"))
    program = textwrap.dedent(
        """
        import os, shutil, sys
        root = sys.argv[1]
        def dir_fsync(path):
            fd = os.open(path, os.O_RDONLY); os.fsync(fd); os.close(fd)
        old = os.path.join(root, "side-0")
        with open(os.path.join(old, "flushed-end-checkpoint.tmp"), "wb") as f:
            f.write(b"0\\n369\\n"); f.flush(); os.fsync(f.fileno())
        os.replace(os.path.join(old, "flushed-end-checkpoint.tmp"), os.path.join(old, "flushed-end-checkpoint"))
        os.rename(old, os.path.join(root, "side-0.deleted-1"))        # the topic deleted...
        shutil.rmtree(os.path.join(root, "side-0.deleted-1"))
        os.mkdir(old)                                                  # ...and re-created
        dir_fsync(root)
        with open(os.path.join(old, "00000000000000000000.meta"), "wb") as f:
            f.write(b"x" * 41)                                          # never synced
        """
    )
    subprocess.run([sys.executable, "-c", program, str(root)], env={**os.environ, **disk.env()}, check=True)
    report = disk.lose_power()
    assert (root / "side-0").is_dir()
    assert sorted(os.listdir(root / "side-0")) == []
    assert not (root / "side-0.deleted-1").exists()
    assert "side-0/00000000000000000000.meta" in report.vanished
