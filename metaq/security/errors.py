"""Security errors: each one a single line naming what failed, never a secret."""

from __future__ import annotations

from ..errors import MetaqError


class SecurityError(MetaqError):
    """A security file, key or certificate is missing or wrong."""


class AuthenticationError(MetaqError):
    """The handshake failed. Subclasses say why; the peer only ever learns "failed"."""


class BadProof(AuthenticationError):
    """The client's proof does not match the stored secret: a wrong password."""


class UnknownUser(BadProof):
    """No such user. A BadProof on the wire: the peer cannot tell it from a wrong password."""


class NonceMismatch(AuthenticationError):
    """A message carries another session's nonce: a replayed or spliced message."""


class ServerSignatureMismatch(AuthenticationError):
    """The server-final does not prove knowledge of the secret: a fake or replayed server."""


class WrongState(AuthenticationError):
    """A message arrived in a state that does not expect it (out of order, or after the end)."""


class MalformedMessage(AuthenticationError):
    """A message is truncated, not SCRAM, or its header fields are missing or mistyped."""


class ServerRejected(AuthenticationError):
    """The server ended the handshake with an error (``e=...``)."""


class AccessDenied(MetaqError):
    """An authenticated principal asked for an operation no rule grants it."""
