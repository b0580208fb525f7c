"""Can this broker keep its logs where its configuration says? Checked before it joins a group.

A broker whose data directories cannot be created or written would otherwise
register, win the master lock, and then fail to open every log: a master that
serves nothing while its group has no other. So ``check_data_dirs`` runs before
the broker listens or registers, and turns the first unusable directory into one
clear line (the broker then exits non-zero).
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import Iterable

from ..config import ConfigError, TopicConfig
from ..private_files import fsync_directory, make_private_dir, private_opener, tighten_dir

log = logging.getLogger(__name__)


def check_data_dirs(data_path: str, topics: Iterable[TopicConfig], where: str) -> None:
    """Raise ConfigError naming the first data directory that cannot be created or written."""
    for data_path in sorted({data_path} | {topic.data_path for topic in topics}):
        directory = Path(data_path)
        try:
            make_private_dir(directory)
            if tighten_dir(directory):
                log.info("dataPath %s: made owner-only (mode 0700); it was readable by other users", data_path)
            with tempfile.TemporaryFile(dir=directory, prefix=".write-check-"):
                pass
        except OSError as exc:
            raise ConfigError(
                f"{where}: dataPath {data_path} is not a writable directory ({exc.strerror or exc});"
                " fix dataPath or the directory's permissions, then start the broker again"
            ) from None
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ConfigError(f"{where}: dataPath {data_path} is not writable by this process")


IDENTITY_FILE = "broker-identity"


def broker_identity(data_path: str) -> str:
    """This broker's stable identity: a random id kept in ``{dataPath}/broker-identity``.

    It names the broker across restarts on another address (ZooKeeper records it with
    each epoch's leader), and it goes with the data: a broker whose data dir was wiped
    is a new broker, which must not pass for the last leader that held the acked log.
    """
    path = Path(data_path) / IDENTITY_FILE
    try:
        identity = path.read_text().strip()
        if identity:
            return identity
    except FileNotFoundError:
        pass
    identity = uuid.uuid4().hex
    make_private_dir(path.parent)
    staging = path.with_suffix(".tmp")
    with open(staging, "w", opener=private_opener) as out:
        out.write(identity + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(staging, path)
    fsync_directory(path.parent)  # else a power loss may leave no identity, or the staging file
    return identity
