"""The pieces together over a real TLS socket on loopback, in the wire format: what the broker's
connection handler will do once wired (docs/security.md, "Wiring contract"), in miniature.

A small asyncio server speaks metaq frames, runs the ServerAuthenticator on ``auth`` requests
and asks the Authorizer about every other request; clients drive the ClientAuthenticator.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from pathlib import Path
from typing import Any

import pytest

from metaq.protocol.frames import Frame, FrameDecoder, encode_frame
from metaq.security import messages as m
from metaq.security.acl import Authorizer
from metaq.security.credentials import SecurityFile
from metaq.security.group import GroupSecret, write_group_secret
from metaq.security.handshake import Authenticated, ClientAuthenticator, Failed, SendReply, SendRequest, ServerAuthenticator
from metaq.security.tls import client_context, server_context
from metaq.server.authz import required_access
from tests.security_support import TestCA


class MiniBroker:
    """Authentication and authorization exactly as the wiring contract describes; no storage."""

    def __init__(self, users: SecurityFile, group: GroupSecret, tls: ssl.SSLContext) -> None:
        self.users, self.group, self.tls = users, group, tls
        self.group_scram = group.scram_secret()
        self.authorizer = Authorizer(group.broker_id, users.acls())
        self.failures: list[Exception] = []

    def lookup(self, name: str):  # type: ignore[no-untyped-def]
        return self.group_scram if self.group.accepts(name) else self.users.secret_for(name)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        auth = ServerAuthenticator(self.lookup, self.group.decoy_key())
        principal = None
        decoder = FrameDecoder()
        try:
            while data := await reader.read(65536):
                decoder.receive_data(data)
                while isinstance(event := decoder.next_event(), Frame):
                    header: dict[str, Any] = event.header
                    opaque = header.get("opaque", 0)
                    if header.get("op") == "auth":
                        close = False
                        for outcome in auth.receive(header):
                            if isinstance(outcome, SendReply):
                                writer.write(encode_frame(m.auth_reply(outcome.reply, opaque)))
                            elif isinstance(outcome, Authenticated):
                                principal = outcome.principal
                            elif isinstance(outcome, Failed):
                                self.failures.append(outcome.error)
                                close = True
                        await writer.drain()
                        if close:
                            return
                        continue
                    need = required_access(header)
                    reason = self.authorizer.denial(principal, *need) if need else None
                    reply = {"opaque": opaque, "code": 403, "msg": reason} if reason else {"opaque": opaque, "code": 200}
                    writer.write(encode_frame(reply))
                    await writer.drain()
        finally:
            writer.close()


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.decoder = reader, writer, FrameDecoder()
        self.opaques = itertools.count(1)

    async def call(self, header: dict[str, Any]) -> dict[str, Any]:
        header = {**header, "opaque": next(self.opaques)}
        self.writer.write(encode_frame(header))
        await self.writer.drain()
        while not isinstance(event := self.decoder.next_event(), Frame):
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("closed by the broker")
            self.decoder.receive_data(data)
        assert event.header["opaque"] == header["opaque"]
        return event.header

    async def login(self, username: str, password: str) -> list[Any]:
        auth = ClientAuthenticator(username, password)
        events = auth.start()
        while events and isinstance(events[0], SendRequest):
            reply = await self.call(m.auth_request(events[0].message, 0))
            events = auth.receive(reply)
        return events


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    write_group_secret(tmp_path / "group.secret")
    users = SecurityFile({}, str(tmp_path / "security.ini"))
    users.add_user("app", "app-pw", produce="orders", consume="*")
    ca = TestCA.create(tmp_path / "tls")
    cert, key = ca.issue("broker0")
    return {
        "broker": MiniBroker(users, GroupSecret.load(tmp_path / "group.secret", 0), server_context(str(cert), str(key))),
        "client_tls": client_context(str(ca.cert_file)),
        "group": GroupSecret.load(tmp_path / "group.secret", 0),
    }


async def _with_broker(setup: dict[str, Any], scenario) -> None:  # type: ignore[no-untyped-def]
    server = await asyncio.start_server(setup["broker"].serve, "127.0.0.1", 0, ssl=setup["broker"].tls)
    port = server.sockets[0].getsockname()[1]

    async def connect() -> Client:
        return Client(*await asyncio.open_connection("127.0.0.1", port, ssl=setup["client_tls"]))

    try:
        await asyncio.wait_for(scenario(connect), timeout=30)
    finally:
        server.close()
        await server.wait_closed()


def test_user_logs_in_over_tls_and_is_held_to_its_acl(setup: dict[str, Any]) -> None:
    async def scenario(connect) -> None:  # type: ignore[no-untyped-def]
        anonymous = await connect()
        refused = await anonymous.call({"op": "put", "topic": "orders"})
        assert refused["code"] == 403 and "not authenticated" in refused["msg"]
        assert (await anonymous.call({"op": "version"}))["code"] == 200

        app = await connect()
        events = await app.login("app", "app-pw")
        assert isinstance(events[-1], Authenticated)
        assert (await app.call({"op": "put", "topic": "orders"}))["code"] == 200
        denied = await app.call({"op": "put", "topic": "audit"})
        assert denied["code"] == 403 and "may not produce topic 'audit'" in denied["msg"]
        forged = await app.call({"op": "position", "topic": "orders", "replica": {"slave_id": 0}})
        assert forged["code"] == 403 and "may not replicate" in forged["msg"]

    asyncio.run(_with_broker(setup, scenario))


def test_group_broker_may_replicate_and_a_wrong_password_is_cut_off(setup: dict[str, Any]) -> None:
    group: GroupSecret = setup["group"]

    async def scenario(connect) -> None:  # type: ignore[no-untyped-def]
        slave = await connect()
        events = await slave.login(group.username("slave1"), group.scram_password())
        assert isinstance(events[-1], Authenticated)
        assert (await slave.call({"op": "position", "topic": "orders", "replica": {"slave_id": 1}}))["code"] == 200

        intruder = await connect()
        events = await intruder.login("app", "guess")
        assert isinstance(events[-1], Failed)
        with pytest.raises(ConnectionError):
            await intruder.call({"op": "put", "topic": "orders"})

    asyncio.run(_with_broker(setup, scenario))
    assert [type(error).__name__ for error in setup["broker"].failures] == ["BadProof"]
