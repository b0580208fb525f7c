"""Result codes of the metaq protocol (MetaQ's HTTP-like codes), request errors, reply headers."""

from __future__ import annotations

from typing import Any

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


class RequestError(Exception):
    """A request that cannot be served as sent; becomes an error reply."""

    def __init__(self, code: int, message: str, opaque: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.opaque = opaque


def reply_header(opaque: int | None, code: int = OK, message: str | None = None, **fields: Any) -> dict[str, Any]:
    header: dict[str, Any] = {"opaque": opaque if opaque is not None else -1, "code": code}
    if message is not None:
        header["msg"] = message
    header.update(fields)
    return header
