"""The group secret: one random value shared by the brokers of a group (a master and its slaves).

Everything a broker of the group proves about itself derives from it, each with its own
label, so that no derived value reveals another or the secret:

    SCRAM password of ``broker:{id}:{member}``  HMAC(secret, "metaq scram group {id}")
    ZooKeeper digest password                   HMAC(secret, "metaq zookeeper group {id}")
    key of the unknown-user decoys              HMAC(secret, "metaq scram decoy")
    key of the producer tokens                  HMAC(secret, "metaq producer token group {id}")
    key of the principal tags                   HMAC(secret, "metaq principal tag group {id}")

Binding the group id into each label keeps two groups that were (wrongly) given the same
secret from accepting each other's brokers under their own names. Every group must still
get its own secret: a broker holding a group's secret can act as any broker of it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SecurityError
from .files import read_private, write_private
from .principals import broker_username, parse_broker_username
from .scram import ScramSecret, make_secret

SECRET_BYTES = 32
MIN_SECRET_CHARS = 32


def new_group_secret() -> str:
    return secrets.token_hex(SECRET_BYTES)


def write_group_secret(path: str | Path) -> None:
    """A new secret in a new owner-only file; refuses to replace an existing one."""
    write_private(path, (new_group_secret() + "\n").encode("ascii"), replace=False)


@dataclass(frozen=True)
class GroupSecret:
    broker_id: int
    secret: bytes = field(repr=False)

    @classmethod
    def load(cls, path: str | Path, broker_id: int) -> "GroupSecret":
        raw = read_private(path, "group secret file").strip()
        if len(raw) < MIN_SECRET_CHARS:
            raise SecurityError(
                f"group secret file {path}: too short ({len(raw)} characters, need {MIN_SECRET_CHARS}); "
                "make one with: metaq security new-group-secret FILE"
            )
        return cls(broker_id, raw)

    def _derive(self, label: str) -> str:
        return hmac.new(self.secret, label.encode("ascii"), hashlib.sha256).hexdigest()

    def scram_password(self) -> str:
        return self._derive(f"metaq scram group {self.broker_id}")

    def zookeeper_password(self) -> str:
        return self._derive(f"metaq zookeeper group {self.broker_id}")

    def heartbeat_key(self) -> bytes:
        """The HMAC key of the group's UDP heartbeats (metaq/ha/heartbeat.py)."""
        return bytes.fromhex(self._derive(f"metaq heartbeat group {self.broker_id}"))

    def producer_token_key(self) -> bytes:
        """The HMAC key of the producer tokens (metaq/security/producer_tokens.py)."""
        return bytes.fromhex(self._derive(f"metaq producer token group {self.broker_id}"))

    def principal_tag_key(self) -> bytes:
        """The HMAC key of the principal tags (metaq/security/principal_tags.py)."""
        return bytes.fromhex(self._derive(f"metaq principal tag group {self.broker_id}"))

    def decoy_key(self) -> bytes:
        return bytes.fromhex(self._derive("metaq scram decoy"))

    def username(self, member: str) -> str:
        """The SCRAM name this broker connects to its group's master with (``master``/``slave{k}``)."""
        return broker_username(self.broker_id, member)

    def scram_secret(self) -> ScramSecret:
        """The stored secret that checks this group's brokers (derived once; PBKDF2 is slow on purpose)."""
        salt = bytes.fromhex(self._derive("metaq scram salt"))[:16]
        return make_secret(self.scram_password(), salt=salt)

    def accepts(self, username: str) -> bool:
        """True for a broker name of this group; names of other groups are unknown users here."""
        return parse_broker_username(username) == self.broker_id
