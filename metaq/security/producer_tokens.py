"""Producer tokens: proof that a producer id and epoch were issued to a user.

A producer id and epoch that arrive in a put or a ``transaction`` step are a claim: ids
are handed out in order and easy to guess, and a claimed higher epoch would fence the
id's real owner. With security on, ``init_producer`` therefore answers, next to the id
and epoch, ``producer_token`` = HMAC-SHA256(key, "{producer id}:{epoch}:{user}")
(hex, truncated to 128 bits). Every request that carries a producer id must carry that
token, and the broker accepts it only for the connection's authenticated user
(``hmac.compare_digest``); the epoch is inside the MAC, so no epoch above the issued one
can be claimed.

The key derives from the group secret with its own label (metaq/security/group.py), so
every broker of the group verifies a token without shared state: it holds through a
failover. A token of another group does not verify here (its group's key differs).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Callable

#: Hex characters kept of the SHA-256 MAC (128 bits: unforgeable, short on the wire).
TOKEN_CHARS = 32


class ProducerTokens:
    """Issues and checks tokens with one group's key."""

    def __init__(self, key: bytes, known_user: Callable[[str], bool] = lambda name: True) -> None:
        self._key = key
        #: Whether ``user`` may hold tokens now (a user removed from security.ini may not).
        self._known_user = known_user

    def issue(self, producer_id: int, epoch: int, user: str) -> str:
        message = f"{producer_id}:{epoch}:{user}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:TOKEN_CHARS]

    def valid(self, producer_id: int, epoch: int, user: str, token: object) -> bool:
        """True only for the token ``issue`` gives for exactly this id, epoch and user."""
        if not isinstance(token, str) or len(token) != TOKEN_CHARS or not self._known_user(user):
            return False
        return hmac.compare_digest(self.issue(producer_id, epoch, user), token)


def refusal_message(producer_id: int, user: str) -> str:
    return f"producer id {producer_id} not issued to {user} (missing or wrong producer_token for this id and epoch)"
