"""Open files: the broker's descriptor limit, raised at start, and what its partitions need.

Every segment of every partition log holds an open descriptor (metaq/store/segment.py), every
connection one, and the broker a few dozen of its own (ZooKeeper, UDP heartbeats, metrics,
journals, epoch files written and closed). A broker that runs out does not stop: it fails
each put, accept and file write with ``Too many open files`` (EMFILE), in places that were
never meant to fail, and an HA role change that reads a file loops on the error. So the
budget is checked where it can still be refused cleanly:

* at start (``raise_limit``): the soft ``RLIMIT_NOFILE`` goes up to the hard limit, and both
  are logged; then ``check_fits`` refuses to start, with one line naming the limit and what
  to raise, if the partitions to serve (server.ini's, then the group's topic configuration)
  cannot fit beside ``maxConnections`` connections;
* at a topic change (``Broker.update_topics``): a topic map that would not fit is not
  applied (one error line; the partitions served stay as they are), and ``metaq topics
  create|alter`` refuses before writing one (it reads each member's ``open_files_limit``
  and ``open_files_needed`` from its stats).

The estimate, per partition: its segment files on disk (at least one, the active segment),
plus ``HEADROOM_PERCENT`` of that over all partitions (segments rolled from now on, a
checkpoint or epoch file written beside a log).
"""

from __future__ import annotations

import logging
import os
import resource
from pathlib import Path
from typing import Iterable

from ..config import ConfigError, TopicConfig
from ..store.segment import SEGMENT_SUFFIX

log = logging.getLogger(__name__)

#: Descriptors a broker holds beside its partitions and clients: ZooKeeper sessions, UDP
#: heartbeats, the metrics server, journals and peers' replication connections, stdio.
BASE_DESCRIPTORS = 64
#: Beyond the partitions' segments on disk, this share of them again: segments rolled from
#: now on (every segment of a log stays open), checkpoint and epoch files written beside logs.
HEADROOM_PERCENT = 10


class TopicsDoNotFit(ConfigError):
    """A topic map whose partitions would not fit the open-file limit: not served."""


def raise_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one; returns ``(soft, hard)`` as now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else _nr_open()
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # e.g. a hard limit above the kernel's fs.nr_open
        log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
        return soft, hard
    return target, hard


def current_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _nr_open() -> int:
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        return 1024 * 1024


def segments_on_disk(topic: TopicConfig, name: str, partition: int) -> int:
    """How many segment files the partition has now (0: none yet)."""
    try:
        with os.scandir(Path(topic.data_path) / f"{name}-{partition}") as entries:
            return sum(1 for entry in entries if entry.name.endswith(SEGMENT_SUFFIX))
    except (FileNotFoundError, NotADirectoryError):
        return 0


def partition_descriptors(topics: dict[str, TopicConfig], known: dict[tuple[str, int], int] | None = None) -> int:
    """Descriptors the partitions of ``topics`` need; ``known`` gives the segment counts of
    partitions open now (no directory is listed for those)."""
    known = known or {}
    total = 0
    for name, topic in topics.items():
        for partition in range(topic.num_partitions):
            segments = known.get((name, partition))
            if segments is None:
                segments = segments_on_disk(topic, name, partition)
            total += max(1, segments)
    return with_headroom(total)


def with_headroom(segments: int) -> int:
    """Descriptors for ``segments`` open segments, with room for rolls and side files."""
    return segments + segments * HEADROOM_PERCENT // 100


def needed(topics: dict[str, TopicConfig], max_connections: int, known: dict[tuple[str, int], int] | None = None) -> int:
    """The open-file limit a broker serving ``topics`` with ``max_connections`` clients needs."""
    return BASE_DESCRIPTORS + max_connections + partition_descriptors(topics, known)


def partitions_of(topics: Iterable[TopicConfig]) -> int:
    return sum(topic.num_partitions for topic in topics)


def does_not_fit(topics: dict[str, TopicConfig], max_connections: int, limit: int,
                 known: dict[tuple[str, int], int] | None = None) -> str | None:
    """Why ``topics`` cannot be served within ``limit`` open files (None: they fit)."""
    if limit == resource.RLIM_INFINITY:
        return None
    want = needed(topics, max_connections, known)
    if want <= limit:
        return None
    return (f"{partitions_of(topics.values())} partitions and maxConnections={max_connections} need about {want} open"
            f" files, but the open-file limit (RLIMIT_NOFILE) is {limit}: raise the hard limit (ulimit -Hn, systemd"
            f" LimitNOFILE=, /etc/security/limits.conf nofile) to at least {want}, or serve fewer partitions"
            f" (docs/operations.md, 'Sizing')")
