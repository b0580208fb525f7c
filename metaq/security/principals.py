"""Who a peer is once the handshake succeeded: an operator-made user, or a broker of a group.

Brokers authenticate with the group secret under a name of the form
``broker:{brokerId}:{member}`` (member ``master`` or ``slave{k}``). Every broker of a group
knows the same secret, so the member part is what the peer *says* it is: it names the peer
in logs, while what it is *allowed* to do rests on the group alone. User names may not
start with ``broker:``, so no user can pose as a broker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import SecurityError

BROKER_PREFIX = "broker:"
_BROKER_NAME = re.compile(r"broker:(\d{1,4}):(master|slave\d{1,4})")
# SCRAM escapes ',' and '='; keep user names to plain characters so they read well in ACLs and logs.
_USER_NAME = re.compile(r"[A-Za-z0-9._@\-]{1,128}")


@dataclass(frozen=True)
class Principal:
    name: str
    # The broker group (brokerId) for a broker; None for a user.
    group: int | None = None

    @property
    def is_broker(self) -> bool:
        return self.group is not None

    def __str__(self) -> str:
        return f"broker {self.name!r}" if self.is_broker else f"user {self.name!r}"


def broker_username(broker_id: int, member: str) -> str:
    """The SCRAM user name a broker of group ``broker_id`` authenticates with."""
    name = f"{BROKER_PREFIX}{broker_id}:{member}"
    if not _BROKER_NAME.fullmatch(name):
        raise SecurityError(f"not a broker member name: {member!r} (expected 'master' or 'slave<k>')")
    return name


def parse_broker_username(name: str) -> int | None:
    """The group of a broker user name, or None when the name is not one."""
    match = _BROKER_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def principal_for(name: str) -> Principal:
    return Principal(name, parse_broker_username(name))


def check_user_name(name: str) -> str:
    """A valid name for an operator-made user; SecurityError naming the rule otherwise."""
    if name.startswith(BROKER_PREFIX):
        raise SecurityError(f"user name {name!r}: names starting with {BROKER_PREFIX!r} are reserved for brokers")
    if not _USER_NAME.fullmatch(name):
        raise SecurityError(f"user name {name!r}: use 1-128 letters, digits, '.', '_', '@' or '-'")
    return name
