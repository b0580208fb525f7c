"""Reading and writing secret-bearing files: owner-only, atomically replaced."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from .errors import SecurityError


def read_private(path: str | Path, what: str) -> bytes:
    """The bytes of a file that holds secrets; refused if other users may read it (like ssh does)."""
    try:
        info = os.stat(path)
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SecurityError(f"{what} {path}: cannot read: {exc.strerror}") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecurityError(
            f"{what} {path}: readable by other users (mode {stat.S_IMODE(info.st_mode):04o}); run chmod 600 {path}"
        )
    return data


def write_private(path: str | Path, data: bytes, *, replace: bool = True) -> None:
    """Write ``data`` with mode 0600; an existing file is replaced atomically (or refused)."""
    target = Path(path)
    if not replace and target.exists():
        raise SecurityError(f"{target}: already exists; refusing to overwrite a secret")
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise SecurityError(f"{target}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as handle:  # mkstemp creates the file with mode 0600
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, target)
        else:
            os.link(tmp, target)  # fails if the target appeared meanwhile
            os.unlink(tmp)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise SecurityError(f"{target}: cannot write: {exc.strerror}") from None
