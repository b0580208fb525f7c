"""One pipelined connection to a broker (asyncio).

Requests are written as they come; each carries a fresh ``opaque`` and its
future waits in ``_pending`` until the reply with that opaque arrives, so any
number of requests can be in flight on one socket (MetaQ's multiplexing).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl as ssl_module
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

from ..protocol import commands as c
from ..protocol.frames import CLOSED, ERROR_EVENTS, NEED_DATA, Frame, FrameDecoder, OversizedFrame, encode_frame

if TYPE_CHECKING:
    from ..security.handshake import ClientAuthenticator

log = logging.getLogger(__name__)

#: The largest reply body a client reads for a request that names no ``max_size`` (stats,
#: config, version: kilobytes in practice); a fetch's reply may be its ``max_size`` plus
#: ``REPLY_SLACK``. A larger body is skipped unread and ends the connection, so a broker
#: (or a forged registration's fake one) cannot make a client buffer up to 2 GiB.
DEFAULT_REPLY_LIMIT = 16 * 1024 * 1024
REPLY_SLACK = 64 * 1024
#: SCRAM iterations a client computes at most: a server announcing more (a fake one making
#: each login cost seconds of CPU) is refused. ``metaq security`` users default to 4096.
MAX_SCRAM_ITERATIONS = 100_000


class ConnectionClosed(ConnectionError):
    """The connection to a broker went away (or could not be made)."""


class CannotConnect(ConnectionClosed):
    """A connection that no retry can make: the settings of one side must change first.

    Kafka's fatal class (an authentication or TLS failure): a producer fails the send at
    once with this reason instead of retrying until its send timeout (docs/client.md).
    """


class AuthenticationFailed(CannotConnect):
    """The broker refused our credentials, or could not prove it holds the secret (not our broker)."""


class TlsMismatch(CannotConnect):
    """TLS on one side only, or a certificate the client does not trust."""


@dataclass
class Reply:
    header: dict[str, Any]
    body: bytearray

    @property
    def code(self) -> int:
        return int(self.header.get("code", c.INTERNAL_ERROR))

    @property
    def message(self) -> str:
        return str(self.header.get("msg", c.CODE_NAMES.get(self.code, "")))

    @property
    def ok(self) -> bool:
        return self.code == c.OK

    @property
    def reason(self) -> object:
        """Why the broker refused, machine-readable (``c.ACCESS_DENIED``), or None if it did not say."""
        return self.header.get(c.REASON_FIELD)

    def __getitem__(self, key: str) -> Any:
        return self.header[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.header.get(key, default)


@dataclass(frozen=True)
class Credentials:
    """How a client logs in to brokers with security on: a user and password (SCRAM), over TLS with ``tls_ca_file``."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    #: CA bundle that signed the brokers' certificates: connect over TLS and verify them.
    tls_ca_file: str | None = None

    @cached_property
    def ssl_context(self) -> ssl_module.SSLContext | None:
        if self.tls_ca_file is None:
            return None
        from ..security.tls import client_context

        return client_context(self.tls_ca_file)

    def authenticator(self) -> "ClientAuthenticator | None":
        """A fresh handshake for one connection (None without a user)."""
        if self.user is None:
            return None
        from ..security.handshake import ClientAuthenticator

        return ClientAuthenticator(self.user, self.password or "")

    async def open(self, host: str, port: int, timeout: float = 5.0) -> "BrokerConnection":
        """A connection of its own to one broker, over TLS and logged in as these credentials say."""
        return await BrokerConnection.open(host, port, timeout, ssl=self.ssl_context, authenticator=self.authenticator())


#: OpenSSL's reasons for a ClientHello answered by something that is not TLS.
_NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "HTTP_REQUEST", "RECORD_LAYER_FAILURE",
                              "PACKET_LENGTH_TOO_LONG"})


async def speaks_tls(host: str, port: int, timeout: float = 5.0) -> bool:
    """Does ``host:port`` complete (or refuse with an alert) a TLS handshake? Only a probe: nothing is sent after it."""
    probe = ssl_module.SSLContext(ssl_module.PROTOCOL_TLS_CLIENT)
    probe.check_hostname = False
    probe.verify_mode = ssl_module.CERT_NONE  # the question is "TLS or not", not "whose certificate"
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=probe), timeout)
    except ssl_module.SSLError as exc:
        return exc.reason not in _NOT_TLS_REASONS and not isinstance(exc, ssl_module.SSLEOFError)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


def reply_limit(header: dict[str, Any]) -> int:
    """The largest reply body to read for a request with ``header``."""
    max_size = header.get("max_size")
    if isinstance(max_size, int) and max_size > 0:
        return max(max_size + REPLY_SLACK, DEFAULT_REPLY_LIMIT)
    return DEFAULT_REPLY_LIMIT


def _iterations_refusal(header: dict[str, Any]) -> str | None:
    """Why a server-first announcing too many SCRAM iterations is refused, or None."""
    from ..security import messages

    try:
        reply = messages.parse_auth_reply(header)
    except messages.MalformedMessage:
        return None  # the handshake reports it
    if reply.message.step != messages.SERVER_FIRST:
        return None
    fields = dict(part.split("=", 1) for part in reply.message.data.split(",") if "=" in part)
    iterations = fields.get("i", "")
    if iterations.isdigit() and int(iterations) > MAX_SCRAM_ITERATIONS:
        return (f"the server announces {int(iterations):,} SCRAM iterations, above the client's limit of "
                f"{MAX_SCRAM_ITERATIONS:,}: refused (a fake broker, or a user whose iterations must be lowered)")
    return None


def _expire(future: "asyncio.Future[Reply]", address: str) -> None:
    if not future.done():
        future.set_exception(asyncio.TimeoutError(f"no reply from {address} in time"))


async def reply_within(future: "asyncio.Future[Reply]", timeout: float, address: str) -> Reply:
    """The reply ``future`` (from ``BrokerConnection.send``) gets, or asyncio.TimeoutError after ``timeout`` s.

    A timer instead of asyncio.wait_for, which costs a future, a callback and an extra turn
    of the event loop per reply.
    """
    timer = future.get_loop().call_later(timeout, _expire, future, address)
    try:
        return await future
    finally:
        timer.cancel()


class _ReplyProtocol(asyncio.Protocol):
    def __init__(self, conn: "BrokerConnection") -> None:
        self._conn = conn
        self._decoder = FrameDecoder(max_body=DEFAULT_REPLY_LIMIT, allow_text=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self._conn.dropped_by_peer = not self._conn._closed
        self._conn._fail_all(ConnectionClosed(f"connection to {self._conn.address} lost" + (f": {exc}" if exc else "")))

    def data_received(self, data: bytes) -> None:
        self._conn.answered = True
        decoder = self._decoder
        large = self._conn._large_replies
        decoder.max_body = max(large.values()) if large else DEFAULT_REPLY_LIMIT
        decoder.receive_data(data)
        while True:
            event = decoder.next_event()
            if event is NEED_DATA or event is CLOSED:
                return
            if isinstance(event, Frame):
                self._conn._resolve(event.header, event.body)
            elif isinstance(event, ERROR_EVENTS):
                # A reply that cannot be read loses its opaque, so no pending request can be
                # matched any more: every parse error ends the connection.
                if isinstance(event, OversizedFrame):
                    message = f"a reply body of {event.body_len} bytes, above the {event.limit} bytes asked for"
                else:
                    message = event.message
                self._conn._fail_all(ConnectionClosed(f"bad reply from {self._conn.address}: {message}"))
                self._conn.close()
                return


class BrokerConnection:
    """A connection to ``host:port``; use ``await BrokerConnection.open(...)``."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._opaques = itertools.count(1)
        self._closed = False
        self.tls = False
        #: Has the broker sent anything on this connection? Did it end the connection? (see ``diagnose``)
        self.answered = False
        self.dropped_by_peer = False
        #: opaque -> reply body limit of requests in flight that may be answered with more
        #: than DEFAULT_REPLY_LIMIT (large fetches); the decoder allows the largest of them.
        self._large_replies: dict[int, int] = {}
        #: opaque -> callback of a replication stream (metaq/ha/stream.py): called, in this
        #: connection's protocol callback, with every frame of that opaque (the subscription's
        #: reply too), and with (None, None) once the connection is lost.
        self.streams: dict[int, Callable[[dict[str, Any] | None, bytearray | None], None]] = {}

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._closed and not self._transport.is_closing()

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        timeout: float = 5.0,
        *,
        ssl: ssl_module.SSLContext | None = None,
        authenticator: "ClientAuthenticator | None" = None,
    ) -> "BrokerConnection":
        """Connect (over TLS with ``ssl``) and, given an ``authenticator``, log in before returning."""
        conn = cls(host, port)
        conn.tls = ssl is not None
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: _ReplyProtocol(conn), host, port, ssl=ssl), timeout
            )
        except ssl_module.SSLCertVerificationError as exc:
            raise TlsMismatch(f"{host}:{port}: the broker's certificate is not trusted: {exc.verify_message} "
                              "(check tls_ca_file / --tls-ca and the host name the broker registers)") from None
        except ssl_module.SSLError as exc:
            if exc.reason in _NOT_TLS_REASONS:
                raise TlsMismatch(f"{host}:{port} does not speak TLS ({exc.reason}): connect without tls_ca_file "
                                  "/ --tls-ca, or to the broker's TLS port") from None
            raise ConnectionClosed(f"cannot connect to {host}:{port}: {exc}") from None
        except (OSError, asyncio.TimeoutError) as exc:
            # str(), not the exception: an exception is always true, and a timeout's text is empty.
            raise ConnectionClosed(f"cannot connect to {host}:{port}: {str(exc) or 'timed out'}") from None
        conn._transport = transport  # type: ignore[assignment]
        if authenticator is not None:
            try:
                await conn.authenticate(authenticator, timeout)
            except ConnectionClosed as exc:
                conn.close()
                raise await conn.diagnose(exc, timeout) from None
            except asyncio.TimeoutError:
                conn.close()
                raise ConnectionClosed(f"{conn.address}: no answer to the login in {timeout}s") from None
            except BaseException:
                conn.close()
                raise
        return conn

    async def diagnose(self, exc: ConnectionClosed, timeout: float = 5.0) -> ConnectionClosed:
        """``exc``, or a TlsMismatch when a plaintext connection was closed unanswered by a TLS port.

        A TLS server drops a plaintext peer without a word (no alert: its first bytes are
        not a ClientHello), so the loss alone reads like a crash; one TLS handshake on a
        new connection tells the two apart. Asked only on a failure path.
        """
        if self.tls or self.answered or not self.dropped_by_peer or isinstance(exc, CannotConnect):
            return exc
        if await speaks_tls(self.host, self.port, timeout):
            return TlsMismatch(f"{self.address} speaks TLS and closed this plaintext connection: set tls_ca_file "
                               "(--tls-ca) to the CA of the brokers' certificates")
        return exc

    async def authenticate(self, authenticator: "ClientAuthenticator", timeout: float = 5.0) -> None:
        """Run the SCRAM handshake (metaq/security/handshake.py); AuthenticationFailed if it fails."""
        from ..security import handshake
        from ..security.messages import auth_request

        events = authenticator.start()
        while events:
            event = events.pop(0)
            if isinstance(event, handshake.SendRequest):
                reply = await self.request(auth_request(event.message, 0), timeout=timeout)
                refusal = _iterations_refusal(reply.header)
                if refusal is not None:
                    raise AuthenticationFailed(f"{self.address}: {refusal}")
                events += authenticator.receive(reply.header)
            elif isinstance(event, handshake.Failed):
                raise AuthenticationFailed(f"{self.address}: {event.error}")
            elif isinstance(event, handshake.Authenticated):
                return
        raise AuthenticationFailed(f"{self.address}: the handshake ended without a result")

    async def request(
        self, header: dict[str, Any], body: bytes | bytearray | memoryview = b"", timeout: float | None = 30.0
    ) -> Reply:
        """Send one request and wait for its reply (raises ConnectionClosed, asyncio.TimeoutError)."""
        opaque, future = self._send(header, body)
        try:
            return await (reply_within(future, timeout, self.address) if timeout else future)
        finally:
            # Its limit stays until its reply comes (or the connection ends): a late large
            # reply to a timed-out fetch is skipped as usual, not taken for a hostile one.
            self._pending.pop(opaque, None)

    def send(self, header: dict[str, Any], body: bytes | bytearray | memoryview = b"") -> "asyncio.Future[Reply]":
        """Write one request now and return the future of its reply (for pipelining)."""
        return self._send(header, body)[1]

    def send_oneway(self, header: dict[str, Any], body: bytes | bytearray | memoryview = b"") -> None:
        """Write a request that is never answered (``stream_ack``); ConnectionClosed if closed."""
        if not self.is_open:
            raise ConnectionClosed(f"connection to {self.address} is closed")
        assert self._transport is not None
        self._transport.write(encode_frame(header, body))

    def subscribe(self, header: dict[str, Any],
                  on_frame: Callable[[dict[str, Any] | None, bytearray | None], None]) -> tuple[int, "asyncio.Future[Reply]"]:
        """Send a ``stream`` request: ``on_frame`` gets every frame of its opaque from its reply
        on (see ``streams``). Returns the opaque (the stream id) and the reply's future."""
        opaque, future = self._send(header, b"")
        self.streams[opaque] = on_frame
        return opaque, future

    def _send(self, header: dict[str, Any], body: bytes | bytearray | memoryview) -> tuple[int, "asyncio.Future[Reply]"]:
        if not self.is_open:
            raise ConnectionClosed(f"connection to {self.address} is closed")
        opaque = next(self._opaques)
        header = {**header, "opaque": opaque}
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[opaque] = future
        limit = reply_limit(header)
        if limit > DEFAULT_REPLY_LIMIT:
            self._large_replies[opaque] = limit
        assert self._transport is not None
        self._transport.write(encode_frame(header, body))
        return opaque, future

    def _resolve(self, header: dict[str, Any], body: bytearray) -> None:
        opaque = header.get("opaque", -1)
        if self.streams:
            stream = self.streams.get(opaque)
            if stream is not None:
                stream(header, body)
        self._large_replies.pop(opaque, None)
        future = self._pending.pop(opaque, None)
        if future is not None and not future.done():
            future.set_result(Reply(header, body))

    def _fail_all(self, exc: Exception) -> None:
        self._closed = True
        self._large_replies.clear()
        pending, self._pending = self._pending, {}
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream(None, None)
        for future in pending.values():
            if not future.done():
                future.set_exception(exc)

    def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def abandon(self, reason: str) -> None:
        """Fail every request in flight with ``reason`` (outcome unknown) and close."""
        self._fail_all(ConnectionClosed(reason))
        if self._transport is not None:
            self._transport.abort()  # a silent peer would hold a graceful close's unsent bytes

    async def __aenter__(self) -> "BrokerConnection":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
