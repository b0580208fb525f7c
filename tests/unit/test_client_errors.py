"""The client's error classes (metaq/client/errors.py): which 403s are an ACL's (fatal) and which are not."""

from __future__ import annotations

from metaq.client.errors import access_denied
from metaq.client.producer import classify_reply
from metaq.protocol import commands as c
from metaq.security.acl import Authorizer, Operation, UserAcl
from metaq.security.principals import Principal

AUTHORIZER = Authorizer(0, {"reader": UserAcl(consume=("t",)), "app": UserAcl(produce=("t",), consume=("t",))})


def every_user_denial() -> list[str]:
    """Each way the broker words an ACL refusal to a client (a user, or nobody logged in)."""
    cases = [
        (None, Operation.PRODUCE, "t"),
        (Principal("reader"), Operation.PRODUCE, "t"),
        (Principal("app"), Operation.PRODUCE, "other"),
        (Principal("nobody"), Operation.CONSUME, "t"),
        (Principal("app"), Operation.ADMIN, None),
        (Principal("app"), Operation.REPLICATION, None),
    ]
    denials = [AUTHORIZER.denial(principal, operation, topic) for principal, operation, topic in cases]
    assert all(denials), denials
    return denials  # type: ignore[return-value]


def test_every_acl_denial_is_fatal() -> None:
    for denial in every_user_denial():
        assert access_denied(c.FORBIDDEN, denial), denial
        failure = classify_reply(c.FORBIDDEN, f"403 {denial} (partition 0-0)")
        assert failure is not None and not failure.retriable, denial


def test_other_403s_stay_retriable() -> None:
    # A slave naming its master, a stale epoch, a fence: a failover or a retry fixes them.
    for message in ("broker 0 slave1 is a slave; writes go to its master meta://127.0.0.1:8123",
                    "stale epoch 3: the master is in epoch 4; re-sync",
                    "topic 't' does not accept publishing on this broker"):
        assert not access_denied(c.FORBIDDEN, message)
        failure = classify_reply(c.FORBIDDEN, f"403 {message}")
        assert failure is not None and failure.retriable, message


def test_a_denial_wording_with_another_code_is_not_an_acl_refusal() -> None:
    assert not access_denied(c.SERVICE_UNAVAILABLE, "user 'app' may not produce topic 't'")


def test_the_brokers_reason_field_decides_over_the_wording() -> None:
    # A broker that marks its refusals: reason "acl" is fatal whatever the words ...
    assert access_denied(c.FORBIDDEN, "refused", c.ACCESS_DENIED)
    failure = classify_reply(c.FORBIDDEN, "403 refused (partition 0-0)", reason=c.ACCESS_DENIED)
    assert failure is not None and not failure.retriable
    # ... and another reason stays retriable even if the words look like an ACL's.
    assert not access_denied(c.FORBIDDEN, "user 'app' may not produce topic 't'", "not_master")
    failure = classify_reply(c.FORBIDDEN, "403 user 'app' may not produce topic 't'", reason="not_master")
    assert failure is not None and failure.retriable
    # Without the field (an older broker) the wording still decides.
    assert access_denied(c.FORBIDDEN, "user 'app' may not produce topic 't'", None)
    assert not access_denied(c.SERVICE_UNAVAILABLE, "refused", c.ACCESS_DENIED)


def test_every_authorization_refusal_the_broker_builds_carries_the_reason() -> None:
    denial = c.AccessDenied("user 'reader' may not produce topic 't'")
    assert denial.reply(7) == {"opaque": 7, "code": c.FORBIDDEN, "msg": "user 'reader' may not produce topic 't'",
                               c.REASON_FIELD: c.ACCESS_DENIED}
    assert c.REASON_FIELD not in c.RequestError(c.FORBIDDEN, "stale epoch 3: the master is in epoch 4").reply(7)
