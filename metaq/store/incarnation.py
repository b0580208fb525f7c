"""Which life of a topic a partition directory holds, and removing a deleted topic's files.

A topic's incarnation (metaq/zk/topic_config.py) is written into each of its partition
directories as ``{dataPath}/{topic}-{n}/incarnation`` when the log is opened. The rule
(``belongs``): a directory whose marker names another incarnation holds the files of a
deleted topic of the same name and is never served again; it is removed before a log of
the new incarnation is opened there. A directory without a marker (written before
incarnations existed) and a topic without one ("") are kept: nothing is removed on a guess.

Removal is in two steps so that a new log can open at once: the directory is renamed
aside (``{topic}-{n}.deleted-{stamp}``, on the event loop: one ``rename``), then deleted
in a worker thread; ``sweep`` deletes what a crash left renamed.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from metaq.config import TopicConfig
from metaq.private_files import private_opener

log = logging.getLogger(__name__)

MARKER = "incarnation"
#: ``{topic}-{n}`` + this + a stamp: a directory of a deleted partition, being removed.
DELETED_SUFFIX = ".deleted-"


def ended(before: TopicConfig, after: TopicConfig | None) -> bool:
    """Whether a topic's life ended between two topic maps: deleted, or re-created as a new
    incarnation. A change from or to "" is no end: a server.ini topic (no id) that the group's
    configuration names, or a writer that does not know ids; the markers decide then (``belongs``)."""
    if after is None:
        return True
    return before.incarnation != "" and after.incarnation != "" and after.incarnation != before.incarnation


def same_life(theirs: str, ours: str) -> bool:
    """Whether a peer's report of a topic (a replica fetch, a heartbeat's log end) is of the life
    we serve: a topic without an incarnation on either side (defined in a config file, not
    created at run time) has one life."""
    return not theirs or not ours or theirs == ours


def read_marker(directory: Path) -> str | None:
    try:
        return (directory / MARKER).read_text().strip()
    except FileNotFoundError:
        return None


def write_marker(directory: Path, incarnation: str) -> None:
    """Record the incarnation the directory's files belong to (no-op for "" or if already there)."""
    if not incarnation or read_marker(directory) == incarnation:
        return
    tmp = directory / f"{MARKER}.tmp"
    with open(tmp, "w", opener=private_opener) as out:
        out.write(incarnation + "\n")
    os.replace(tmp, directory / MARKER)


def belongs(directory: Path, incarnation: str) -> bool:
    """False only if the directory's marker names another incarnation than ``incarnation``."""
    if not incarnation:
        return True
    marker = read_marker(directory)
    return marker is None or marker == incarnation


def move_aside(directory: Path) -> Path | None:
    """Rename a partition directory out of the way of a new log; None if there is none."""
    target = directory.with_name(f"{directory.name}{DELETED_SUFFIX}{time.time_ns()}")
    try:
        os.rename(directory, target)
    except FileNotFoundError:
        return None
    return target


def remove(path: Path) -> None:
    """Delete a directory moved aside (blocking: run it in a thread)."""
    shutil.rmtree(path, ignore_errors=True)
    log.info("deleted %s", path)


def sweep(data_path: Path) -> None:
    """Delete directories a crash left moved aside under ``data_path``."""
    if not data_path.is_dir():
        return
    for path in data_path.iterdir():
        if DELETED_SUFFIX in path.name and path.is_dir():
            remove(path)
