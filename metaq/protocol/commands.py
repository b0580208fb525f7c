"""Commands of the metaq protocol: their header fields, result codes, and checks.

Every request header has ``op`` and ``opaque``; the reply echoes ``opaque`` and
carries ``code`` (MetaQ's HTTP-like result codes) and, on errors, ``msg``.

    op         request fields (besides op, opaque)                  body            reply
    ---------  ---------------------------------------------------  --------------  -------------------------------------------
    put        topic, partition (-1 = broker picks), [count]        records         200 partition offset msg_id count end_offset epoch
    get        topic, partition, offset, max_size, [group],         -               200 offset committed log_end + log bytes;
               [max_wait_ms], [replica: {slave_id, epoch, log_end}]                 301 offset (moved); 404 (no data yet)
    offset     topic, partition, offset                             -               200 offset min_offset max_offset
    stats      [item]                                               -               200 + text body
    version    -                                                    -               200 version
    quit       -                                                    -               (connection closed)
    config     -                                                    -               200 checksum + server.ini bytes
    topics     -                                                    -               200 topics {name: numParts} role epoch
    epoch_end  topic, partition, epoch                              -               200 epoch end_offset (largest epoch <= the
                                                                                        asked one, and where it ends in this log)
    epochs     topic, partition                                     -               200 entries [[epoch, start_offset], ...]
    checksum   topic, partition, start, end                         -               200 start end crc (CRC32 of the log bytes
                                                                                        in [start, end), end clamped to log end)
    position   topic, partition, replica: {slave_id, epoch,         -               200 committed log_end epoch
               log_end}

``get`` with a ``replica`` field is a slave's fetch: it reads past the committed
offset (up to the log end) and reports the slave's progress to the master.
``position`` reports that progress alone: a slave of a sync master sends it while it
appends a large fetch reply piece by piece, so the puts in the first pieces are acked
without waiting for the whole reply to be checked and written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .frames import Frame

OK = 200
MOVED = 301
BAD_REQUEST = 400
FORBIDDEN = 403
NOT_FOUND = 404
INTERNAL_ERROR = 500
SERVICE_UNAVAILABLE = 503
GATEWAY_TIMEOUT = 504

CODE_NAMES = {
    OK: "OK",
    MOVED: "Moved",
    BAD_REQUEST: "Bad Request",
    FORBIDDEN: "Forbidden",
    NOT_FOUND: "Not Found",
    INTERNAL_ERROR: "Internal Server Error",
    SERVICE_UNAVAILABLE: "Service Unavailable",
    GATEWAY_TIMEOUT: "Gateway Timeout",
}

#: Codes after which a producer may retry the same put elsewhere or later without
#: risking a duplicate: the broker did not store the message.
RETRIABLE_CODES = frozenset({FORBIDDEN, SERVICE_UNAVAILABLE})
#: The put may or may not have been stored (e.g. the sync wait timed out).
UNKNOWN_OUTCOME_CODES = frozenset({GATEWAY_TIMEOUT})

_OPTIONAL = object()

# op -> {field: (type, default or _REQUIRED)}
_REQUIRED = object()
REQUEST_FIELDS: dict[str, dict[str, tuple[type | tuple[type, ...], Any]]] = {
    "put": {"topic": (str, _REQUIRED), "partition": (int, -1), "count": (int, None)},
    "get": {
        "topic": (str, _REQUIRED),
        "partition": (int, _REQUIRED),
        "offset": (int, _REQUIRED),
        "max_size": (int, 1024 * 1024),
        "group": (str, ""),
        "max_wait_ms": (int, 0),
        "replica": (dict, None),
    },
    "offset": {"topic": (str, _REQUIRED), "partition": (int, _REQUIRED), "offset": (int, _REQUIRED)},
    "stats": {"item": (str, "")},
    "version": {},
    "quit": {},
    "config": {},
    "topics": {},
    "epoch_end": {"topic": (str, _REQUIRED), "partition": (int, _REQUIRED), "epoch": (int, _REQUIRED)},
    "epochs": {"topic": (str, _REQUIRED), "partition": (int, _REQUIRED)},
    "checksum": {"topic": (str, _REQUIRED), "partition": (int, _REQUIRED), "start": (int, _REQUIRED), "end": (int, _REQUIRED)},
    "position": {"topic": (str, _REQUIRED), "partition": (int, _REQUIRED), "replica": (dict, _REQUIRED)},
}

#: Commands that may be sent as a plain-text line.
TEXT_COMMANDS = frozenset({"stats", "version", "quit"})


class RequestError(Exception):
    """A request that cannot be served as sent; becomes an error reply."""

    def __init__(self, code: int, message: str, opaque: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.opaque = opaque


@dataclass
class Request:
    op: str
    opaque: int
    args: dict[str, Any]
    body: bytearray = field(default_factory=bytearray)
    #: The connection it came on (set by the server; lets the broker notice a
    #: slave's replication connection closing).
    origin: Any = None

    def __getattr__(self, name: str) -> Any:
        try:
            return self.args[name]
        except KeyError:
            raise AttributeError(name) from None


def parse_request(frame: Frame) -> Request:
    """Check a request frame's header against REQUEST_FIELDS (raises RequestError 400)."""
    header = frame.header
    opaque = header.get("opaque")
    if not isinstance(opaque, int) or isinstance(opaque, bool):
        raise RequestError(BAD_REQUEST, "request header needs an integer 'opaque'", None)
    op = header.get("op")
    if not isinstance(op, str):
        raise RequestError(BAD_REQUEST, "request header needs a string 'op'", opaque)
    spec = REQUEST_FIELDS.get(op)
    if spec is None:
        raise RequestError(BAD_REQUEST, f"unknown command {op!r}", opaque)
    args: dict[str, Any] = {}
    for name, (kind, default) in spec.items():
        value = header.get(name, _OPTIONAL)
        if value is _OPTIONAL or value is None:
            if default is _REQUIRED:
                raise RequestError(BAD_REQUEST, f"{op}: missing field {name!r}", opaque)
            args[name] = default
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise RequestError(BAD_REQUEST, f"{op}: field {name!r} must be {kind.__name__}", opaque)
        args[name] = value
    return Request(op, opaque, args, frame.body)


def reply_header(opaque: int | None, code: int = OK, message: str | None = None, **fields: Any) -> dict[str, Any]:
    header: dict[str, Any] = {"opaque": opaque if opaque is not None else -1, "code": code}
    if message is not None:
        header["msg"] = message
    header.update(fields)
    return header


def text_request(words: list[str]) -> Request:
    """A plain-text line as a Request (raises RequestError for non-text commands)."""
    op = words[0].lower() if words else ""
    if op not in TEXT_COMMANDS:
        raise RequestError(BAD_REQUEST, f"unknown text command {op!r} (try: stats, version, quit)")
    args: dict[str, Any] = {}
    if op == "stats":
        # MetaQ's text form is "stats [item] [opaque]"; a trailing number is the opaque.
        rest = [w for w in words[1:] if not w.isdigit()]
        args["item"] = rest[0] if rest else ""
    return Request(op, -1, args)
