"""Small state files guarded by a CRC: ``{crc32}\\n{body}``, replaced atomically.

The snapshot of a partition's transaction state and the transaction journal's
checkpoints are such files. A write goes to a temporary file that is fsynced and
renamed over the old one, so a crash leaves either the old file or the new one;
a body whose CRC does not match (a damaged disk, a hand edit) reads as damaged.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Callable

from metaq.private_files import private_opener


class DamagedFile(ValueError):
    """The file exists but its CRC line does not match its body."""


def write_crc_file(path: Path, body: bytes, fsync: Callable[[int], None] = os.fsync) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb", opener=private_opener) as handle:
        handle.write(b"%d\n" % zlib.crc32(body) + body)
        handle.flush()
        fsync(handle.fileno())
    os.replace(tmp, path)


def read_crc_file(path: Path) -> bytes | None:
    """The body; None if there is no file; DamagedFile if the CRC does not match."""
    try:
        crc_line, _, body = path.read_bytes().partition(b"\n")
    except FileNotFoundError:
        return None
    if not crc_line.isdigit() or int(crc_line) != zlib.crc32(body):
        raise DamagedFile(f"{path}: checksum mismatch")
    return body
