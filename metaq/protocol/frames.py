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
    FRAME_START  prefix + header in, body still to come   FrameHead (once per frame, with announce_heads) -> ANNOUNCED
    ANNOUNCED    skip_frame() called                      (body discarded as it arrives) -> SKIPPING
    ANNOUNCED    rest of the body                         Frame -> FRAME_START
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

``FrameHead`` (with ``announce_heads``) is how the owner of the decoder decides about a body *before* it is
buffered: a frame whose body has not arrived whole with its header is announced once,
with the header and the declared length; the owner then either lets it arrive (does
nothing) or calls ``skip_frame()``, after which its body is discarded as it comes in.
A frame received whole in one piece is never announced (its bytes are already here).
``max_header`` and ``max_body`` may be changed between events (the server tightens
them for a peer that has not logged in).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Union

import msgpack

try:  # compiled during setup (setup.py, metaq/_speedups.c); the same events and bytes without it
    from .._speedups import frame_at, pack_frame  # the unit tests run both
except ImportError:
    frame_at = pack_frame = None

MAGIC = 0xCA
VERSION = 1
PREFIX = struct.Struct(">BBII")
PREFIX_SIZE = PREFIX.size  # 10
MAX_HEADER_SIZE = 64 * 1024
MAX_TEXT_LINE = 1024
DEFAULT_MAX_BODY = 64 * 1024 * 1024


def encode_frame(header: dict[str, Any], body: bytes | bytearray | memoryview = b"") -> bytes:
    """One complete frame: prefix, msgpack header, body."""
    if pack_frame is not None and (frame := pack_frame(header, body)) is not None:
        return frame  # None: a header of other types (msgpack packs it, or raises)
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
class FrameHead:
    """A frame whose body is still arriving: the header and the declared sizes, before the body is buffered."""

    header: dict[str, Any]
    header_len: int
    body_len: int

    @property
    def frame_len(self) -> int:
        return PREFIX_SIZE + self.header_len + self.body_len


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

Event = Union[Frame, FrameHead, TextLine, BadFrame, OversizedFrame, ProtocolError, _Sentinel]

#: The events that say the input was not a well-formed frame: for
#: ``isinstance(event, ERROR_EVENTS)`` where a side treats every parse error alike.
ERROR_EVENTS = (BadFrame, OversizedFrame, ProtocolError)

_FRAME_START, _SKIPPING, _BROKEN = "FRAME_START", "SKIPPING", "BROKEN"


class FrameDecoder:
    """Turns received bytes into frame events (see the module's transition table)."""

    def __init__(
        self, max_body: int = DEFAULT_MAX_BODY, allow_text: bool = True, max_header: int = MAX_HEADER_SIZE,
        announce_heads: bool = False,
    ) -> None:
        self.max_body = max_body
        self.max_header = max_header
        #: Emit FrameHead for frames whose body is still arriving (a server deciding what to buffer).
        self.announce_heads = announce_heads
        self.allow_text = allow_text
        self._buf = bytearray()
        self._pos = 0
        self._state = _FRAME_START
        self._skip_left = 0
        # The frame at _pos was announced (FrameHead): its declared size, until it completes or is skipped.
        self._announced: FrameHead | None = None
        self._eof = False
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def used_up(self) -> bool:
        """Whether ``next_event`` would say NEED_DATA with nothing buffered: every byte received
        has been made an event and the peer may send more (not closed, not broken)."""
        return self._pos == len(self._buf) and not self._eof and self._state != _BROKEN

    @property
    def held(self) -> int:
        """What the decoder holds now, or the frame it announced will hold once whole if more."""
        buffered = len(self._buf) - self._pos
        announced = self._announced
        return buffered if announced is None else max(buffered, announced.frame_len)

    @property
    def announced_frame_len(self) -> int:
        """The whole size of the announced frame still arriving (0: none): what it will buffer."""
        return self._announced.frame_len if self._announced is not None else 0

    def skip_frame(self) -> None:
        """Discard the frame just announced by FrameHead: its body is never buffered."""
        head = self._announced
        if head is None:
            raise RuntimeError("skip_frame() is only valid right after a FrameHead event")
        self._announced = None
        self._skip_from(self._pos + PREFIX_SIZE + head.header_len, head.body_len)

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
            if frame_at is not None:
                # The common case compiled: a whole frame within the limits with a plain header
                # map; None for everything else, which _binary_frame decides as ever.
                whole = frame_at(self._buf, self._pos, self.max_header, self.max_body, Frame)
                if whole is not None:
                    self._announced = None
                    event, self._pos = whole
                    return event
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

    def _header(self, header_len: int) -> Any:
        """The msgpack header of the frame at _pos (whatever it decodes to), or the decoding error."""
        start = self._pos + PREFIX_SIZE
        try:
            return msgpack.unpackb(self._buf[start : start + header_len], raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types
            return exc

    def _skip_from(self, body_start: int, body_len: int) -> None:
        """Drop a body starting at ``body_start``: what is buffered now, then the rest as it arrives."""
        in_buffer = min(body_len, len(self._buf) - body_start)
        self._pos = body_start + in_buffer
        self._skip_left = body_len - in_buffer
        if self._skip_left:
            self._state = _SKIPPING

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
        if header_len > self.max_header:
            return self._break(f"frame header of {header_len} bytes exceeds the limit of {self.max_header}")
        oversized = body_len > self.max_body
        head_len = PREFIX_SIZE + header_len
        if available < head_len:
            return NEED_DATA
        if not oversized and available < head_len + body_len:
            if self._announced is not None or not self.announce_heads:
                return NEED_DATA
            header = self._header(header_len)
            self._announced = FrameHead(header if isinstance(header, dict) else {}, header_len, body_len)
            return self._announced
        self._announced = None
        header = self._header(header_len)
        body_start = self._pos + head_len
        if oversized:
            self._skip_from(body_start, body_len)
            return OversizedFrame(header if isinstance(header, dict) else {}, body_len, self.max_body)
        body = self._buf[body_start : body_start + body_len]
        self._pos = body_start + body_len
        if isinstance(header, Exception):
            # Some msgpack errors (FormatError on a reserved byte such as 0xc1) have no text.
            return BadFrame(f"frame header is not valid msgpack: {str(header) or type(header).__name__}")
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
