"""Power loss for one process: everything it wrote under a directory and did not fsync is lost.

How (see docs/chaos-internals.md, "Power loss: the shim"): the process runs with
``chaos/powerloss/shim.c`` preloaded (``LD_PRELOAD``), which journals, for files under
``root``, every fsync and fdatasync (with the file's size when the call began), ftruncate,
file creation, mkdir, rename (with a copy of any file the rename replaced) and directory
fsync. After the process is SIGKILLed, ``lose_power()`` replays the journal against what
is on disk:

* data: each file is cut to its size at its last fsync (``S``), or at a later ftruncate
  if that is shorter; a file created since ``arm()`` and never fsynced is cut to 0 bytes.
  Appends are lost from the end, which is what a power loss does to an append-only file.
* names: a creation, mkdir or rename whose parent directory was not fsynced afterwards
  is undone, newest first: the created file or directory vanishes, the renamed file
  goes back to its old name and the file it replaced comes back from the stash. A line's
  path names what was there then: a directory renamed or made at that path since (a topic
  deleted and re-created) is another one, and the old one's undone renames stay out of it.

Limits, on purpose (each errs toward keeping *more* than a real disk might, never less,
except the first): an unlink counts as durable at once (a deleted file never comes
back); overwrites in place inside the synced length are not reverted (metaq's store
only appends, truncates and replaces whole files by rename); a power loss loses
*all* unsynced bytes (a real disk may keep some: the worst case is the one tested);
files and directories outside ``root`` and writes through mmap are not seen.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SHIM_SOURCE = Path(__file__).with_name("powerloss") / "shim.c"


def build_shim(cache_dir: Path) -> Path:
    """Compile the shim with gcc into ``cache_dir`` (once per source version); its path."""
    source = SHIM_SOURCE.read_bytes()
    library = Path(cache_dir) / f"powerloss-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(".partial")
        command = ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wno-format-truncation", "-o", str(partial), str(SHIM_SOURCE), "-ldl"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the power-loss shim failed: {result.stderr.strip()}")
        os.replace(partial, library)
    return library


@dataclass
class PowerLossReport:
    """What one power loss took away (paths relative to the root)."""

    truncated: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (size before, size after)
    vanished: list[str] = field(default_factory=list)  # created files and directories undone
    renames_undone: list[tuple[str, str]] = field(default_factory=list)  # (new name, old name)

    @property
    def bytes_lost(self) -> int:
        return sum(before - after for before, after in self.truncated.values())

    def __str__(self) -> str:
        cut = ", ".join(f"{p} {b}->{a}" for p, (b, a) in sorted(self.truncated.items()))
        return f"lost {self.bytes_lost} bytes [{cut}]; vanished {self.vanished}; renames undone {self.renames_undone}"


class PowerLossDisk:
    """The files under ``root`` as a power loss would leave them: journal, then ``lose_power()``."""

    def __init__(self, root: Path, work_dir: Path, shim: Path) -> None:
        self.root = Path(os.path.realpath(root))
        self.work_dir = Path(work_dir)
        self.journal = self.work_dir / "journal.tsv"
        self.stash = self.work_dir / "stash"
        self.slow_flag = self.work_dir / "slow-fsync"
        self.shim = shim
        self._durable_sizes: dict[int, int] = {}
        self.arm()

    def env(self) -> dict[str, str]:
        """Environment for the process whose writes are to be journalled."""
        return {
            "LD_PRELOAD": str(self.shim),
            "POWERLOSS_ROOT": str(self.root),
            "POWERLOSS_JOURNAL": str(self.journal),
            "POWERLOSS_STASH": str(self.stash),
            "POWERLOSS_SLOW_FSYNC": str(self.slow_flag),
        }

    def slow_fsyncs(self, milliseconds: int | None, suffix: str = "") -> None:
        """From now on each fsync of the process takes ``milliseconds`` longer (None: normal again);
        with ``suffix``, only of files whose name ends with it (e.g. ``.meta``: segments only).

        The fsync's bytes stay unsynced meanwhile, so a power loss then takes them: the way to
        cut the power while an fsync is in flight.
        """
        if milliseconds is None:
            self.slow_flag.unlink(missing_ok=True)
        else:
            # Whole or absent, never empty: the shim reads the flag at every fsync, and one
            # reading it between write_text's truncate and its write took it for "not slow".
            partial = self.slow_flag.with_name(self.slow_flag.name + ".partial")
            partial.write_text(f"{milliseconds} {suffix}".strip())
            os.replace(partial, self.slow_flag)

    def arm(self) -> None:
        """Take what is on disk now as durable and start a new journal.

        Call it only while no journalled process runs (before it starts, after it is killed).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.stash, ignore_errors=True)
        self.stash.mkdir(parents=True)
        self.journal.write_bytes(b"")
        self._durable_sizes = {st.st_ino: st.st_size for st in (p.stat() for p in self._files())}

    def _files(self) -> list[Path]:
        return [p for p in self.root.rglob("*") if p.is_file() and not p.is_symlink()]

    def _replay(self) -> tuple[dict[int, int], dict[str, int], list[tuple[int, list[str]]]]:
        """From the journal: synced size by inode, last fsync (sequence) by directory, name events."""
        synced = dict(self._durable_sizes)
        directory_synced_at: dict[str, int] = {}
        names: list[tuple[int, list[str]]] = []  # (sequence, event) for C, M, R
        for sequence, line in enumerate(self.journal.read_text().splitlines()):
            kind, *args = line.split("\t")
            if kind == "C":
                synced[int(args[0])] = 0
                names.append((sequence, [kind, args[1]]))
            elif kind == "S":
                synced[int(args[0])] = int(args[1])
            elif kind == "T":
                ino = int(args[0])
                synced[ino] = min(synced.get(ino, 0), int(args[1]))
            elif kind == "D":
                directory_synced_at[args[0]] = sequence
            elif kind in ("M", "R"):
                names.append((sequence, [kind, *args]))
        return synced, directory_synced_at, names

    def _unsynced(self, synced: dict[int, int]) -> dict[Path, tuple[int, int]]:
        """Files longer than what was fsynced of them: path -> (size, synced size)."""
        found = {}
        for path in self._files():
            st = path.stat()
            keep = synced.get(st.st_ino)
            if keep is not None and st.st_size > keep:
                found[path] = (st.st_size, keep)
        return found

    def unsynced_bytes(self, suffix: str = "") -> int:
        """How many bytes a power loss now would cut (of files ending with ``suffix``); the process may run."""
        unsynced = self._unsynced(self._replay()[0])
        return sum(size - keep for path, (size, keep) in unsynced.items() if path.name.endswith(suffix))

    def lose_power(self) -> PowerLossReport:
        """Apply the loss to the disk (the process must be dead already), then ``arm()`` again."""
        report = PowerLossReport()
        synced, directory_synced_at, names = self._replay()
        for path, (size, keep) in self._unsynced(synced).items():
            os.truncate(path, keep)
            report.truncated[self._relative(path)] = (size, keep)
        # Newest first, so each event is undone on the disk as later events left it. A path names
        # what was there when the event happened: a directory renamed or made at a path since
        # stands for another one (``_DirectoryLives``).
        lives = _DirectoryLives()
        for sequence, (kind, *args) in reversed(names):
            paths = lives.resolve(args[:1]) if kind in ("C", "M") else lives.resolve(args[:2], name_first=True)
            if paths is None:
                continue  # under a directory that is gone (its files unlinked, durable at once)
            entry = paths[0] if kind in ("C", "M") else paths[1]
            moved_back = False
            if directory_synced_at.get(os.path.dirname(entry), -1) < sequence:  # else the name is durable
                moved_back = self._undo(kind, [*paths, *args[len(paths):]], report)
            if kind == "M":
                lives.made(paths[0])
            elif kind == "R":
                lives.renamed(*paths, back=moved_back)
        self.slow_fsyncs(None)
        self.arm()
        return report

    def _undo(self, kind: str, args: list[str], report: PowerLossReport) -> bool:
        """Undo one name event; True if it was a rename and its file went back to its old name."""
        moved_back = False
        if kind == "C" and os.path.isfile(args[0]):
            os.unlink(args[0])
            report.vanished.append(self._relative(Path(args[0])))
        elif kind == "M" and os.path.isdir(args[0]):
            shutil.rmtree(args[0])
            report.vanished.append(self._relative(Path(args[0])))
        elif kind == "R":
            old, new, stash = args
            if os.path.exists(new) and os.path.isdir(os.path.dirname(old)):
                os.rename(new, old)
                moved_back = True
            # The replaced file comes back, unless its directory is gone since (a topic deleted:
            # an unlink counts as durable at once, see the module docstring).
            if stash != "-" and os.path.isdir(os.path.dirname(new)):
                shutil.copyfile(self.stash / stash, new)
            report.renames_undone.append((self._relative(Path(new)), self._relative(Path(old))))
        return moved_back

    def _relative(self, path: Path) -> str:
        return os.path.relpath(path, self.root)


class _DirectoryLives:
    """Which directory an older journal line's path stands for, walking the journal newest first.

    A partition directory deleted and re-created (topic operations) leaves lines of two lives
    under one path. A ``mkdir`` of P says that before it nothing was at P: lines under P older
    than it are of an earlier directory, renamed away or deleted before. A rename of P to Q
    says that older lines under P are of what is now at Q (or at P again, if the rename was
    undone). Without this, the undo of an old life's checkpoint replace put the replaced file
    into the new directory of the same name: a state no disk reaches, since the old
    directory's files were unlinked.
    """

    def __init__(self) -> None:
        self._now_at: dict[str, str | None] = {}  # path -> where its older lines' directory is (None: gone)

    def resolve(self, paths: list[str], name_first: bool = False) -> list[str] | None:
        """Where what ``paths`` named is now; None if it lies in a directory that is gone. With
        ``name_first`` (a rename's old path) the first one is a name to give back, not a thing:
        only its directory is looked up."""
        resolved = []
        for index, path in enumerate(paths):
            where = self._where(path, itself=not (name_first and index == 0))
            if where is None:
                return None
            resolved.append(where)
        return resolved

    def _where(self, path: str, itself: bool) -> str | None:
        at = path if itself else os.path.dirname(path)
        while at not in ("", os.sep):
            if at in self._now_at:
                moved = self._now_at[at]
                return None if moved is None else moved + path[len(at):]
            at = os.path.dirname(at)
        return path

    def made(self, path: str) -> None:
        self._now_at[path] = None

    def renamed(self, old: str, new: str, back: bool) -> None:
        self._now_at[old] = old if back else new
