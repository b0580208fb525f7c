"""Producer tokens: an id and epoch verify only for the user they were issued to."""

from __future__ import annotations

import pytest

from metaq.protocol import commands as c
from metaq.security.group import GroupSecret
from metaq.security.principals import Principal
from metaq.security.producer_tokens import TOKEN_CHARS, ProducerTokens
from metaq.server.authz import Authz, FixedRules, ProducerClaim, RequestContext

KEY = GroupSecret(1, b"s" * 64).producer_token_key()


class CountingTokens(ProducerTokens):
    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        self.macs = 0

    def issue(self, producer_id: int, epoch: int, user: str) -> str:
        self.macs += 1
        return super().issue(producer_id, epoch, user)


def authz_with(tokens: ProducerTokens | None) -> Authz:
    return Authz(FixedRules(None, tokens))


def sender(name: str | None) -> RequestContext:
    """A connection's requests: they share its producer claim."""
    return RequestContext(Principal(name) if name is not None else None, "127.0.0.1:1", ProducerClaim())


def test_a_token_verifies_only_for_its_id_epoch_and_user() -> None:
    tokens = ProducerTokens(KEY)
    token = tokens.issue(7, 0, "alice")
    assert len(token) == TOKEN_CHARS
    assert tokens.valid(7, 0, "alice", token)
    assert not tokens.valid(7, 0, "bob", token)  # another user's
    assert not tokens.valid(7, 1, "alice", token)  # a claimed higher epoch
    assert not tokens.valid(8, 0, "alice", token)  # the next (guessable) id
    assert not tokens.valid(7, 0, "alice", None)  # missing
    assert not tokens.valid(7, 0, "alice", "0" * TOKEN_CHARS)  # forged
    assert not tokens.valid(7, 0, "alice", 12345)  # not even a string


def test_the_key_is_the_groups_own_and_differs_from_its_other_keys() -> None:
    group = GroupSecret(1, b"s" * 64)
    assert group.producer_token_key() not in (group.heartbeat_key(), group.decoy_key())
    other_group = GroupSecret(2, b"s" * 64)
    token = ProducerTokens(group.producer_token_key()).issue(7, 0, "alice")
    assert not ProducerTokens(other_group.producer_token_key()).valid(7, 0, "alice", token)


def test_check_producer_refuses_with_403_naming_the_user() -> None:
    broker = authz_with(ProducerTokens(KEY))
    token = broker.issued_token(sender("alice"), 7, 0)["producer_token"]
    broker.check_producer(sender("alice"), 7, 0, token)
    for origin, epoch, sent in ((sender("bob"), 0, token), (sender("alice"), 1, token), (sender("alice"), 0, None),
                                (sender(None), 0, token)):
        with pytest.raises(c.RequestError) as refused:
            broker.check_producer(origin, 7, epoch, sent)
        assert refused.value.code == c.FORBIDDEN
        assert "producer id 7 not issued to" in refused.value.message


def test_a_stream_of_puts_verifies_once_per_connection_and_a_new_claim_again() -> None:
    tokens = CountingTokens(KEY)
    broker, alice = authz_with(tokens), sender("alice")
    token = tokens.issue(7, 0, "alice")
    tokens.macs = 0
    for _ in range(100):
        broker.check_producer(alice, 7, 0, token)
    assert tokens.macs == 1
    with pytest.raises(c.RequestError):
        broker.check_producer(alice, 7, 1, token)  # a different claim is checked, not served from the cache
    assert tokens.macs == 2
    broker.check_producer(alice, 7, 0, token)
    assert tokens.macs == 2  # a refused claim leaves the verified one cached
    broker.check_producer(alice, 8, 0, tokens.issue(8, 0, "alice"))  # a new id (after an unknown outcome)
    assert tokens.macs == 4
    broker.check_producer(alice, 7, 0, token)  # the cache holds the last verified claim only
    assert tokens.macs == 5


def test_security_off_issues_no_token_and_trusts_every_claim() -> None:
    broker = authz_with(None)
    assert broker.issued_token(sender(None), 7, 0) == {}
    broker.check_producer(sender(None), 7, 32767, None)


def test_principal_tags_are_the_same_on_every_broker_of_a_group_and_unlinkable_elsewhere() -> None:
    from metaq.security.principal_tags import TAG_CHARS, PrincipalTags

    master, slave = GroupSecret(1, b"s" * 64), GroupSecret(1, b"s" * 64)
    tag = PrincipalTags(master.principal_tag_key()).tag("app")
    assert tag == PrincipalTags(slave.principal_tag_key()).tag("app") and len(tag) == TAG_CHARS
    assert PrincipalTags(master.principal_tag_key()).tag("app2") != tag
    assert PrincipalTags(GroupSecret(2, b"s" * 64).principal_tag_key()).tag("app") != tag  # another group's key
    assert master.principal_tag_key() not in (master.producer_token_key(), master.decoy_key(), master.heartbeat_key())
