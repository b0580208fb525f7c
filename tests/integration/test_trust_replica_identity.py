"""A slave's replication requests are bound to its login (security on, real processes).

Every broker of a group knows the group secret, so a peer can log in as any member name;
what it may then do as a replica is tied to that name: a fetch, a position report or a
``news`` poll claiming ``slave_id`` k is served only on a connection logged in as
``broker:{brokerId}:slave{k}``. Anything else is refused (403) and logged by the master, and
never counts towards the sync set. One secured sync pair, as in test_trust_group_peers.py.
"""

from __future__ import annotations

from typing import Iterator

import msgpack
import pytest

from metaq.client.connection import BrokerConnection
from metaq.protocol.codes import FORBIDDEN, OK
from metaq.protocol.messages import GetRequest, NewsRequest, PositionRequest
from metaq.security.group import GroupSecret
from metaq.security.handshake import ClientAuthenticator

from .test_trust_group_peers import TOPIC, SecuredPair
from .trust_support import run


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredPair]:
    secured = SecuredPair(tmp_path_factory.mktemp("replica-identity"))
    try:
        yield secured.start()
    finally:
        secured.stop()


async def ask_as_member(pair: SecuredPair, member: str, header: dict, body: bytes = b""):  # noqa: ANN201
    group = GroupSecret.load(pair.group.secret_file, 0)
    conn = await BrokerConnection.open(*pair.master.address,
                                       authenticator=ClientAuthenticator(group.username(member), group.scram_password()))
    try:
        return await conn.request(header, body, timeout=30)
    finally:
        conn.close()


def epoch(pair: SecuredPair) -> int:
    return run(ask_as_member(pair, "slave0", {"op": "topics"}))["epoch"]


def test_replication_claiming_another_slaves_id_is_refused_and_logged(pair: SecuredPair) -> None:
    replica = {"slave_id": 0, "epoch": epoch(pair), "log_end": 0}
    requests = [
        GetRequest(topic=TOPIC, partition=0, offset=0, replica=replica).to_header(),
        PositionRequest(topic=TOPIC, partition=0, replica=replica).to_header(),
        NewsRequest(replica={"slave_id": 0, "epoch": replica["epoch"]}).to_header(),
    ]
    for header in requests:
        for member in ("slave1", "master"):  # a group member, but not slave0
            reply = run(ask_as_member(pair, member, header))
            assert reply.code == FORBIDDEN, (header["op"], member, reply.header)
            assert f"may not replicate as slave0" in reply.message
    assert "refused replication for slave0 from broker 'broker:0:slave1'" in pair.master.log_text()


def test_the_slaves_own_login_may_poll_news(pair: SecuredPair) -> None:
    current = epoch(pair)
    body = msgpack.packb([[TOPIC, 0, 0, 0, ""], ["no-such-topic", 0, 0, 0, ""]])
    reply = run(ask_as_member(pair, "slave0", NewsRequest(replica={"slave_id": 0, "epoch": current}).to_header(), body))
    assert reply.code == OK, reply.header
    # The unknown topic has news at once (its fetch hears what is wrong).
    assert ["no-such-topic", 0] in msgpack.unpackb(reply.body)
    bad = run(ask_as_member(pair, "slave0", NewsRequest(replica={"slave_id": 0, "epoch": current}).to_header(),
                            msgpack.packb([["t", "zero"]])))
    assert bad.code == 400 and "news: bad entry" in bad.message
