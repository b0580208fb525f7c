"""Fuzzing both authenticators: whatever a hostile peer sends, they never raise, never
authenticate without the secret, and answer every request on the server side."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st

from metaq.security import messages as m
from metaq.security.handshake import Authenticated, ClientAuthenticator, Failed, SendReply, ServerAuthenticator, State
from metaq.security.scram import make_secret

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SECRET = make_secret("the-password", salt=b"s" * 16)

scram_text = st.one_of(
    st.text(max_size=120),
    st.lists(
        st.tuples(st.sampled_from("nrcpsiveam"), st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)),
        max_size=6,
    ).map(lambda pairs: ",".join(f"{k}={v}" for k, v in pairs)).map(lambda body: "n,," + body),
)
values = st.one_of(st.none(), st.integers(), st.text(max_size=20), st.binary(max_size=10), scram_text)
request_headers = st.fixed_dictionaries(
    {},
    optional={
        "op": st.one_of(st.just("auth"), values),
        "mechanism": st.one_of(st.just("SCRAM-SHA-256"), values),
        "step": st.one_of(st.sampled_from(m.CLIENT_STEPS + m.SERVER_STEPS), values),
        "data": st.one_of(scram_text, values),
    },
)
reply_headers = st.fixed_dictionaries(
    {},
    optional={
        "code": st.one_of(st.sampled_from([200, 400, 403]), values),
        "step": st.one_of(st.sampled_from(m.CLIENT_STEPS + m.SERVER_STEPS), values),
        "data": st.one_of(scram_text, values),
        "principal": values,
        "msg": values,
    },
)


@SETTINGS
@given(st.lists(request_headers, min_size=1, max_size=4))
def test_server_never_raises_and_never_authenticates_a_stranger(headers: list[dict[str, Any]]) -> None:
    server = ServerAuthenticator(lambda name: SECRET if name == "alice" else None, b"k" * 32)
    for header in headers:
        events = server.receive(header)
        # Every request gets exactly one reply; nobody without the password gets in.
        assert sum(isinstance(e, SendReply) for e in events) == 1
        assert not any(isinstance(e, Authenticated) for e in events)
        if any(isinstance(e, Failed) for e in events):
            assert server.state is State.FAILED
            reply = next(e for e in events if isinstance(e, SendReply)).reply
            assert m.auth_reply(reply, 1)["code"] in (400, 403)
    assert server.principal is None


@SETTINGS
@given(st.lists(reply_headers, min_size=1, max_size=3))
def test_client_never_raises_and_never_accepts_a_server_without_the_secret(headers: list[dict[str, Any]]) -> None:
    client = ClientAuthenticator("alice", "the-password", nonce="fixednonce")
    client.start()
    for header in headers:
        events = client.receive(header)
        assert not any(isinstance(e, Authenticated) for e in events)
    assert client.principal is None


@SETTINGS
@given(st.integers(min_value=0, max_value=200), st.text(alphabet="abcXYZ=+/,", min_size=1, max_size=3))
def test_any_change_to_a_valid_client_final_fails(position: int, insert: str) -> None:
    client, server = ClientAuthenticator("alice", "the-password"), ServerAuthenticator(lambda n: SECRET, b"k" * 32)
    (send,) = client.start()
    (first,) = server.receive(m.auth_request(send.message, 1))
    (final,) = client.receive(m.auth_reply(first.reply, 1))
    data = final.message.data
    cut = position % (len(data) + 1)
    tampered = data[:cut] + insert + data[cut:]
    events = server.receive(m.auth_request(m.AuthMessage(m.CLIENT_FINAL, tampered), 2))
    assert not any(isinstance(e, Authenticated) for e in events) and server.state is State.FAILED
