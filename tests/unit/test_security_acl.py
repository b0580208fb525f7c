"""The Authorizer: per-topic produce/consume with wildcards, admin, and replication for the group only."""

from __future__ import annotations

import pytest

from metaq.protocol.messages import Operation
from metaq.security.acl import Authorizer, UserAcl, parse_patterns
from metaq.server.authz import required_access
from metaq.security.errors import AccessDenied, SecurityError
from metaq.security.principals import Principal, broker_username, parse_broker_username, principal_for

USERS = {
    "alice": UserAcl(produce=("orders", "logs.*"), consume=("*",)),
    "ops": UserAcl(admin=True),
    "reader": UserAcl(consume=("logs.?",)),
}
AUTH = Authorizer(broker_id=0, users=USERS)
ALICE, OPS, READER = Principal("alice"), Principal("ops"), Principal("reader")
GROUP_SLAVE = principal_for("broker:0:slave1")
OTHER_GROUP = principal_for("broker:1:master")


@pytest.mark.parametrize(
    ("principal", "operation", "topic", "allowed"),
    [
        (ALICE, Operation.PRODUCE, "orders", True),
        (ALICE, Operation.PRODUCE, "logs.app", True),
        (ALICE, Operation.PRODUCE, "logs", False),
        (ALICE, Operation.PRODUCE, "orders2", False),
        (ALICE, Operation.CONSUME, "anything", True),
        (ALICE, Operation.ADMIN, None, False),
        (ALICE, Operation.REPLICATION, "orders", False),
        (ALICE, Operation.DESCRIBE, None, True),
        (READER, Operation.CONSUME, "logs.a", True),
        (READER, Operation.CONSUME, "logs.ab", False),
        (READER, Operation.PRODUCE, "logs.a", False),
        (OPS, Operation.ADMIN, None, True),
        (OPS, Operation.PRODUCE, "orders", False),
        (GROUP_SLAVE, Operation.REPLICATION, "orders", True),
        (GROUP_SLAVE, Operation.ADMIN, None, True),
        (GROUP_SLAVE, Operation.PRODUCE, "orders", False),
        # A returning master's truncation cross-check asks its new master for offsets (found
        # by python -m chaos run --scenario kill-master --secure: it never rejoined).
        (GROUP_SLAVE, Operation.CONSUME, "orders", True),
        (OTHER_GROUP, Operation.CONSUME, "orders", False),
        (OTHER_GROUP, Operation.REPLICATION, "orders", False),
        (OTHER_GROUP, Operation.ADMIN, None, False),
        (Principal("stranger"), Operation.CONSUME, "orders", False),
        (None, Operation.DESCRIBE, None, False),
    ],
)
def test_decisions(principal: Principal | None, operation: Operation, topic: str | None, allowed: bool) -> None:
    assert AUTH.allowed(principal, operation, topic) is allowed


def test_some_topic_rights_need_a_rule_for_that_operation() -> None:
    assert AUTH.any_topic_denial(ALICE, Operation.PRODUCE) is None
    assert AUTH.any_topic_denial(READER, Operation.CONSUME) is None
    assert AUTH.any_topic_denial(READER, Operation.PRODUCE) == "user 'reader' may not produce any topic (no ACL rule grants it)"
    assert AUTH.any_topic_denial(OPS, Operation.PRODUCE) is not None  # admin is not a produce rule
    assert AUTH.any_topic_denial(GROUP_SLAVE, Operation.PRODUCE) is not None
    assert AUTH.any_topic_denial(GROUP_SLAVE, Operation.CONSUME) is None
    assert AUTH.any_topic_denial(OTHER_GROUP, Operation.CONSUME) is not None
    assert AUTH.any_topic_denial(Principal("stranger"), Operation.PRODUCE) == "user 'stranger' has no permissions here"
    assert AUTH.any_topic_denial(None, Operation.PRODUCE) is not None


def test_no_user_acl_can_grant_replication() -> None:
    everything = Authorizer(0, {"root": UserAcl(produce=("*",), consume=("*",), admin=True)})
    assert not everything.allowed(Principal("root"), Operation.REPLICATION, "t")


def test_denials_say_what_is_missing() -> None:
    assert AUTH.denial(ALICE, Operation.PRODUCE, "orders2") == "user 'alice' may not produce topic 'orders2' (no ACL rule grants it)"
    assert "not authenticated" in (AUTH.denial(None, Operation.CONSUME, "x") or "")
    assert "not a broker of group 0" in (AUTH.denial(OTHER_GROUP, Operation.REPLICATION, "x") or "")
    assert "lacks the admin permission" in (AUTH.denial(ALICE, Operation.ADMIN) or "")
    assert "needs a topic" in (AUTH.denial(ALICE, Operation.PRODUCE, None) or "")
    with pytest.raises(AccessDenied, match="only brokers of group 0"):
        AUTH.check(OPS, Operation.REPLICATION, "orders")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ({"op": "auth"}, None),
        ({"op": "version"}, None),
        ({"op": "quit"}, None),
        ({"op": "put", "topic": "t"}, (Operation.PRODUCE, "t")),
        ({"op": "get", "topic": "t"}, (Operation.CONSUME, "t")),
        ({"op": "get", "topic": "t", "replica": {"slave_id": 0}}, (Operation.REPLICATION, "t")),
        ({"op": "offset", "topic": "t"}, (Operation.CONSUME, "t")),
        ({"op": "position", "topic": "t"}, (Operation.REPLICATION, "t")),
        ({"op": "epoch_end", "topic": "t"}, (Operation.REPLICATION, "t")),
        ({"op": "epochs", "topic": "t"}, (Operation.ADMIN, None)),
        ({"op": "stats"}, (Operation.DESCRIBE, None)),
        ({"op": "stats", "item": "reset"}, (Operation.ADMIN, None)),
        ({"op": "stats", "item": " config "}, (Operation.ADMIN, None)),
        ({"op": "topics"}, (Operation.DESCRIBE, None)),
        ({"op": "config"}, (Operation.ADMIN, None)),
        ({"op": "checksum", "topic": "t"}, (Operation.ADMIN, None)),
        ({"op": "something-new"}, (Operation.ADMIN, None)),
        ({"op": "put", "topic": 5}, (Operation.PRODUCE, None)),
    ],
)
def test_requests_map_to_operations(header: dict, expected: tuple | None) -> None:
    assert required_access(header) == expected


def test_a_put_with_a_non_string_topic_is_denied() -> None:
    operation, topic = required_access({"op": "put", "topic": ["x"]}) or (None, None)
    assert operation is Operation.PRODUCE and not AUTH.allowed(ALICE, operation, topic)


def test_patterns_are_checked() -> None:
    assert parse_patterns(" a , b.* ,, ") == ("a", "b.*")
    for bad in ("a/b", "[ab]", "a b"):
        with pytest.raises(SecurityError):
            parse_patterns(bad)


def test_broker_names() -> None:
    assert broker_username(3, "slave12") == "broker:3:slave12"
    assert parse_broker_username("broker:3:master") == 3
    for bad in ("broker:x:master", "broker:3:boss", "broker:3", "alice"):
        assert parse_broker_username(bad) is None
    with pytest.raises(SecurityError):
        broker_username(3, "boss")
