"""One client connection on the broker: frames in, handler calls, replies out.

Requests are dispatched in arrival order. A handler's synchronous part (for a
put: validation and the append) runs before the next request is looked at, so
pipelined puts on one connection land in the log in the order they were sent;
the waits that follow (fsync, sync replication, long-poll) run as tasks, and
their replies go out in completion order, matched by ``opaque``.

Replies are written whole: a reply whose body is sent from a file holds the
connection's write lock between its header and its last body byte.

Trust (docs/security.md): with security on, a connection starts unauthenticated; the
``auth`` op runs the SCRAM handshake here, and every other request comes with the
connection's ``RequestContext`` (its principal now: ``_context``) and is checked by metaq/server/authz.py
(``Authz.request_denial``) before a handler sees it, so a handler never runs for a peer
that may not make its request.

Bounded resources: a connection stops reading (``pause_reading``) while it has
``maxRequestsInFlight`` requests unanswered or ``maxQueuedReplyBytes`` of replies its
peer has not read, as Kafka's ``queued.max.requests``; it resumes when the client
drains. A frame that does not complete within ``requestBodyTimeoutMs`` (slowloris) and
a connection idle for ``connectionIdleTimeoutMs`` are closed, each with a log line.

Before login (security on) a connection is read only as far as it needs to log in: frames
of ``auth``, ``version`` and ``quit`` with a header and a body of at most
``PRE_LOGIN_MAX_FRAME_PART`` bytes each; anything else closes it, and so do
``PRE_LOGIN_MAX_QUEUED_REPLY_BYTES`` of unread replies and not logging in within
``loginTimeoutMs``. So a connection that has not logged in holds at most one small frame
and a few replies. Broker-wide, the bytes of frames being received are limited
(``RequestBudget``) and connection slots are shared out (``ConnectionSlots``), see
metaq/server/admission.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Protocol

from ..deferred import Deferred
from ..protocol import commands as c
from ..protocol.messages import QuitRequest
from ..protocol.frames import (
    CLOSED,
    NEED_DATA,
    BadFrame,
    Frame,
    FrameDecoder,
    MAX_HEADER_SIZE,
    FrameHead,
    OversizedFrame,
    ProtocolError,
    TextLine,
    encode_frame,
    encode_frame_head,
)
from ..security import handshake
from ..security.messages import OP as AUTH_OP
from ..security.messages import auth_reply
from .admission import ConnectionSlots, RequestBudget
from .authz import OPEN_BEFORE_LOGIN, Authz, ProducerClaim, RequestContext
from .stats import BrokerStats
from .waiters import EndWaiters

if TYPE_CHECKING:
    from ..config import BrokerConfig
    from ..security.principals import Principal
    from ..security.settings import BrokerSecurity

log = logging.getLogger(__name__)

# Replies smaller than this are copied (pread) instead of sent with sendfile;
# below it the copy is cheaper than the extra round through the event loop.
SENDFILE_MIN_BYTES = 64 * 1024
#: Before login: the largest frame header, and the largest body, read (a SCRAM step is a few hundred bytes).
PRE_LOGIN_MAX_FRAME_PART = 4 * 1024
#: Before login: replies the peer has not read before the connection is closed.
PRE_LOGIN_MAX_QUEUED_REPLY_BYTES = 64 * 1024
#: Commands the connection serves itself (no handler): ``quit`` closes it.
CONNECTION_COMMANDS = frozenset({QuitRequest})


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may hold of the broker's memory and time (server.ini keys in brackets)."""

    max_in_flight: int = 1000  # [maxRequestsInFlight] requests received and not yet answered
    max_queued_reply_bytes: int = 16 * 1024 * 1024  # [maxQueuedReplyBytes] replies the peer has not read
    body_timeout_s: float = 30.0  # [requestBodyTimeoutMs] one frame must arrive whole within this
    idle_timeout_s: float = 600.0  # [connectionIdleTimeoutMs] 0: never
    max_connections: int = 1024  # [maxConnections] per broker (admission.ConnectionSlots)
    login_timeout_s: float = 10.0  # [loginTimeoutMs] security on: log in within this or be closed

    @classmethod
    def from_config(cls, config: "BrokerConfig") -> "ConnectionLimits":
        return cls(
            config.max_requests_in_flight,
            config.max_queued_reply_bytes,
            config.request_body_timeout_ms / 1000,
            config.connection_idle_timeout_ms / 1000,
            config.max_connections,
            config.login_timeout_ms / 1000,
        )

    @property
    def watchdog_interval_s(self) -> float:
        timeouts = [t for t in (self.body_timeout_s, self.idle_timeout_s, self.login_timeout_s) if t > 0]
        return max(0.05, min(1.0, min(timeouts) / 4)) if timeouts else 1.0

    @property
    def settled_watchdog_interval_s(self) -> float:
        """How often a connection past its login (or with security off) is checked: only the
        frame and idle timeouts remain, each enforced within a quarter of the shorter one.
        Not every second as before the login: 10,000 idle connections checked every second
        took 11% of a core doing nothing."""
        timeouts = [t for t in (self.body_timeout_s, self.idle_timeout_s) if t > 0]
        return max(0.05, min(timeouts) / 4) if timeouts else 1.0


class FileBody:
    """A reply body that is a range of a log segment file (sent zero-copy when possible)."""

    __slots__ = ("fileno", "position", "length", "read")

    def __init__(self, fileno: int, position: int, length: int, read: Any) -> None:
        self.fileno = fileno
        self.position = position
        self.length = length
        self.read = read  # fallback: callable returning the bytes


class Handlers(Protocol):
    """What a connection calls (metaq.server.handlers.RequestHandlers)."""

    stats: BrokerStats

    def handle(self, req: c.Request, ctx: RequestContext) -> Any: ...

    def handle_text(self, req: c.Request) -> Any: ...

    def connection_closed(self, origin: Any) -> None: ...


class ClientConnection(asyncio.Protocol):
    def __init__(
        self,
        handlers: Handlers,
        max_body: int,
        limits: ConnectionLimits | None = None,
        security: "BrokerSecurity | None" = None,
        slots: ConnectionSlots | None = None,
        budget: RequestBudget | None = None,
        authz: Authz | None = None,
        waiters: EndWaiters | None = None,
    ) -> None:
        self.handlers = handlers
        #: The broker's parked fetches: woken once per read of requests (``_process_batch``).
        self.waiters = waiters
        self.max_body = max_body
        self.decoder = FrameDecoder(max_body=max_body, announce_heads=True)
        self.limits = limits or ConnectionLimits()
        self.slots = slots or ConnectionSlots(self.limits.max_connections, self.limits.max_connections)
        self.budget = budget or RequestBudget(max_body)
        #: Bytes this connection counts in ``budget`` now (RequestBudget's invariant).
        self._budget_held = 0
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_host = "?"
        self.security = security
        #: Decides every request (security off: allows every one).
        self.authz = authz if authz is not None else Authz(security) if security is not None else None
        #: Who the peer proved to be (None: not authenticated, or security off).
        self.principal: "Principal | None" = None
        #: The last producer claim verified for this principal (``Authz.check_producer``).
        self._producer_claim = ProducerClaim()
        #: The context of this connection's requests (``_context``).
        self._ctx: RequestContext | None = None
        self._auth = security.server_authenticator() if security is not None and security.authentication_required else None
        #: What ``_over_limits`` compares with (asked several times per request): the limits now.
        self._max_in_flight = self.limits.max_in_flight
        self._max_queued_reply_bytes = self.limits.max_queued_reply_bytes
        if self._auth is not None:
            self.decoder.max_header = self.decoder.max_body = PRE_LOGIN_MAX_FRAME_PART
            self._max_queued_reply_bytes = PRE_LOGIN_MAX_QUEUED_REPLY_BYTES
        self._reading_paused = False
        self._out_bytes = 0
        self._partial_since: float | None = None
        self._last_activity = self._opened_at = time.monotonic()
        self._watchdog: asyncio.TimerHandle | None = None
        self._counted = False
        #: What is in flight: tasks (a wait, a file reply) and the Deferreds of requests whose
        #: handler returned one (a parked fetch, a sync put), answered from its callback without
        #: a task of their own. One set: its size is what ``_over_limits`` compares.
        self._in_flight: set[asyncio.Task[None] | Deferred[Any]] = set()
        self._write_lock = asyncio.Lock()
        self._closing = False
        self._paused = False
        self._drained = asyncio.Event()
        self._drained.set()
        # Replies produced while one batch of received bytes is processed: written with
        # one transport.write at the end instead of one send() per reply (pipelined puts).
        self._out: list[bytes] | None = None
        # Plain text is for one-shot `echo stats | nc HOST PORT`: Debian's nc keeps the
        # socket open after stdin ends, so the broker closes it once it has answered
        # every line received so far.
        self._text_answered = False

    # --- asyncio.Protocol -------------------------------------------------------

    @property
    def authentication_required(self) -> bool:
        return self._auth is not None

    @property
    def awaiting_login(self) -> bool:
        """Security on and no principal yet: only the login is read (PRE_LOGIN_MAX_FRAME_PART)."""
        return self._auth is not None and self.principal is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_host = str(peer[0]) if peer else "?"
        stats = self.handlers.stats
        refusal = self.slots.admit(self, logged_in=not self.awaiting_login)
        if refusal is not None:
            kind, reason = refusal
            stats.refused(kind)
            self.slots.log_once_a_second(kind, f"refusing connection from {self.peer}: {reason}")
            self._closing = True
            transport.close()
            return
        stats.connection_opened()
        self._counted = True
        # pause_writing fires once this much is queued: reading stops until the peer drains.
        self.transport.set_write_buffer_limits(high=self.limits.max_queued_reply_bytes)
        self._arm_watchdog()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        if not self._counted:
            return  # refused in connection_made: it never was a connection of ours
        self.slots.release(self)
        self._budget_held = self.budget.move(self._budget_held, 0)
        self.handlers.stats.connection_closed()
        self.handlers.connection_closed(self)
        for waiting in list(self._in_flight):
            waiting.cancel()  # a task; a parked fetch's Deferred lets go of its timer and its watch
        self._drained.set()

    def pause_writing(self) -> None:
        self._drained.clear()
        self._update_flow()

    def resume_writing(self) -> None:
        self._drained.set()
        self._update_flow()

    def data_received(self, data: bytes) -> None:
        self._last_activity = time.monotonic()
        self.decoder.receive_data(data)
        self._process_batch()

    def _process_batch(self) -> None:
        self._out = []
        self._out_bytes = 0
        waiters = self.waiters
        if waiters is not None:
            waiters.hold()
        try:
            self._process_events()
        finally:
            # This read's replies first, then the fetches parked on what its requests appended,
            # once each: an ack that does not wait for a slave (async pair; a sync master
            # alone) leaves before the slave's reply is built and its process woken. A sync
            # ack is a Deferred, not in ``_out``: it still goes out after the slave reports.
            # From here ``_out`` is None, so whatever the release writes (a fetch parked on
            # this connection) goes straight to the socket, after this read's replies.
            self._flush_out()
            if waiters is not None:
                waiters.release()
            self._count_buffered()
        if self._text_answered and not self._closing:
            self.close()
            return
        self._update_flow()

    # --- bounded resources ------------------------------------------------------------

    def _over_limits(self) -> bool:
        """Too much of this peer's work is pending: answer what we have before reading more."""
        if len(self._in_flight) >= self._max_in_flight:
            return True
        transport = self.transport
        queued = self._out_bytes + (transport.get_write_buffer_size() if transport is not None else 0)
        return queued >= self._max_queued_reply_bytes

    def _count_buffered(self) -> None:
        """Count in the broker's budget what the decoder holds now, and what the frame it is receiving will."""
        if self._counted:
            wanted = 0 if self._closing else self.decoder.held
            if wanted != self._budget_held:  # most reads end with nothing buffered, as they began
                self._budget_held = self.budget.move(self._budget_held, wanted)

    def _admit_head(self, head: FrameHead) -> None:
        """A frame whose body is still to come: reserve its whole size in the budget, or skip it unread."""
        wanted = max(self.decoder.buffered, head.frame_len)
        if self.budget.fits(self._budget_held, wanted):
            self._budget_held = self.budget.move(self._budget_held, wanted)
            return
        self.decoder.skip_frame()
        self.handlers.stats.refused("request_budget")
        self.slots.log_once_a_second(
            "request_budget",
            f"refusing a request of {head.body_len} bytes from {self.peer}: the broker holds {self.budget.held} bytes "
            f"of requests being received (maxBufferedRequestBytes={self.budget.limit})"
        )
        self.send_reply(
            c.reply_header(
                _opaque(head.header), c.SERVICE_UNAVAILABLE,
                f"broker busy: request of {head.body_len} bytes does not fit in maxBufferedRequestBytes now; retry",
            )
        )

    def _closed_before_login(self, header: dict[str, Any], body_len: int) -> bool:
        """Before login only a small auth, version or quit frame is read; anything else closes the connection."""
        if not self.awaiting_login:
            return False
        op = header.get("op")
        if op in OPEN_BEFORE_LOGIN and body_len <= PRE_LOGIN_MAX_FRAME_PART:
            return False
        what = f"op {op!r}" if op not in OPEN_BEFORE_LOGIN else f"a body of {body_len} bytes"
        log.info(
            "closing connection from %s: %s before login (only auth, version and quit, bodies up to %d bytes)",
            self.peer, what, PRE_LOGIN_MAX_FRAME_PART,
        )
        self.handlers.stats.refused("before_login")
        self.send_reply(c.AccessDenied(f"not authenticated: {what} before login; send the auth handshake first").reply(_opaque(header)))
        self.close()
        return True

    def evict(self, reason: str) -> None:
        """Close to make room (ConnectionSlots): this connection has not logged in."""
        self.handlers.stats.refused("evicted")
        self.slots.log_once_a_second("evicted", f"closing connection from {self.peer}: not logged in, {reason}")
        self.close()

    def _update_flow(self) -> None:
        """Pause reading over the limits; below them resume, and process what is already buffered."""
        transport = self.transport
        if transport is None or self._closing or transport.is_closing():
            return
        if self._over_limits():
            if self.awaiting_login:
                # Logging in is a few small round trips: a peer that piles up unread replies before
                # login is not logging in, and a paused connection would keep a read's worth of its bytes.
                log.info("closing connection from %s: %d bytes of replies unread before login", self.peer,
                         self._out_bytes + transport.get_write_buffer_size())
                self.handlers.stats.refused("before_login")
                self.close()
                return
            if not self._reading_paused:
                self._reading_paused = True
                transport.pause_reading()
            return
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
            if self.decoder.buffered:
                self._process_batch()

    def _task_done(self, task: "asyncio.Task[None]") -> None:
        self._in_flight.discard(task)
        self._last_activity = time.monotonic()
        if self._reading_paused:
            self._update_flow()

    def _arm_watchdog(self) -> None:
        limits = self.limits
        interval = limits.watchdog_interval_s if self.awaiting_login else limits.settled_watchdog_interval_s
        self._watchdog = asyncio.get_running_loop().call_later(interval, self._check_timeouts)

    def _check_timeouts(self) -> None:
        if self._closing:
            return
        now = time.monotonic()
        limits = self.limits
        if self._partial_since is not None and limits.body_timeout_s > 0 and now - self._partial_since > limits.body_timeout_s:
            log.warning(
                "closing connection from %s: a request has been arriving for over %.0f s (%d bytes so far; requestBodyTimeoutMs)",
                self.peer, limits.body_timeout_s, self.decoder.buffered,
            )
            self.close()
            return
        if self.awaiting_login and limits.login_timeout_s > 0 and now - self._opened_at > limits.login_timeout_s:
            log.info("closing connection from %s: not logged in within %.0f s (loginTimeoutMs)", self.peer, limits.login_timeout_s)
            self.handlers.stats.refused("login_timeout")
            self.close()
            return
        idle = not self._in_flight and self._partial_since is None
        if idle and limits.idle_timeout_s > 0 and now - self._last_activity > limits.idle_timeout_s:
            log.info("closing connection from %s: idle for %.0f s (connectionIdleTimeoutMs)", self.peer, limits.idle_timeout_s)
            self.close()
            return
        self._arm_watchdog()

    def eof_received(self) -> bool | None:
        self.decoder.receive_data(b"")
        self._process_batch()
        return False

    # --- dispatch -------------------------------------------------------------------

    def _process_events(self) -> None:
        decoder = self.decoder
        while not self._closing:
            if decoder.used_up():
                # What NEED_DATA with nothing buffered does below; the limits need no look when
                # there is nothing to take (the end of nearly every read of whole frames).
                self._partial_since = None
                return
            if self._over_limits():
                return  # the rest stays in the decoder until the peer drains (_update_flow)
            event = decoder.next_event()
            if event is NEED_DATA:
                # Bytes of an incomplete frame wait here: they must complete in time (slowloris).
                if not decoder.buffered:
                    self._partial_since = None
                elif self._partial_since is None:
                    self._partial_since = time.monotonic()
                return
            self._partial_since = None
            if event is CLOSED:
                self.close()
                return
            if isinstance(event, Frame):
                # ``_auth is None``: security off, never awaiting login (``_closed_before_login``).
                if self._auth is None or not self._closed_before_login(event.header, len(event.body)):
                    self._dispatch_frame(event)
            elif isinstance(event, FrameHead):
                if not self._closed_before_login(event.header, event.body_len):
                    self._admit_head(event)
            elif isinstance(event, TextLine):
                self._dispatch_text(event)
            elif isinstance(event, OversizedFrame):
                if self._closed_before_login(event.header, event.body_len):
                    return
                self.handlers.stats.bad_request()
                self.send_reply(
                    c.reply_header(
                        _opaque(event.header),
                        c.BAD_REQUEST,
                        f"request body of {event.body_len} bytes exceeds the limit of {event.limit} bytes",
                    )
                )
            elif isinstance(event, BadFrame):
                self.handlers.stats.bad_request()
                self.send_reply(c.reply_header(None, c.BAD_REQUEST, event.message))
            elif isinstance(event, ProtocolError):
                self.handlers.stats.bad_request()
                log.info("closing connection from %s: %s", self.peer, event.message)
                self.send_reply(c.reply_header(None, c.BAD_REQUEST, event.message))
                self.close()
                return

    def _dispatch_frame(self, frame: Frame) -> None:
        header = frame.header
        if header.get("op") == AUTH_OP:
            self._authenticate(header)
            return
        ctx = self._context()
        # Before the fields are parsed: a peer that may not make the request learns nothing from their checks.
        denial = self.authz.request_denial(ctx, header) if self.authz is not None else None
        if denial is not None:
            self.send_reply(c.AccessDenied(denial).reply(_opaque(header)))
            return
        try:
            request = c.parse_request(frame)
        except c.RequestError as exc:
            self.handlers.stats.bad_request()
            self.send_reply(exc.reply(exc.opaque))
            return
        if type(request) in CONNECTION_COMMANDS:
            self.close()
            return
        request.origin = self
        self._run(request, self.handlers.handle(request, ctx))

    def _context(self) -> RequestContext:
        """Who sends the request being dispatched (the principal is fixed once logged in): one
        immutable context per connection, made again whenever the principal or the peer differs
        from the one it holds."""
        ctx = self._ctx
        if ctx is None or ctx.principal is not self.principal or ctx.peer is not self.peer:
            ctx = self._ctx = RequestContext(self.principal, self.peer, self._producer_claim)
        return ctx

    def _authenticate(self, header: dict[str, Any]) -> None:
        """One step of the SCRAM handshake (metaq/security/handshake.py)."""
        opaque = header.get("opaque") if isinstance(header.get("opaque"), int) else -1
        if self._auth is None:
            self.send_reply(c.reply_header(opaque, c.BAD_REQUEST, "auth: security is not enabled on this broker"))
            return
        failed = False
        for event in self._auth.receive(header):
            if isinstance(event, handshake.SendReply):
                self.send_reply(auth_reply(event.reply, opaque))
            elif isinstance(event, handshake.Authenticated):
                self.principal = event.principal
                self.slots.logged_in(self)
                self.decoder.max_header, self.decoder.max_body = MAX_HEADER_SIZE, self.max_body
                self._max_queued_reply_bytes = self.limits.max_queued_reply_bytes
                self.security.logged_in(self, event.principal)  # a SIGHUP that removes the user closes it
                log.info("connection from %s authenticated as %s", self.peer, event.principal)
            elif isinstance(event, handshake.Failed):
                log.warning("authentication from %s failed: %s", self.peer, event.error)
                failed = True
        if failed:
            self.close()

    def _dispatch_text(self, line: TextLine) -> None:
        if not line.words:
            return
        self._text_answered = True
        try:
            request = c.text_request(line.words)
        except c.RequestError as exc:
            self._write(f"ERROR {exc.message}\r\n".encode())
            return
        if type(request) in CONNECTION_COMMANDS:
            self.close()
            return
        # A text line cannot authenticate: with security on only `version` answers.
        denial = self.authz.request_denial(self._context(), request.to_header()) if self.authz is not None else None
        if denial is not None:
            self._write(f"ERROR {denial}\r\n".encode())
            return
        self._run(request, self.handlers.handle_text(request), text=True)

    def _run(self, request: c.Request, result: Any, text: bool = False) -> None:
        """Send the reply now if the handler finished synchronously, else when its awaitable does."""
        if type(result) is tuple:  # most replies: before the ABC check of Awaitable, which is slow
            self._emit(request, result, text)
        elif isinstance(result, Deferred):
            self._in_flight.add(result)
            result.add_done_callback(lambda done: self._deferred_done(request, done, text))
        elif isinstance(result, Awaitable):
            task = asyncio.ensure_future(self._finish(request, result, text))
            self._in_flight.add(task)
            task.add_done_callback(self._task_done)
        elif result is not None:  # None: a one-way request (``stream_ack``), never answered
            self._emit(request, result, text)

    async def _finish(self, request: c.Request, awaitable: Awaitable[Any], text: bool) -> None:
        try:
            result = await awaitable
        except asyncio.CancelledError:
            return
        except Exception as exc:
            result = self._failed_reply(request, exc)
        self._emit(request, result, text)

    def _deferred_done(self, request: c.Request, done: Deferred[Any], text: bool) -> None:
        """A ``Deferred`` reply is known: written now, inside whatever resolved it."""
        self._in_flight.discard(done)
        if done.cancelled() or self._closing:
            return
        exc = done.exception()
        self._emit(request, done.result() if exc is None else self._failed_reply(request, exc), text)
        self._last_activity = time.monotonic()
        if self._reading_paused:
            # On the next turn, not here: this runs inside another request's handling (a sync
            # set releasing its waiters, a put waking parked fetches), which must not process
            # this connection's buffered requests in the middle of it.
            asyncio.get_running_loop().call_soon(self._update_flow)

    def _failed_reply(self, request: c.Request, exc: BaseException) -> tuple[dict[str, Any], bytes]:
        if isinstance(exc, c.RequestError):
            return exc.reply(request.opaque), b""
        # A handler bug must cost one request, not the broker.
        log.error("error serving %s from %s", request.op, self.peer, exc_info=exc)
        return c.reply_header(request.opaque, c.INTERNAL_ERROR, f"internal error: {exc}"), b""

    def _emit(self, request: c.Request, result: Any, text: bool) -> None:
        if text:
            self._write(result if isinstance(result, bytes) else str(result).encode())
            return
        header, body = result
        if not isinstance(body, FileBody):
            self.send_reply(header, body)
        elif body.length < SENDFILE_MIN_BYTES:
            # A small range is copied and written now, like any reply (behind a file reply
            # on its way out, if there is one): no task for it.
            self.send_reply(header, body.read())
        else:
            task = asyncio.ensure_future(self.send_file_reply(header, body))
            self._in_flight.add(task)
            task.add_done_callback(self._task_done)

    # --- output ---------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self._out is not None:
            self._out.append(data)
            self._out_bytes += len(data)
        elif self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _flush_out(self) -> None:
        out, self._out = self._out, None
        if out:
            self._write(out[0] if len(out) == 1 else b"".join(out))

    def send_reply(self, header: dict[str, Any], body: bytes | bytearray | memoryview = b"") -> None:
        if self._write_lock.locked():
            # A file body is on its way out; queue behind it to keep frames whole.
            task = asyncio.ensure_future(self._locked_send(header, body))
            self._in_flight.add(task)
            task.add_done_callback(self._task_done)
        else:
            self._write(encode_frame(header, body))

    async def _locked_send(self, header: dict[str, Any], body: bytes | bytearray | memoryview) -> None:
        async with self._write_lock:
            self._write(encode_frame(header, body))

    async def send_file_reply(self, header: dict[str, Any], body: FileBody) -> None:
        async with self._write_lock:
            transport = self.transport
            if transport is None or transport.is_closing():
                return
            loop = asyncio.get_running_loop()
            if body.length >= SENDFILE_MIN_BYTES and _loop_has_sendfile(loop):
                transport.write(encode_frame_head(header, body.length))
                try:
                    with open(body.fileno, "rb", closefd=False) as file:
                        await loop.sendfile(transport, file, body.position, body.length)
                    return
                except (NotImplementedError, RuntimeError):
                    # Transport cannot sendfile (e.g. TLS); the head is out, so send the bytes.
                    transport.write(body.read())
                    return
            transport.write(encode_frame(header, body.read()))
            if not self._drained.is_set():
                # Back-pressure: a slow reader must not make the broker buffer whole logs.
                await self._drained.wait()

    def close(self) -> None:
        self._closing = True
        self._flush_out()  # replies (e.g. the 400 before a close) go out first
        if self.transport is not None:
            self.transport.close()


def _opaque(header: dict[str, Any]) -> int | None:
    return header.get("opaque") if isinstance(header.get("opaque"), int) else None


def _loop_has_sendfile(loop: asyncio.AbstractEventLoop) -> bool:
    # uvloop inherits AbstractEventLoop.sendfile, which only raises NotImplementedError.
    return isinstance(loop, asyncio.BaseEventLoop)
