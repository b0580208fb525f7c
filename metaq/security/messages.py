"""The ``auth`` op: the authentication handshake as msgpack header fields.

Four messages, two round trips, each an ordinary request/reply pair on the connection
(frames carry no body; the SCRAM text travels in ``data``):

    request  {op: "auth", opaque, mechanism: "SCRAM-SHA-256", step: "client-first", data}
    reply    {opaque, code: 200, step: "server-first", data}
    request  {op: "auth", opaque, mechanism: "SCRAM-SHA-256", step: "client-final", data}
    reply    {opaque, code: 200, step: "server-final", data, principal}
          or {opaque, code: 403, step: "server-final", data: "e=...", msg: "authentication failed"}

A reply to a malformed or out-of-order request is ``400`` with a ``msg`` and closes the
handshake. ``data`` is at most MAX_DATA characters: SCRAM messages are short, and a
bound here keeps a hostile peer from making the server parse megabytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import MalformedMessage
from .scram import MECHANISM

OP = "auth"
CLIENT_FIRST = "client-first"
SERVER_FIRST = "server-first"
CLIENT_FINAL = "client-final"
SERVER_FINAL = "server-final"
CLIENT_STEPS = (CLIENT_FIRST, CLIENT_FINAL)
SERVER_STEPS = (SERVER_FIRST, SERVER_FINAL)
MAX_DATA = 4096

OK = 200
BAD_REQUEST = 400
FORBIDDEN = 403
FAILED_MESSAGE = "authentication failed"


@dataclass(frozen=True)
class AuthMessage:
    """One handshake message: its step and its SCRAM text."""

    step: str
    data: str


@dataclass(frozen=True)
class AuthReply:
    """A server's reply: the message plus the outcome the header carries."""

    message: AuthMessage
    code: int = OK
    principal: str | None = None
    msg: str | None = None


def _field(header: dict[str, Any], name: str, kind: str) -> str:
    value = header.get(name)
    if not isinstance(value, str):
        raise MalformedMessage(f"{kind}: field {name!r} must be a string, got {type(value).__name__}")
    return value


def _message(header: dict[str, Any], kind: str, steps: tuple[str, ...]) -> AuthMessage:
    step = _field(header, "step", kind)
    if step not in steps:
        raise MalformedMessage(f"{kind}: step must be one of {', '.join(steps)}, got {step[:40]!r}")
    data = _field(header, "data", kind)
    if not data or len(data) > MAX_DATA:
        raise MalformedMessage(f"{kind}: data must be 1..{MAX_DATA} characters, got {len(data)}")
    return AuthMessage(step, data)


def auth_request(message: AuthMessage, opaque: int) -> dict[str, Any]:
    return {"op": OP, "opaque": opaque, "mechanism": MECHANISM, "step": message.step, "data": message.data}


def parse_auth_request(header: dict[str, Any]) -> AuthMessage:
    """The message in a client's ``auth`` request header; MalformedMessage if it is not one."""
    if header.get("op") != OP:
        raise MalformedMessage(f"auth request: op must be {OP!r}, got {header.get('op')!r}")
    mechanism = header.get("mechanism")
    if mechanism != MECHANISM:
        raise MalformedMessage(f"auth request: mechanism must be {MECHANISM!r}, got {mechanism!r}")
    return _message(header, "auth request", CLIENT_STEPS)


def auth_reply(reply: AuthReply, opaque: int) -> dict[str, Any]:
    header: dict[str, Any] = {"opaque": opaque, "code": reply.code, "step": reply.message.step, "data": reply.message.data}
    if reply.principal is not None:
        header["principal"] = reply.principal
    if reply.msg is not None:
        header["msg"] = reply.msg
    return header


def parse_auth_reply(header: dict[str, Any]) -> AuthReply:
    """A server's reply header as an AuthReply; MalformedMessage if it is not one."""
    code = header.get("code")
    if code == BAD_REQUEST:
        raise MalformedMessage(f"auth reply: the server refused the request: {header.get('msg', 'no reason given')}")
    if code not in (OK, FORBIDDEN):
        raise MalformedMessage(f"auth reply: code must be {OK} or {FORBIDDEN}, got {code!r}")
    message = _message(header, "auth reply", SERVER_STEPS)
    principal = header.get("principal")
    if principal is not None and not isinstance(principal, str):
        raise MalformedMessage("auth reply: field 'principal' must be a string")
    msg = header.get("msg")
    return AuthReply(message, code, principal, msg if isinstance(msg, str) else None)

