"""Every authorization decision, in one place: may the sender of this request do this?

With security on, a connection logs in (SCRAM) and from then on each request it sends
comes with a ``RequestContext``: who the peer proved to be, its address, and the producer
claim it last proved. ``Authz`` decides with it, in four kinds of decision:

* the command (``request_denial``): the operation and topic the request's class declares
  (``Request.access``, metaq/protocol/messages.py) against the ACLs (metaq/security/acl.py),
  before its fields are checked, so a handler never runs for a peer that may not make it;
  an unknown command needs ``admin`` (a new command is closed until someone decides);
* a producer id or epoch a request claims (``check_producer``, ``issued_token``): it must
  carry the ``producer_token`` init_producer issued for it to this user
  (metaq/security/producer_tokens.py);
* transactions (``check_may_use_transactions``, ``may_decide``, ``may_enlist``,
  ``sees_every_branch``, ``transactional_owner``): who may start, recover, decide or add to
  a branch, which only the coordinator knows (metaq/server/transactions.py asks here);
* the HTTP gateway's routes (``denial``), with the same rules as the brokers.

Refusals keep one shape: an ACL refusal is ``AccessDenied`` (403, ``"reason": "acl"``); a
producer claim that does not verify is a 403 without a reason. With security off (no
Authorizer) every request is allowed, and every client is trusted by configuration.

Replication paths need nothing of their own: a slave's fetches, position reports and
``topics`` asks (metaq/ha/peers.py) reach its master as requests of a broker principal and
are decided by ``request_denial`` like any other.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Protocol

from ..protocol import commands as c
from ..protocol.messages import REQUESTS, Access, Operation
from ..security.acl import Authorizer
from ..security.messages import OP as AUTH_OP
from ..security.principal_tags import PrincipalTags
from ..security.principals import Principal
from ..security.producer_tokens import ProducerTokens, refusal_message
from ..txn.control import NO_PRODUCER
from ..txn.coordinator import Branch

#: Ops a connection may send before it has logged in: the login itself and what its class opens.
OPEN_BEFORE_LOGIN = frozenset({AUTH_OP} | {op for op, cls in REQUESTS.items() if cls.OPERATION is None})


def required_access(header: Mapping[str, Any]) -> Access:
    """What a request's raw header needs: (operation, topic or None); None for ops open before login."""
    op = header.get("op")
    if op == AUTH_OP:
        return None
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        return Operation.ADMIN, None  # unknown: closed until someone decides otherwise
    return cls.access(header)


@dataclass
class ProducerClaim:
    """The last (producer id, epoch, token) verified on one connection: a stream of puts from one
    producer costs one HMAC, not one per put. A connection's principal never changes after its
    login, so the claim needs no principal beside it."""

    verified: tuple[int, int, str | None] | None = None


class RequestContext(NamedTuple):
    """Who sent a request, as its connection knows it (metaq/server/connection.py ``_context``:
    one per connection, made again when the principal it names is no longer the connection's).

    Immutable (so one serves every request of its principal), and a tuple because it is cheap
    to make (a frozen dataclass costs several times more)."""

    #: Who the peer proved to be; None: not logged in, or security off.
    principal: Principal | None
    #: ``host:port`` of the peer, for messages.
    peer: str
    #: The connection's verified producer claim (one object shared by its requests).
    verified_producer: ProducerClaim


class SecuritySources(Protocol):
    """Where the rules come from (metaq.security.settings.BrokerSecurity): read at each decision,
    because a reload of the security file replaces the Authorizer."""

    @property
    def authorizer(self) -> Authorizer | None: ...

    @property
    def producer_tokens(self) -> ProducerTokens | None: ...

    @property
    def principal_tags(self) -> PrincipalTags | None: ...


@dataclass(frozen=True)
class FixedRules:
    """Rules that never change while the process runs (the HTTP gateway's users file)."""

    authorizer: Authorizer | None
    producer_tokens: ProducerTokens | None = None
    principal_tags: PrincipalTags | None = None


class Authz:
    def __init__(self, sources: SecuritySources) -> None:
        self._sources = sources

    @property
    def enabled(self) -> bool:
        """Security on: requests are checked (off: every client is trusted by configuration)."""
        return self._sources.authorizer is not None

    def denial(self, principal: Principal | None, operation: Operation, topic: str | None = None) -> str | None:
        """None when ``principal`` may do ``operation`` (on ``topic``), else the one-line reason."""
        authorizer = self._sources.authorizer
        return None if authorizer is None else authorizer.denial(principal, operation, topic)

    # --- commands -------------------------------------------------------------------------------

    def request_denial(self, ctx: RequestContext, header: Mapping[str, Any]) -> str | None:
        """Why ``ctx``'s principal may not make the request of ``header``, or None."""
        authorizer = self._sources.authorizer
        if authorizer is None:
            return None  # security off: before looking at the request at all
        need = required_access(header)
        return None if need is None else authorizer.denial(ctx.principal, *need)

    # --- producer claims --------------------------------------------------------------------------

    def issued_token(self, ctx: RequestContext, producer_id: int, epoch: int) -> dict[str, str]:
        """The ``producer_token`` reply field for an init (empty with security off)."""
        tokens = self._sources.producer_tokens
        if tokens is None or ctx.principal is None:
            return {}
        return {"producer_token": tokens.issue(producer_id, epoch, ctx.principal.name)}

    def check_producer(self, ctx: RequestContext, producer_id: int, epoch: int, token: str | None) -> None:
        """RequestError 403 unless ``token`` proves ``producer_id``/``epoch`` were issued to ``ctx``'s principal.

        Invariant (security on): no put and no ``transaction`` step changes state under a
        producer id unless this passed; ids are guessable and a claimed higher epoch would
        fence the id's real owner.
        """
        tokens = self._sources.producer_tokens
        if tokens is None:
            return  # security off: trusted by configuration
        claim = (producer_id, epoch, token)
        if ctx.verified_producer.verified == claim:
            return
        principal = ctx.principal
        user = principal.name if principal is not None else "an unauthenticated peer"
        if principal is None or not tokens.valid(producer_id, epoch, principal.name, token):
            raise c.RequestError(c.FORBIDDEN, refusal_message(producer_id, user))
        ctx.verified_producer.verified = claim

    # --- transactions -----------------------------------------------------------------------------

    def transactional_owner(self, principal: Principal | None) -> tuple[str | None, bool]:
        """For an init with a transactional id: (the user who may own it, None with security off; admin?)."""
        if not self.enabled or principal is None:
            return None, False
        return principal.name, self.denial(principal, Operation.ADMIN) is None

    def sees_every_branch(self, principal: Principal | None) -> bool:
        """Admin, or security off: may recover and decide any branch (its starter or not)."""
        return not self.enabled or self.denial(principal, Operation.ADMIN) is None

    def check_may_use_transactions(self, principal: Principal | None, action: str) -> None:
        """AccessDenied unless ``principal`` may produce some topic, or (``recover``) is admin.

        ``start`` and ``recover`` only: a branch started by who could never fill it (nor so own
        one) would only cost the coordinator. One lookup, whatever is open.
        """
        authorizer = self._sources.authorizer
        if authorizer is None:
            return
        if action == "recover" and authorizer.allowed(principal, Operation.ADMIN):
            return
        denial = authorizer.any_topic_denial(principal, Operation.PRODUCE)
        if denial is not None:
            what = "start a transaction" if action == "start" else "recover transactions"
            raise c.AccessDenied(f"may not {what}: {denial}")

    def may_decide(self, principal: Principal | None, branch: Branch | None) -> bool:
        """Whether ``principal`` may act on ``branch``: its starter or admin (security off: anyone).

        A branch this broker does not hold (None: unknown, or finished: a retried commit asks
        for its outcome) may be asked about by anyone: the answer reveals no message. A branch
        with an unknown starter is admin's alone.
        """
        if self.sees_every_branch(principal) or branch is None:
            return True
        return self.is_starter(principal, branch.starter)

    def may_enlist(self, principal: Principal | None, producer_id: int, branch: Branch | None) -> bool:
        """Whether a put of ``producer_id`` from ``principal`` may join ``branch``: its own producer
        or the user that started it (security off: anyone; no branch: the coordinator refuses it).

        Not admin: deciding any branch (recovery) is an admin's duty, adding to another's is not.
        """
        if branch is None or not self.enabled:
            return True
        return producer_id == branch.producer_id != NO_PRODUCER or self.is_starter(principal, branch.starter)

    def starter_tag(self, principal: Principal | None) -> str:
        """What a branch started by ``principal`` records as its starter ("" with security off)."""
        tags = self._sources.principal_tags
        return "" if tags is None or principal is None else tags.tag(principal.name)

    def is_starter(self, principal: Principal | None, starter: str) -> bool:
        """Whether ``principal`` started a branch recording ``starter``; never for an unknown
        starter ("": a marker or journal older than starters)."""
        return bool(starter) and hmac.compare_digest(starter, self.starter_tag(principal))
