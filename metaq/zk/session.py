"""A short-lived ZooKeeper session for tools (cluster, verify, drill, tests).

Reading needs no credentials (every node the project creates is world-readable); a
broker-side caller that writes passes its ``ZkSecurity`` (metaq/zk/acl.py) to log in
with the group's digest credentials and create nodes with the group's ACL by default.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from kazoo.client import KazooClient

from ..errors import MetaqError
from .acl import ZkSecurity, client_kwargs
from .tls import ZkTls, describe_connect_failure, make_kazoo_client


class ZooKeeperUnreachable(MetaqError):
    """ZooKeeper did not answer in time."""


@contextlib.contextmanager
def zk_session(connect: str, timeout: float = 10.0, *, security: ZkSecurity | None = None,
               tls: ZkTls | None = None) -> Iterator[KazooClient]:
    """A connected kazoo client, closed on exit; ZooKeeperUnreachable if it cannot connect.

    ``tls`` None: the METAQ_ZK_TLS_* environment decides (metaq/zk/tls.py).
    """
    client = make_kazoo_client(connect, tls=tls, timeout=timeout, **client_kwargs(security))
    try:
        client.start(timeout=timeout)
    except Exception as exc:
        client.close()
        raise ZooKeeperUnreachable(describe_connect_failure(connect, exc, tls)) from None
    try:
        yield client
    finally:
        client.stop()
        client.close()
