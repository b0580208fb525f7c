"""Connections from one broker of a group to another (a slave to its master): TLS and authentication.

With security on, a slave trusts a master only once the SCRAM handshake has succeeded:
SCRAM is mutual, and the server's final signature proves it holds the group secret, so a
fake master registered in ZooKeeper (or a stray process at the master's address) fails
here, before a single byte of it is appended, truncated against or adopted as config.
Which broker is master is ZooKeeper's word (the master node, writable only by the group
with ZooKeeper ACLs on); this module proves the broker at that address is of the group.
"""

from __future__ import annotations

import asyncio

from ..addresses import parse_broker_url
from ..client.connection import BrokerConnection
from ..protocol.messages import TopicsRequest
from ..protocol.replies import ReplyError, TopicsReply
from .host import PeerCredentials


def member_name(slave_id: int | None) -> str:
    """How this broker names itself to its group (logged by the peer; the group secret is the proof)."""
    return f"slave{slave_id}" if slave_id is not None else "master"


async def open_peer(host: PeerCredentials, url: str, slave_id: int | None, timeout: float = 5.0) -> BrokerConnection:
    """A connection to the group's broker at ``url``, over TLS and authenticated when security is on.

    Raises ConnectionClosed (AuthenticationFailed when the peer is not a broker of our group).
    """
    address, port = parse_broker_url(url)
    security = host.security
    if not security.authentication_required:
        return await BrokerConnection.open(address, port, timeout, ssl=security.peer_client_context())
    return await BrokerConnection.open(
        address,
        port,
        timeout,
        ssl=security.peer_client_context(),
        authenticator=security.broker_authenticator(member_name(slave_id)),
    )


async def peer_topics(host: PeerCredentials, url: str, slave_id: int | None, timeout: float = 3.0) -> dict[str, int] | None:
    """The topics (name -> partitions) the group's broker at ``url`` serves, or None if it cannot answer now.

    Over ``open_peer``: with security on, a broker answers ``topics`` only to a principal
    that logged in (an anonymous ask gets 403, which read as "not serving it yet" and left
    a partition added at run time unreplicated), and only a peer that proved the group
    secret is believed.
    """
    try:
        conn = await open_peer(host, url, slave_id, timeout)
    except (OSError, ValueError):  # unreachable, restarting, or not of our group (AuthenticationFailed)
        return None
    try:
        return TopicsReply.of(await conn.request(TopicsRequest().to_header(), timeout=timeout)).topics
    except (OSError, ReplyError, asyncio.TimeoutError):  # gone mid-request, or refused: asked again later
        return None
    finally:
        conn.close()
