"""One client connection on the broker: frames in, handler calls, replies out.

Requests are dispatched in arrival order. A handler's synchronous part (for a
put: validation and the append) runs before the next request is looked at, so
pipelined puts on one connection land in the log in the order they were sent;
the waits that follow (fsync, sync replication, long-poll) run as tasks, and
their replies go out in completion order, matched by ``opaque``.

Replies are written whole: a reply whose body is sent from a file holds the
connection's write lock between its header and its last body byte.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Protocol

from ..protocol import commands as c
from ..protocol.frames import (
    CLOSED,
    NEED_DATA,
    BadFrame,
    Frame,
    FrameDecoder,
    OversizedFrame,
    ProtocolError,
    TextLine,
    encode_frame,
    encode_frame_head,
)
from .stats import BrokerStats

log = logging.getLogger(__name__)

# Replies smaller than this are copied (pread) instead of sent with sendfile;
# below it the copy is cheaper than the extra round through the event loop.
SENDFILE_MIN_BYTES = 64 * 1024


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

    def handle(self, req: c.Request) -> Any: ...

    def handle_text(self, req: c.Request) -> Any: ...

    def connection_closed(self, origin: Any) -> None: ...


class ClientConnection(asyncio.Protocol):
    def __init__(self, handlers: Handlers, max_body: int) -> None:
        self.handlers = handlers
        self.decoder = FrameDecoder(max_body=max_body)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._tasks: set[asyncio.Task[None]] = set()
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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.handlers.stats.connection_opened()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.handlers.stats.connection_closed()
        self.handlers.connection_closed(self)
        for task in list(self._tasks):
            task.cancel()
        self._drained.set()

    def pause_writing(self) -> None:
        self._drained.clear()

    def resume_writing(self) -> None:
        self._drained.set()

    def data_received(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        self._out = []
        try:
            self._process_events()
        finally:
            self._flush_out()
        if self._text_answered and not self._closing:
            self.close()

    def eof_received(self) -> bool | None:
        self.decoder.receive_data(b"")
        self._out = []
        try:
            self._process_events()
        finally:
            self._flush_out()
        return False

    # --- dispatch -------------------------------------------------------------------

    def _process_events(self) -> None:
        while not self._closing:
            event = self.decoder.next_event()
            if event is NEED_DATA:
                return
            if event is CLOSED:
                self.close()
                return
            if isinstance(event, Frame):
                self._dispatch_frame(event)
            elif isinstance(event, TextLine):
                self._dispatch_text(event)
            elif isinstance(event, OversizedFrame):
                self.handlers.stats.bad_request()
                opaque = event.header.get("opaque") if isinstance(event.header.get("opaque"), int) else None
                self.send_reply(
                    c.reply_header(
                        opaque,
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
        try:
            request = c.parse_request(frame)
        except c.RequestError as exc:
            self.handlers.stats.bad_request()
            self.send_reply(c.reply_header(exc.opaque, exc.code, exc.message))
            return
        if request.op == "quit":
            self.close()
            return
        request.origin = self
        self._run(request, self.handlers.handle(request))

    def _dispatch_text(self, line: TextLine) -> None:
        if not line.words:
            return
        self._text_answered = True
        try:
            request = c.text_request(line.words)
        except c.RequestError as exc:
            self._write(f"ERROR {exc.message}\r\n".encode())
            return
        if request.op == "quit":
            self.close()
            return
        self._run(request, self.handlers.handle_text(request), text=True)

    def _run(self, request: c.Request, result: Any, text: bool = False) -> None:
        """Send the reply now if the handler finished synchronously, else when its awaitable does."""
        if isinstance(result, Awaitable):
            task = asyncio.ensure_future(self._finish(request, result, text))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._emit(request, result, text)

    async def _finish(self, request: c.Request, awaitable: Awaitable[Any], text: bool) -> None:
        try:
            result = await awaitable
        except asyncio.CancelledError:
            return
        except c.RequestError as exc:
            result = (c.reply_header(request.opaque, exc.code, exc.message), b"")
        except Exception as exc:  # a handler bug must cost one request, not the broker
            log.exception("error serving %s from %s", request.op, self.peer)
            result = (c.reply_header(request.opaque, c.INTERNAL_ERROR, f"internal error: {exc}"), b"")
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], FileBody):
            await self.send_file_reply(result[0], result[1])
        else:
            self._emit(request, result, text)

    def _emit(self, request: c.Request, result: Any, text: bool) -> None:
        if text:
            self._write(result if isinstance(result, bytes) else str(result).encode())
            return
        header, body = result
        if isinstance(body, FileBody):
            task = asyncio.ensure_future(self.send_file_reply(header, body))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self.send_reply(header, body)

    # --- output ---------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self._out is not None:
            self._out.append(data)
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
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
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


def _loop_has_sendfile(loop: asyncio.AbstractEventLoop) -> bool:
    # uvloop inherits AbstractEventLoop.sendfile, which only raises NotImplementedError.
    return isinstance(loop, asyncio.BaseEventLoop)
