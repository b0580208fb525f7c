"""Framing for the metaq wire protocol: bytes in, events out, no sockets.

Theory of operation
-------------------
A connection carries a sequence of *frames* in each direction. A binary frame is::

    uint8  magic      0xCA, so a stray text byte or a lost sync is caught at once
    uint8  version    1
    uint32 header_len length of the msgpack header that follows
    uint32 body_len   length of the raw body after the header
    header            a msgpack map: requests carry "op" and "opaque", replies "code" and "opaque"
    body              raw bytes: records for a put, a log byte range for a fetch reply

The body is raw (never msgpack) so that a fetch reply can be sent with sendfile
and a slave can append it to its log verbatim.

For operators, a line of plain text is also a frame when it starts with an ASCII
letter where a binary frame would start: ``stats``, ``version`` and ``quit``
work from ``nc``/``telnet`` as in MetaQ.

The decoder is a small state machine over one receive buffer:

    state        input                                   event / next state
    -----------  --------------------------------------  -----------------------------------------
    FRAME_START  0xCA + full prefix, sizes within limits  (wait for header+body) -> Frame, FRAME_START
    FRAME_START  0xCA + prefix, header_len too large      ProtocolError(fatal) -> BROKEN
    FRAME_START  0xCA + prefix, body_len too large        OversizedFrame(header) -> SKIPPING
    FRAME_START  0xCA, wrong version                      ProtocolError(fatal) -> BROKEN
    FRAME_START  ASCII letter ... "\\n"                    TextLine -> FRAME_START
    FRAME_START  ASCII letter, no "\\n" within 1 KiB       ProtocolError(fatal) -> BROKEN
    FRAME_START  any other byte                           ProtocolError(fatal) -> BROKEN
    FRAME_START  header not a msgpack map                 BadFrame -> FRAME_START (framing intact)
    SKIPPING     body bytes of an oversized frame         (discarded) -> FRAME_START when done
    any          end of input                             Closed (an incomplete frame is reported
                                                          as ProtocolError first)
    BROKEN       anything                                 ProtocolError(fatal), again

A fatal error means the byte stream can no longer be split into frames: the
server replies with what it can and closes. A non-fatal one (BadFrame,
OversizedFrame) leaves the connection usable, so one bad request from a client
costs that request only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Union

import msgpack

MAGIC = 0xCA
VERSION = 1
PREFIX = struct.Struct(">BBII")
PREFIX_SIZE = PREFIX.size  # 10
MAX_HEADER_SIZE = 64 * 1024
MAX_TEXT_LINE = 1024
DEFAULT_MAX_BODY = 64 * 1024 * 1024


def encode_frame(header: dict[str, Any], body: bytes | bytearray | memoryview = b"") -> bytes:
    """One complete frame: prefix, msgpack header, body."""
    packed = msgpack.packb(header, use_bin_type=True)
    return PREFIX.pack(MAGIC, VERSION, len(packed), len(body)) + packed + bytes(body)


def encode_frame_head(header: dict[str, Any], body_len: int) -> bytes:
    """Prefix and header only, for a body sent separately (sendfile)."""
    packed = msgpack.packb(header, use_bin_type=True)
    return PREFIX.pack(MAGIC, VERSION, len(packed), body_len) + packed


# --- events ---------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    header: dict[str, Any]
    body: bytearray


@dataclass(frozen=True)
class TextLine:
    """A plain-text command line (``stats``, ``version``, ``quit`` from nc)."""

    words: list[str]


@dataclass(frozen=True)
class BadFrame:
    """A well-framed frame whose header is unreadable; the connection stays usable."""

    message: str


@dataclass(frozen=True)
class OversizedFrame:
    """A frame whose body is over the limit; its body is being skipped."""

    header: dict[str, Any]
    body_len: int
    limit: int


@dataclass(frozen=True)
class ProtocolError:
    """The stream cannot be parsed any further."""

    message: str
    fatal: bool = True


class _Sentinel:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA = _Sentinel("NEED_DATA")
CLOSED = _Sentinel("CLOSED")

Event = Union[Frame, TextLine, BadFrame, OversizedFrame, ProtocolError, _Sentinel]

#: The events that say the input was not a well-formed frame: for
#: ``isinstance(event, ERROR_EVENTS)`` where a side treats every parse error alike.
ERROR_EVENTS = (BadFrame, OversizedFrame, ProtocolError)

_FRAME_START, _SKIPPING, _BROKEN = "FRAME_START", "SKIPPING", "BROKEN"


class FrameDecoder:
    """Turns received bytes into frame events (see the module's transition table)."""

    def __init__(self, max_body: int = DEFAULT_MAX_BODY, allow_text: bool = True) -> None:
        self.max_body = max_body
        self.allow_text = allow_text
        self._buf = bytearray()
        self._pos = 0
        self._state = _FRAME_START
        self._skip_left = 0
        self._eof = False
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed received bytes; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        if self._state == _SKIPPING:
            data = self._skip(memoryview(data))
            if not data:
                return
        if self._pos and self._pos > len(self._buf) // 2:
            # Drop consumed bytes now and then, not on every frame: amortised O(1).
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_event(self) -> Event:
        if self._state == _BROKEN:
            assert self._error is not None
            return self._error
        if self._state == _SKIPPING:
            return CLOSED if self._eof else NEED_DATA
        available = len(self._buf) - self._pos
        if available == 0:
            return CLOSED if self._eof else NEED_DATA
        first = self._buf[self._pos]
        if first == MAGIC:
            event = self._binary_frame(available)
        elif self.allow_text and (0x41 <= first <= 0x5A or 0x61 <= first <= 0x7A):
            event = self._text_line(available)
        else:
            event = self._break(f"bad frame start byte 0x{first:02x} (expected 0x{MAGIC:02x} or a text command)")
        if event is NEED_DATA and self._eof:
            return self._break(f"connection closed inside a frame ({available} bytes left unparsed)")
        return event

    # --- internals ----------------------------------------------------------------

    def _break(self, message: str) -> ProtocolError:
        self._state = _BROKEN
        self._error = ProtocolError(message, fatal=True)
        return self._error

    def _skip(self, data: memoryview) -> memoryview:
        taken = min(self._skip_left, len(data))
        self._skip_left -= taken
        if self._skip_left == 0:
            self._state = _FRAME_START
        return data[taken:]

    def _binary_frame(self, available: int) -> Event:
        if available < PREFIX_SIZE:
            return NEED_DATA
        _magic, version, header_len, body_len = PREFIX.unpack_from(self._buf, self._pos)
        if version != VERSION:
            return self._break(f"unsupported protocol version {version} (this broker speaks {VERSION})")
        if header_len > MAX_HEADER_SIZE:
            return self._break(f"frame header of {header_len} bytes exceeds the limit of {MAX_HEADER_SIZE}")
        oversized = body_len > self.max_body
        needed = PREFIX_SIZE + header_len + (0 if oversized else body_len)
        if available < needed:
            return NEED_DATA
        start = self._pos + PREFIX_SIZE
        header_bytes = self._buf[start : start + header_len]
        body_start = start + header_len
        try:
            header = msgpack.unpackb(header_bytes, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types
            header = exc
        if oversized:
            self._pos = body_start
            in_buffer = min(body_len, len(self._buf) - self._pos)
            self._pos += in_buffer
            self._skip_left = body_len - in_buffer
            if self._skip_left:
                self._state = _SKIPPING
            return OversizedFrame(header if isinstance(header, dict) else {}, body_len, self.max_body)
        body = self._buf[body_start : body_start + body_len]
        self._pos = body_start + body_len
        if isinstance(header, Exception):
            return BadFrame(f"frame header is not valid msgpack: {header}")
        if not isinstance(header, dict):
            return BadFrame(f"frame header must be a map, got {type(header).__name__}")
        return Frame(header, body)

    def _text_line(self, available: int) -> Event:
        end = self._buf.find(b"\n", self._pos, self._pos + MAX_TEXT_LINE)
        if end < 0:
            if available >= MAX_TEXT_LINE:
                return self._break(f"text command line longer than {MAX_TEXT_LINE} bytes")
            return NEED_DATA
        raw = bytes(self._buf[self._pos : end])
        self._pos = end + 1
        try:
            line = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            return self._break("text command line is not ASCII")
        return TextLine(line.split())
