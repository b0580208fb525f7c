"""The check that a producer id and epoch a request carries were issued to its sender.

Invariant (security on): no put and no ``transaction`` step changes state under a
producer id unless its ``producer_token`` verifies for the connection's authenticated
user, that id and that epoch (metaq/security/producer_tokens.py); otherwise 403. With
security off every client is trusted by configuration and nothing is checked.

A connection remembers the last (id, epoch, token) it verified: a stream of puts from
one producer costs one HMAC, not one per put. The principal of a connection never
changes after its login, so the cache needs no principal in its key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..protocol import commands as c
from ..security.producer_tokens import refusal_message

if TYPE_CHECKING:
    from ..security.principals import Principal


def issued_token(broker: Any, origin: Any, producer_id: int, epoch: int) -> dict[str, str]:
    """The ``producer_token`` reply field for an init (empty with security off)."""
    tokens = broker.security.producer_tokens
    principal = getattr(origin, "principal", None)
    if tokens is None or principal is None:
        return {}
    return {"producer_token": tokens.issue(producer_id, epoch, principal.name)}


def check_producer(broker: Any, origin: Any, producer_id: int, epoch: int, token: str | None,
                   principal: "Principal | None" = None) -> None:
    """RequestError 403 unless ``token`` proves ``producer_id``/``epoch`` were issued to the sender.

    The sender is ``principal``, by default ``origin``'s (the connection, which caches the claim).
    """
    tokens = broker.security.producer_tokens
    if tokens is None:
        return  # security off: trusted by configuration
    claim = (producer_id, epoch, token)
    if getattr(origin, "verified_producer", None) == claim:
        return
    principal = principal or getattr(origin, "principal", None)
    user = principal.name if principal is not None else "an unauthenticated peer"
    if principal is None or not tokens.valid(producer_id, epoch, principal.name, token):
        raise c.RequestError(c.FORBIDDEN, refusal_message(producer_id, user))
    if origin is not None:
        origin.verified_producer = claim
