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


#: The reply field that says why a request was refused, for clients to act on without
#: reading ``msg``; present only where the broker sets it (on other errors it is absent).
REASON_FIELD = "reason"
#: ``reason`` of a 403 an authorization rule decided (an ACL, a missing login, a branch that
#: is another user's): it stays refused on every broker of the group until an operator
#: changes the rights, so a client fails at once instead of retrying. A broker that is not the
#: acting master refuses replication and ``epoch_end`` with ``reason: "not_master"``
#: (metaq/ha/answerer.py). Other 403s (a slave naming its master to a producer, a stale epoch,
#: a fence) carry no ``reason``: a retry may succeed.
ACCESS_DENIED = "acl"


class RequestError(Exception):
    """A request that cannot be served as sent; becomes an error reply (``reply(opaque)``)."""

    def __init__(self, code: int, message: str, opaque: int | None = None, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.opaque = opaque
        self.reason = reason

    def reply(self, opaque: int | None) -> dict[str, Any]:
        """The error reply's header (``reason`` included when set)."""
        fields = {REASON_FIELD: self.reason} if self.reason is not None else {}
        return reply_header(opaque, self.code, self.message, **fields)


class AccessDenied(RequestError):
    """403 with ``reason: "acl"``: every authorization refusal is built as one of these."""

    def __init__(self, message: str, opaque: int | None = None) -> None:
        super().__init__(FORBIDDEN, message, opaque, reason=ACCESS_DENIED)


def reply_header(opaque: int | None, code: int = OK, message: str | None = None, **fields: Any) -> dict[str, Any]:
    header: dict[str, Any] = {"opaque": opaque if opaque is not None else -1, "code": code}
    if message is not None:
        header["msg"] = message
    header.update(fields)
    return header
