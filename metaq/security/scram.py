"""SCRAM-SHA-256 secrets as they are stored at rest (RFC 5802, RFC 7677).

A broker never needs a user's password: it keeps the salt, the iteration count and
the two derived keys (StoredKey, ServerKey), which is enough to check a client's proof
and to prove itself back, but not enough to log in as the user. The text form is

    SCRAM-SHA-256:{iterations}:{salt b64}:{stored_key b64}:{server_key b64}

The SCRAM arithmetic itself is the ``scramp`` library's; this module only stores it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

import scramp

from .errors import SecurityError

MECHANISM = "SCRAM-SHA-256"
# RFC 7677's minimum; each handshake costs the client this many HMACs (~2 ms at 4096).
DEFAULT_ITERATIONS = 4096
MAX_ITERATIONS = 1_000_000
SALT_BYTES = 16
_KEY_BYTES = hashlib.sha256().digest_size

_mechanism = scramp.ScramMechanism(MECHANISM)


@dataclass(frozen=True)
class ScramSecret:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def as_auth_info(self) -> tuple[bytes, bytes, bytes, int]:
        """The tuple scramp's server asks its ``auth_fn`` for."""
        return self.salt, self.stored_key, self.server_key, self.iterations

    def verifies(self, password: str) -> bool:
        """Whether ``password`` is the one this secret was derived from (a full PBKDF2: slow on purpose)."""
        try:
            derived = make_secret(password, self.iterations, self.salt)
        except SecurityError:
            return False  # empty, or not SASLprep-able: no password matches
        return hmac.compare_digest(derived.stored_key, self.stored_key)

    def encode(self) -> str:
        b64 = lambda raw: base64.b64encode(raw).decode("ascii")  # noqa: E731
        return f"{MECHANISM}:{self.iterations}:{b64(self.salt)}:{b64(self.stored_key)}:{b64(self.server_key)}"

    @classmethod
    def decode(cls, text: str) -> "ScramSecret":
        parts = text.strip().split(":")
        if len(parts) != 5 or parts[0] != MECHANISM:
            raise SecurityError(f"expected '{MECHANISM}:ITERATIONS:SALT:STOREDKEY:SERVERKEY', got {_redact(text)!r}")
        try:
            iterations = int(parts[1])
            salt, stored_key, server_key = (base64.b64decode(part, validate=True) for part in parts[2:])
        except (ValueError, binascii.Error):
            raise SecurityError(f"not a valid {MECHANISM} secret: {_redact(text)!r}") from None
        if not DEFAULT_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise SecurityError(f"iteration count must be in {DEFAULT_ITERATIONS}..{MAX_ITERATIONS}, got {iterations}")
        if len(salt) < 12 or len(stored_key) != _KEY_BYTES or len(server_key) != _KEY_BYTES:
            raise SecurityError(f"not a valid {MECHANISM} secret (wrong salt or key length)")
        return cls(salt, stored_key, server_key, iterations)


def _redact(text: str) -> str:
    # Enough to recognise the line, never the keys.
    return text[:24] + "..." if len(text) > 24 else text


def make_secret(password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> ScramSecret:
    """Derive the stored secret from a password (SASLprep'd by scramp)."""
    if not password:
        raise SecurityError("the password must not be empty")
    if not DEFAULT_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise SecurityError(f"iteration count must be in {DEFAULT_ITERATIONS}..{MAX_ITERATIONS}, got {iterations}")
    try:
        salt_out, stored_key, server_key, count = _mechanism.make_auth_info(password, iterations, salt)
    except scramp.ScramException as exc:
        raise SecurityError(f"cannot derive a SCRAM secret: {exc}") from None
    return ScramSecret(salt_out, stored_key, server_key, count)


def decoy_secret(username: str, key: bytes, iterations: int = DEFAULT_ITERATIONS) -> ScramSecret:
    """A secret for a user that does not exist, so the handshake looks the same as for one that does.

    RFC 5802 section 5.1: the server should not reveal at the first step that a user is
    unknown. The salt is a keyed hash of the name, so asking twice gives the same salt
    (a random one each time would give the user's absence away); the keys are random-looking
    and no password matches them, so the handshake fails at the proof check, exactly
    where a wrong password fails.
    """
    derive = lambda label: hmac.new(key, label + username.encode("utf-8"), hashlib.sha256).digest()  # noqa: E731
    return ScramSecret(
        salt=derive(b"salt:")[:SALT_BYTES],
        stored_key=derive(b"stored:"),
        server_key=derive(b"server:"),
        iterations=iterations,
    )
