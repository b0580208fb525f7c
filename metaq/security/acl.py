"""The Authorizer: the ACL rules, and whether they let this principal do this operation (on this topic).

Only metaq/server/authz.py asks it (the broker's connections, its handlers and transaction
coordinator, and the HTTP gateway all decide there); which operation a request needs is
declared by its class (metaq/protocol/messages.py).

Operations and who holds them:

    produce      users, per topic pattern (``produce=orders, logs.*``)
    consume      users, per topic pattern, and the group's own brokers (a returning
                 master's truncation cross-check and an empty slave ask its master for
                 offsets; a replica ``get`` already gives them every byte)
    describe     every authenticated principal (topics, plain stats, offsets)
    admin        users with ``admin=true``, and the group's own brokers
                 (stats reset, stats config, the config fetch, checksums, and the
                 ``epochs`` history: a read that changes nothing, which a drill needs
                 to tell the new master's acks apart)
    replication  only brokers of this broker's group: a replica ``get``, ``position``,
                 ``epoch_end`` (the truncation answer); no rule can give it to a user

Patterns are topic names with ``*`` (any run of characters) and ``?`` (one character).
Unknown principals and unauthenticated connections are denied with a message that
says what was missing, never what exists.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Mapping

from ..protocol.messages import Operation
from .errors import AccessDenied, SecurityError
from .principals import Principal


TOPIC_OPERATIONS = (Operation.PRODUCE, Operation.CONSUME)
_PATTERN = re.compile(r"[A-Za-z0-9._\-*?]{1,200}")


def parse_patterns(text: str) -> tuple[str, ...]:
    """``"orders, logs.*"`` -> ("orders", "logs.*"); SecurityError on a character topics cannot have."""
    patterns = tuple(part.strip() for part in text.split(",") if part.strip())
    for pattern in patterns:
        if not _PATTERN.fullmatch(pattern):
            raise SecurityError(f"topic pattern {pattern!r}: use topic-name characters plus '*' and '?'")
    return patterns


@dataclass(frozen=True)
class UserAcl:
    produce: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    admin: bool = False

    def patterns(self, operation: Operation) -> tuple[str, ...]:
        return self.produce if operation is Operation.PRODUCE else self.consume


@dataclass(frozen=True)
class Authorizer:
    """Decisions for the brokers of group ``broker_id`` over the users in ``users``."""

    broker_id: int
    users: Mapping[str, UserAcl] = field(default_factory=dict)

    def allowed(self, principal: Principal | None, operation: Operation, topic: str | None = None) -> bool:
        return self.denial(principal, operation, topic) is None

    def check(self, principal: Principal | None, operation: Operation, topic: str | None = None) -> None:
        reason = self.denial(principal, operation, topic)
        if reason is not None:
            raise AccessDenied(reason)

    def denial(self, principal: Principal | None, operation: Operation, topic: str | None = None) -> str | None:
        """None when allowed, else the one-line reason (what a 403 reply's ``msg`` says)."""
        if principal is None:
            return "not authenticated: send the auth handshake first"
        if operation in TOPIC_OPERATIONS and not topic:
            return f"{operation.value} needs a topic"
        if operation is Operation.DESCRIBE:
            return None
        if principal.is_broker:
            if principal.group != self.broker_id:
                return f"{principal} is not a broker of group {self.broker_id}"
            if operation in (Operation.REPLICATION, Operation.ADMIN, Operation.CONSUME):
                return None
            return f"{principal} may not {operation.value} (brokers only replicate and read)"
        if operation is Operation.REPLICATION:
            return f"{principal} may not replicate: only brokers of group {self.broker_id} may"
        acl = self.users.get(principal.name)
        if acl is None:
            return f"{principal} has no permissions here"
        if operation is Operation.ADMIN:
            return None if acl.admin else f"{principal} lacks the admin permission"
        assert topic is not None
        if any(fnmatch.fnmatchcase(topic, pattern) for pattern in acl.patterns(operation)):
            return None
        return f"{principal} may not {operation.value} topic {topic!r} (no ACL rule grants it)"

    def any_topic_denial(self, principal: Principal | None, operation: Operation) -> str | None:
        """None when some ACL rule grants ``operation`` (produce or consume) on some topic, else the reason.

        For requests that name no topic yet but are only of use to who may write or read one
        (a transaction ``start``: without produce the branch could hold nothing). One lookup,
        no pattern matching: it costs the same whatever the user's rules."""
        assert operation in TOPIC_OPERATIONS, operation
        if principal is None:
            return "not authenticated: send the auth handshake first"
        if principal.is_broker:
            return self.denial(principal, operation, "*")
        acl = self.users.get(principal.name)
        if acl is None:
            return f"{principal} has no permissions here"
        if acl.patterns(operation):
            return None
        return f"{principal} may not {operation.value} any topic (no ACL rule grants it)"
