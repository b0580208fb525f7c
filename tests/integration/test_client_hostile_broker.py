"""What a hostile "broker" can make a client do.

The peer here is a fake broker on a loopback socket, the kind a forged ZooKeeper
registration points clients at: it answers a fetch with a frame declaring a 1 GiB body,
or a login with a SCRAM server-first announcing 10,000,000 iterations. The client
refuses both at once, naming why, instead of buffering the body (up to 2 GiB before) or
spending seconds of CPU on the key derivation.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import pytest

from metaq.client.connection import MAX_SCRAM_ITERATIONS, AuthenticationFailed, BrokerConnection, ConnectionClosed
from metaq.protocol.frames import MAGIC, PREFIX, VERSION, FrameDecoder, Frame, NEED_DATA, encode_frame
from metaq.security.handshake import ClientAuthenticator
from metaq.security.messages import SERVER_FIRST, AuthMessage, AuthReply, auth_reply

import msgpack

GIB = 1 << 30


async def serve(answer: Callable[[dict[str, Any], asyncio.StreamWriter], None], client: Callable[[int], Any]) -> Any:
    """Run ``client(port)`` against a fake broker that calls ``answer(request header, writer)`` per request."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(allow_text=False)
        while data := await reader.read(65536):
            decoder.receive_data(data)
            while isinstance(event := decoder.next_event(), Frame):
                answer(event.header, writer)
            if event is not NEED_DATA:
                break

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        return await client(server.sockets[0].getsockname()[1])
    finally:
        server.close()


def test_a_reply_body_above_what_the_request_asked_for_is_refused_unread() -> None:
    def huge_body(header: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        packed = msgpack.packb({"opaque": header["opaque"], "code": 200, "offset": 0}, use_bin_type=True)
        writer.write(PREFIX.pack(MAGIC, VERSION, len(packed), GIB) + packed + b"\0" * (1 << 20))

    async def fetch(port: int) -> float:
        conn = await BrokerConnection.open("127.0.0.1", port)
        started = time.monotonic()
        with pytest.raises(ConnectionClosed, match="above the .* bytes asked for"):
            await conn.request({"op": "get", "topic": "t", "partition": 0, "offset": 0, "max_size": 1 << 20}, timeout=5)
        return time.monotonic() - started

    assert asyncio.run(serve(huge_body, fetch)) < 1.0


def test_a_server_announcing_too_many_scram_iterations_is_refused_before_computing() -> None:
    iterations = 100 * MAX_SCRAM_ITERATIONS

    def server_first(header: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        nonce = dict(part.split("=", 1) for part in header["data"].split(",") if "=" in part)["r"]
        data = f"r={nonce}fake,s=c2FsdHNhbHRzYWx0,i={iterations}"
        writer.write(encode_frame(auth_reply(AuthReply(AuthMessage(SERVER_FIRST, data), 200, None, None), header["opaque"]), b""))

    async def login(port: int) -> float:
        started = time.monotonic()
        with pytest.raises(AuthenticationFailed, match="SCRAM iterations"):
            await BrokerConnection.open("127.0.0.1", port, timeout=10, authenticator=ClientAuthenticator("app", "pw"))
        return time.monotonic() - started

    # 10,000,000 PBKDF2 rounds take seconds; a refusal takes a round trip.
    assert asyncio.run(serve(server_first, login)) < 1.0
