"""A short-lived ZooKeeper session for tools (cluster, verify, drill, tests)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from kazoo.client import KazooClient

from ..errors import MetaqError


class ZooKeeperUnreachable(MetaqError):
    """ZooKeeper did not answer in time."""


@contextlib.contextmanager
def zk_session(connect: str, timeout: float = 10.0) -> Iterator[KazooClient]:
    """A connected kazoo client, closed on exit; ZooKeeperUnreachable if it cannot connect."""
    client = KazooClient(hosts=connect, timeout=timeout)
    try:
        client.start(timeout=timeout)
    except Exception as exc:
        client.close()
        raise ZooKeeperUnreachable(f"cannot reach ZooKeeper at {connect}: {exc or 'timed out'}") from None
    try:
        yield client
    finally:
        client.stop()
        client.close()
