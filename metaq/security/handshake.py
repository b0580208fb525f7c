"""Sans-IO SCRAM-SHA-256 authenticators for both ends of the ``auth`` handshake.

Theory of operation (in the manner of h11): each side is a small state machine that
owns no socket and no clock. The wiring feeds it what arrived (a request or reply
header, already decoded from a frame) and gets back a list of events: a message to
send, ``Authenticated``, or ``Failed``. Everything that can go wrong with hostile input
(truncated text, another session's nonce, a replayed server-final, a message out of
order) is decided here and unit-tested without a network.

    client                                      server
    ------                                      ------
    start()         -- client-first  ------>   receive(): look the user up
                    <-- server-first  ------   (salt, iterations, nonce)
    receive()       -- client-final  ------>   receive(): check the proof
                    <-- server-final  ------   (proves the server holds the secret)
    receive(): check the server's signature

Transitions (state, incoming step) -> next state; anything else is WrongState and ends
the handshake, except that a finished handshake stays authenticated (a stray ``auth``
then only gets a 400 reply). ``Failed`` always means the handshake is over: close the
connection after sending the reply that comes with it.

    role    state               incoming        next
    server  AWAIT_CLIENT_FIRST  client-first    AWAIT_CLIENT_FINAL
    server  AWAIT_CLIENT_FINAL  client-final    DONE
    client  START               (start())       AWAIT_SERVER_FIRST
    client  AWAIT_SERVER_FIRST  server-first    AWAIT_SERVER_FINAL
    client  AWAIT_SERVER_FINAL  server-final    DONE
    either  any                 a failure       FAILED

Why replay cannot work: every handshake mixes a fresh random nonce from each side into
the signed AuthMessage, so a client-final or server-final recorded from another session
carries a nonce (and a signature) that does not fit this one.

An unknown user gets a decoy secret (see ``scram.decoy_secret``): the server answers the
client-first exactly as for a real user and fails at the proof, like a wrong password,
with the same reply. Only the server's own log (the Failed event) tells the two apart.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Union

import scramp
from scramp.utils import ServerError

from . import messages as m
from .errors import (
    AuthenticationError,
    BadProof,
    MalformedMessage,
    NonceMismatch,
    ServerRejected,
    ServerSignatureMismatch,
    UnknownUser,
    WrongState,
)
from .principals import Principal, principal_for
from .scram import MECHANISM, ScramSecret, decoy_secret


class State(enum.Enum):
    START = "start"
    AWAIT_CLIENT_FIRST = "await-client-first"
    AWAIT_SERVER_FIRST = "await-server-first"
    AWAIT_CLIENT_FINAL = "await-client-final"
    AWAIT_SERVER_FINAL = "await-server-final"
    DONE = "done"
    FAILED = "failed"


SERVER_TRANSITIONS = {
    (State.AWAIT_CLIENT_FIRST, m.CLIENT_FIRST): State.AWAIT_CLIENT_FINAL,
    (State.AWAIT_CLIENT_FINAL, m.CLIENT_FINAL): State.DONE,
}
CLIENT_TRANSITIONS = {
    (State.AWAIT_SERVER_FIRST, m.SERVER_FIRST): State.AWAIT_SERVER_FINAL,
    (State.AWAIT_SERVER_FINAL, m.SERVER_FINAL): State.DONE,
}


# --- events ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendRequest:
    """Client side: send this message as an ``auth`` request."""

    message: m.AuthMessage


@dataclass(frozen=True)
class SendReply:
    """Server side: send this reply to the ``auth`` request just received."""

    reply: m.AuthReply


@dataclass(frozen=True)
class Authenticated:
    principal: Principal


@dataclass(frozen=True)
class Failed:
    """The handshake is over and failed; ``error`` says why (for the log, not for the peer)."""

    error: AuthenticationError


Event = Union[SendRequest, SendReply, Authenticated, Failed]

SecretLookup = Callable[[str], "ScramSecret | None"]


def _scram_attributes(data: str) -> dict[str, str]:
    """``k=v,k=v`` to a dict, for the nonce pre-check; scramp does the full parse."""
    return dict(part.split("=", 1) for part in data.split(",") if len(part) > 1 and part[1] == "=")


def _failed_reply(code: int, scram_error: str, reason: str | None = None) -> m.AuthReply:
    message = m.AuthMessage(m.SERVER_FINAL, f"e={scram_error}")
    return m.AuthReply(message, code, msg=reason if code == m.BAD_REQUEST else m.FAILED_MESSAGE)


# --- server ----------------------------------------------------------------------------------


class ServerAuthenticator:
    """The broker's side of one connection's handshake.

    ``lookup(name)`` returns the stored secret of a user or group broker, or None;
    ``decoy_key`` keys the decoy secrets of unknown users (keep it stable across restarts so
    an unknown user's salt does not change when the broker restarts).
    """

    def __init__(self, lookup: SecretLookup, decoy_key: bytes, *, nonce: str | None = None) -> None:
        self.state = State.AWAIT_CLIENT_FIRST
        self.principal: Principal | None = None
        self._lookup = lookup
        self._decoy_key = decoy_key
        self._username: str | None = None
        self._known_user = False
        self._server = scramp.ScramMechanism(MECHANISM).make_server(self._auth_info, s_nonce=nonce)

    def _auth_info(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        self._username = username
        secret = self._lookup(username)
        self._known_user = secret is not None
        return (secret or decoy_secret(username, self._decoy_key)).as_auth_info()

    def receive(self, header: dict[str, Any]) -> list[Event]:
        """Feed one ``auth`` request header; returns the events it causes."""
        if self.state is State.DONE:
            # A finished handshake stays authenticated: a stray message is refused, nothing fails.
            reason = "auth: this connection is already authenticated"
            return [SendReply(_failed_reply(m.BAD_REQUEST, ServerError.OTHER_ERROR.value, reason))]
        try:
            message = m.parse_auth_request(header)
            if self.state is State.FAILED:
                raise WrongState("auth: this handshake already failed; open a new connection")
            next_state = SERVER_TRANSITIONS.get((self.state, message.step))
            if next_state is None:
                raise WrongState(f"auth: got {message.step} while in state {self.state.value}")
            events = self._client_first(message) if message.step == m.CLIENT_FIRST else self._client_final(message)
            self.state = next_state
            return events
        except AuthenticationError as error:
            self.state = State.FAILED
            code = m.FORBIDDEN if isinstance(error, (BadProof, NonceMismatch)) else m.BAD_REQUEST
            scram_error = ServerError.INVALID_PROOF if isinstance(error, BadProof) else ServerError.OTHER_ERROR
            return [SendReply(_failed_reply(code, scram_error.value, str(error))), Failed(error)]

    def _client_first(self, message: m.AuthMessage) -> list[Event]:
        try:
            self._server.set_client_first(message.data)
            server_first = self._server.get_server_first()
        except scramp.ScramException as exc:
            raise MalformedMessage(f"auth: bad client-first: {exc}") from None
        return [SendReply(m.AuthReply(m.AuthMessage(m.SERVER_FIRST, server_first)))]

    def _client_final(self, message: m.AuthMessage) -> list[Event]:
        if _scram_attributes(message.data).get("r") != str(self._server.nonce):
            raise NonceMismatch("auth: the client-final carries another session's nonce (replayed or spliced)")
        try:
            self._server.set_client_final(message.data)
            server_final = self._server.get_server_final()
        except scramp.ScramException as exc:
            if exc.server_error is ServerError.INVALID_PROOF:
                if not self._known_user:
                    raise UnknownUser(f"auth: unknown user {self._username!r}") from None
                raise BadProof(f"auth: wrong password for {self._username!r}") from None
            raise MalformedMessage(f"auth: bad client-final: {exc}") from None
        assert self._username is not None  # set by the client-first, which must come first
        self.principal = principal_for(self._username)
        reply = m.AuthReply(m.AuthMessage(m.SERVER_FINAL, server_final), principal=self._username)
        return [SendReply(reply), Authenticated(self.principal)]


# --- client ----------------------------------------------------------------------------------


class ClientAuthenticator:
    """A client's (or a connecting broker's) side of the handshake."""

    def __init__(self, username: str, password: str, *, nonce: str | None = None) -> None:
        self.state = State.START
        self.principal: Principal | None = None
        self.username = username
        try:
            self._client = scramp.ScramClient([MECHANISM], username, password, c_nonce=nonce)
        except scramp.ScramException as exc:
            raise MalformedMessage(f"auth: cannot use these credentials: {exc}") from None

    def start(self) -> list[Event]:
        if self.state is not State.START:
            return self._fail(WrongState(f"auth: start() called in state {self.state.value}"))
        self.state = State.AWAIT_SERVER_FIRST
        return [SendRequest(m.AuthMessage(m.CLIENT_FIRST, self._client.get_client_first()))]

    def receive(self, header: dict[str, Any]) -> list[Event]:
        """Feed one ``auth`` reply header; returns the events it causes."""
        try:
            if self.state in (State.DONE, State.FAILED, State.START):
                raise WrongState(f"auth: got a reply in state {self.state.value}")
            reply = m.parse_auth_reply(header)
            if reply.code != m.OK:
                raise ServerRejected(f"auth: the server refused: {reply.msg or reply.message.data}")
            next_state = CLIENT_TRANSITIONS.get((self.state, reply.message.step))
            if next_state is None:
                raise WrongState(f"auth: got {reply.message.step} while in state {self.state.value}")
            if reply.message.step == m.SERVER_FIRST:
                events = self._server_first(reply.message)
            else:
                events = self._server_final(reply)
            self.state = next_state
            return events
        except AuthenticationError as error:
            return self._fail(error)

    def _fail(self, error: AuthenticationError) -> list[Event]:
        self.state = State.FAILED
        return [Failed(error)]

    def _server_first(self, message: m.AuthMessage) -> list[Event]:
        nonce = _scram_attributes(message.data).get("r", "")
        if not nonce.startswith(str(self._client.c_nonce)):
            raise NonceMismatch("auth: the server-first does not extend this client's nonce (replayed or spliced)")
        try:
            self._client.set_server_first(message.data)
            client_final = self._client.get_client_final()
        except scramp.ScramException as exc:
            raise MalformedMessage(f"auth: bad server-first: {exc}") from None
        return [SendRequest(m.AuthMessage(m.CLIENT_FINAL, client_final))]

    def _server_final(self, reply: m.AuthReply) -> list[Event]:
        try:
            self._client.set_server_final(reply.message.data)
        except scramp.ScramException as exc:
            if "e" in _scram_attributes(reply.message.data):
                raise ServerRejected(f"auth: the server refused: {exc}") from None
            if "signature" in str(exc):
                raise ServerSignatureMismatch(
                    "auth: the server's signature does not match: not a server holding this secret, or a replay"
                ) from None
            raise MalformedMessage(f"auth: bad server-final: {exc}") from None
        self.principal = principal_for(self.username)
        return [Authenticated(self.principal)]
