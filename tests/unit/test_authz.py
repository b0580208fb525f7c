"""Commands and authorization in one place: each command has one handler and declares its
operation, and metaq/server/authz.py is the only module that decides who may do what."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from metaq.protocol import messages as m
from metaq.security.acl import Authorizer, UserAcl
from metaq.security.principals import Principal, broker_username, principal_for
from metaq.server.authz import OPEN_BEFORE_LOGIN, Authz, FixedRules, ProducerClaim, RequestContext
from metaq.server.connection import CONNECTION_COMMANDS
from metaq.server.handlers import HANDLERS, handles

PACKAGE = Path(m.__file__).resolve().parents[1]

PRINCIPALS = {
    "anonymous": None,
    "alice": Principal("alice"),  # produce orders
    "reader": Principal("reader"),  # consume orders
    "ops": Principal("ops"),  # admin
    "nobody": Principal("nobody"),  # a user with no rule
    "slave": principal_for(broker_username(1, "slave0")),  # a broker of this group
    "foreign": principal_for(broker_username(2, "master")),  # a broker of another group
}
AUTHZ = Authz(FixedRules(Authorizer(1, {"alice": UserAcl(produce=("orders",)), "reader": UserAcl(consume=("orders",)),
                                        "ops": UserAcl(admin=True), "nobody": UserAcl()})))
EVERYONE = set(PRINCIPALS)
LOGGED_IN = EVERYONE - {"anonymous"}
GROUP_ADMINS = {"ops", "slave"}
REPLICATION = {"slave"}
CONSUMERS = {"reader", "slave"}

#: Who may send each request (header besides op and opaque): the whole decision, as a table.
TABLE: list[tuple[dict, set[str]]] = [
    ({"op": "put", "topic": "orders"}, {"alice"}),
    ({"op": "put", "topic": "payments"}, set()),
    ({"op": "get", "topic": "orders"}, CONSUMERS),
    ({"op": "get", "topic": "orders", "replica": {"slave_id": 0}}, REPLICATION),
    ({"op": "offset", "topic": "orders"}, CONSUMERS),
    ({"op": "offset_for_time", "topic": "orders"}, CONSUMERS),
    ({"op": "stats"}, LOGGED_IN),
    ({"op": "stats", "item": "reset"}, GROUP_ADMINS),
    ({"op": "stats", "item": " config "}, GROUP_ADMINS),
    ({"op": "version"}, EVERYONE),
    ({"op": "quit"}, EVERYONE),
    ({"op": "auth"}, EVERYONE),
    ({"op": "config"}, GROUP_ADMINS),
    ({"op": "topics"}, LOGGED_IN),
    ({"op": "epoch_end", "topic": "orders"}, REPLICATION),
    ({"op": "epochs", "topic": "orders"}, GROUP_ADMINS),
    ({"op": "checksum", "topic": "orders"}, GROUP_ADMINS),
    ({"op": "position", "topic": "orders"}, REPLICATION),
    ({"op": "news"}, REPLICATION),
    ({"op": "stream", "topic": "orders"}, REPLICATION),
    ({"op": "stream_ack"}, REPLICATION),
    ({"op": "init_producer"}, LOGGED_IN),
    ({"op": "transaction", "action": "commit"}, LOGGED_IN),  # the coordinator decides per branch
    ({"op": "something-new"}, GROUP_ADMINS),  # a new command is closed until someone decides
    ({"op": "put", "topic": ["orders"]}, set()),  # a topic that is no string names no topic
]


def test_every_command_has_exactly_one_handler_or_is_the_connections_own() -> None:
    commands = set(m.REQUESTS.values())
    assert set(HANDLERS) | CONNECTION_COMMANDS == commands
    assert not set(HANDLERS) & CONNECTION_COMMANDS
    with pytest.raises(TypeError, match="two handlers for 'put'"):
        handles(m.PutRequest)(lambda handlers, req, ctx: None)


def test_every_request_class_is_a_command_with_its_own_op_and_declared_operation() -> None:
    classes = {cls for cls in _subclasses(m.Request) if cls.__module__ == m.__name__}
    assert classes == set(m.REQUESTS.values()), "a request class missing from REQUESTS (or an OP given twice)"
    for cls in classes:
        assert m.REQUESTS[cls.OP] is cls
        assert "OPERATION" in vars(cls), f"{cls.__name__} does not declare the operation it needs"
    with pytest.raises(TypeError, match="declare the operation it needs"):
        type("UndeclaredRequest", (m.Request,), {"OP": "undeclared"})
    assert m.TEXT_COMMANDS <= set(m.REQUESTS)
    assert OPEN_BEFORE_LOGIN == {"auth", "version", "quit"}


def test_the_table_covers_every_command() -> None:
    assert set(m.REQUESTS) <= {header["op"] for header, _ in TABLE}


@pytest.mark.parametrize(("header", "allowed"), TABLE, ids=lambda v: repr(v) if isinstance(v, dict) else "")
def test_commands_by_principals(header: dict, allowed: set[str]) -> None:
    for name, principal in PRINCIPALS.items():
        denial = AUTHZ.request_denial(RequestContext(principal, "127.0.0.1:1", ProducerClaim()), header)
        assert (denial is None) == (name in allowed), (name, denial)


def test_security_off_allows_every_request() -> None:
    off = Authz(FixedRules(None))
    for header, _ in TABLE:
        assert off.request_denial(RequestContext(None, "127.0.0.1:1", ProducerClaim()), header) is None


def test_refusals_say_what_is_missing() -> None:
    ctx = RequestContext(PRINCIPALS["alice"], "127.0.0.1:1", ProducerClaim())
    assert AUTHZ.request_denial(ctx, {"op": "put", "topic": "payments"}) == (
        "user 'alice' may not produce topic 'payments' (no ACL rule grants it)")
    anonymous = RequestContext(None, "?", ProducerClaim())
    assert AUTHZ.request_denial(anonymous, {"op": "topics"}) == "not authenticated: send the auth handshake first"


#: Where the ACL rules may be named at all: the rules themselves, where they are loaded, and the decider.
RULE_HOLDERS = {"security/acl.py", "security/settings.py", "server/authz.py"}
#: Where an operation may be named: its declarations (requests, the gateway's routes, the console's
#: actions, which declare ADMIN), the rules, the decider.
OPERATION_DECLARERS = {"protocol/messages.py", "http/auth.py", "console/access.py", "security/acl.py", "server/authz.py"}


def test_authz_is_the_only_place_deciding() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        if where not in RULE_HOLDERS:
            assert not re.search(r"\bauthorizer\b", text), f"{where} asks the ACL rules itself (use server/authz.py)"
        if where not in OPERATION_DECLARERS:
            assert not re.search(r"\bOperation\.", text), f"{where} decides on an operation (use server/authz.py)"
        if where.startswith(("server/", "http/", "ha/")):
            assert not re.search(r"getattr\([^)]*[\"']principal[\"']", text), f"{where} reads a principal off an object"
            assert "verified_producer =" not in text or where == "server/authz.py", where


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found
