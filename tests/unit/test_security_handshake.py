"""The sans-IO SCRAM handshake: the happy path, and every way a hostile or broken peer can fail it."""

from __future__ import annotations

from typing import Any

import pytest

from metaq.security import messages as m
from metaq.security.errors import (
    BadProof,
    MalformedMessage,
    NonceMismatch,
    ServerRejected,
    ServerSignatureMismatch,
    UnknownUser,
    WrongState,
)
from metaq.security.handshake import (
    Authenticated,
    ClientAuthenticator,
    Failed,
    SendReply,
    SendRequest,
    ServerAuthenticator,
    State,
)
from metaq.security.scram import make_secret

ALICE = make_secret("correct horse", salt=b"s" * 16)
DECOY_KEY = b"k" * 32


def server(nonce: str | None = None) -> ServerAuthenticator:
    return ServerAuthenticator(lambda name: ALICE if name == "alice" else None, DECOY_KEY, nonce=nonce)


def request(events: list[Any]) -> dict[str, Any]:
    (event,) = [e for e in events if isinstance(e, SendRequest)]
    return m.auth_request(event.message, opaque=7)


def reply(events: list[Any]) -> dict[str, Any]:
    (event,) = [e for e in events if isinstance(e, SendReply)]
    return m.auth_reply(event.reply, opaque=7)


def failure(events: list[Any]) -> Exception:
    (event,) = [e for e in events if isinstance(e, Failed)]
    return event.error


def run_to_client_final(client: ClientAuthenticator, srv: ServerAuthenticator) -> dict[str, Any]:
    """Drive both sides up to (not including) the server's check of the client-final."""
    server_first = reply(srv.receive(request(client.start())))
    return request(client.receive(server_first))


def test_full_handshake_authenticates_both_ways() -> None:
    client, srv = ClientAuthenticator("alice", "correct horse"), server()
    client_final = run_to_client_final(client, srv)
    events = srv.receive(client_final)
    assert srv.state is State.DONE and srv.principal is not None and srv.principal.name == "alice"
    assert [type(e) for e in events] == [SendReply, Authenticated]
    final_reply = reply(events)
    assert final_reply["code"] == 200 and final_reply["principal"] == "alice"
    assert client.receive(final_reply) == [Authenticated(srv.principal)]
    assert client.state is State.DONE


def test_broker_names_carry_the_group() -> None:
    secret = make_secret("group-pw")
    srv = ServerAuthenticator(lambda name: secret if name == "broker:3:slave1" else None, DECOY_KEY)
    client = ClientAuthenticator("broker:3:slave1", "group-pw")
    events = srv.receive(run_to_client_final(client, srv))
    assert srv.principal is not None and srv.principal.group == 3 and srv.principal.is_broker
    assert isinstance(events[-1], Authenticated)


def test_wrong_password_is_bad_proof_with_403() -> None:
    client, srv = ClientAuthenticator("alice", "wrong"), server()
    events = srv.receive(run_to_client_final(client, srv))
    assert isinstance(failure(events), BadProof) and not isinstance(failure(events), UnknownUser)
    header = reply(events)
    assert header["code"] == 403 and header["msg"] == m.FAILED_MESSAGE and header["data"] == "e=invalid-proof"
    assert srv.state is State.FAILED and srv.principal is None
    assert isinstance(failure(client.receive(header)), ServerRejected)


def test_unknown_user_looks_exactly_like_a_wrong_password_on_the_wire() -> None:
    """Same steps, same server-first shape and iteration count, same final reply; only the log differs."""
    fixed = "S" * 32
    known_client, known = ClientAuthenticator("alice", "wrong", nonce="c" * 24), server(nonce=fixed)
    ghost_client, ghost = ClientAuthenticator("mallory", "wrong", nonce="c" * 24), server(nonce=fixed)

    known_first = reply(known.receive(request(known_client.start())))
    ghost_first = reply(ghost.receive(request(ghost_client.start())))
    assert known_first.keys() == ghost_first.keys() and ghost_first["code"] == 200
    attributes = lambda header: dict(p.split("=", 1) for p in header["data"].split(","))  # noqa: E731
    assert attributes(ghost_first)["i"] == attributes(known_first)["i"]
    assert len(attributes(ghost_first)["s"]) == len(attributes(known_first)["s"])

    known_final = known.receive(request(known_client.receive(known_first)))
    ghost_final = ghost.receive(request(ghost_client.receive(ghost_first)))
    assert reply(known_final) == reply(ghost_final)
    assert isinstance(failure(ghost_final), UnknownUser) and "mallory" in str(failure(ghost_final))
    assert isinstance(failure(known_final), BadProof)


def test_unknown_user_salt_is_stable_so_repeated_probes_learn_nothing() -> None:
    salts = set()
    for _ in range(2):
        client, srv = ClientAuthenticator("mallory", "x"), server()
        first = reply(srv.receive(request(client.start())))
        salts.add(dict(p.split("=", 1) for p in first["data"].split(","))["s"])
    assert len(salts) == 1


def test_replayed_client_final_from_another_session_is_a_nonce_mismatch() -> None:
    recorded = run_to_client_final(ClientAuthenticator("alice", "correct horse"), server())
    # The attacker replays the client-first and then the recorded client-final on a new session.
    srv = server()
    srv.receive(request(ClientAuthenticator("alice", "whatever").start()))
    events = srv.receive(recorded)
    assert isinstance(failure(events), NonceMismatch)
    assert reply(events)["code"] == 403 and srv.state is State.FAILED


def test_replayed_server_final_is_rejected_by_a_new_client() -> None:
    """A fake server replays a server-final it recorded: the signature belongs to another session."""
    old_client, old_server = ClientAuthenticator("alice", "correct horse"), server()
    recorded = reply(old_server.receive(run_to_client_final(old_client, old_server)))

    client = ClientAuthenticator("alice", "correct horse")
    first = reply(server().receive(request(client.start())))
    client.receive(first)
    events = client.receive(recorded)
    assert isinstance(failure(events), ServerSignatureMismatch)
    assert client.state is State.FAILED and client.principal is None


def test_second_server_final_after_done_is_wrong_state() -> None:
    client, srv = ClientAuthenticator("alice", "correct horse"), server()
    final = reply(srv.receive(run_to_client_final(client, srv)))
    client.receive(final)
    assert isinstance(failure(client.receive(final)), WrongState)


def test_server_first_with_a_foreign_nonce_is_rejected() -> None:
    client = ClientAuthenticator("alice", "correct horse")
    client.start()
    other = reply(server().receive(request(ClientAuthenticator("alice", "x").start())))
    assert isinstance(failure(client.receive(other)), NonceMismatch)


def test_client_final_before_client_first_is_wrong_state() -> None:
    srv = server()
    header = m.auth_request(m.AuthMessage(m.CLIENT_FINAL, "c=biws,r=abc,p=AAAA"), 1)
    events = srv.receive(header)
    assert isinstance(failure(events), WrongState)
    assert reply(events)["code"] == 400 and srv.state is State.FAILED


def test_a_failed_handshake_stays_failed() -> None:
    srv = server()
    srv.receive(m.auth_request(m.AuthMessage(m.CLIENT_FINAL, "c=biws,r=abc,p=AAAA"), 1))
    events = srv.receive(request(ClientAuthenticator("alice", "correct horse").start()))
    assert isinstance(failure(events), WrongState) and srv.state is State.FAILED


def test_auth_after_success_is_refused_but_the_session_stays_authenticated() -> None:
    client, srv = ClientAuthenticator("alice", "correct horse"), server()
    srv.receive(run_to_client_final(client, srv))
    events = srv.receive(request(ClientAuthenticator("mallory", "x").start()))
    assert [type(e) for e in events] == [SendReply] and reply(events)["code"] == 400
    assert "already authenticated" in reply(events)["msg"]
    assert srv.state is State.DONE and srv.principal is not None and srv.principal.name == "alice"


@pytest.mark.parametrize(
    "data",
    [
        "n,,n=alice",  # truncated: no nonce
        "n,,",  # header only
        "x,,n=alice,r=abc",  # bad gs2 flag
        "n,,n=al=ice,r=abc",  # bad username escape
        "garbage",
        "n,,n=alice,r=abc,m=ext",  # mandatory extension
        "\u0000\u0001",
    ],
)
def test_malformed_client_first_is_400(data: str) -> None:
    srv = server()
    events = srv.receive(m.auth_request(m.AuthMessage(m.CLIENT_FIRST, data), 1))
    assert isinstance(failure(events), MalformedMessage)
    assert reply(events)["code"] == 400 and srv.state is State.FAILED


@pytest.mark.parametrize("cut", [5, 20, -10, -1])
def test_truncated_client_final_fails_cleanly(cut: int) -> None:
    client, srv = ClientAuthenticator("alice", "correct horse"), server()
    final = run_to_client_final(client, srv)
    final["data"] = final["data"][:cut]
    events = srv.receive(final)
    assert isinstance(failure(events), (MalformedMessage, NonceMismatch, BadProof))
    assert reply(events)["code"] in (400, 403) and srv.state is State.FAILED and srv.principal is None


@pytest.mark.parametrize(
    "header",
    [
        {"op": "auth", "mechanism": "SCRAM-SHA-256", "step": "client-first"},  # no data
        {"op": "auth", "mechanism": "SCRAM-SHA-1", "step": "client-first", "data": "n,,n=a,r=b"},
        {"op": "auth", "mechanism": "SCRAM-SHA-256", "step": "server-first", "data": "r=x"},
        {"op": "auth", "mechanism": "SCRAM-SHA-256", "step": "client-first", "data": 5},
        {"op": "auth", "mechanism": "SCRAM-SHA-256", "step": "client-first", "data": "n,,n=a,r=" + "x" * 5000},
        {"op": "put", "mechanism": "SCRAM-SHA-256", "step": "client-first", "data": "n,,n=a,r=b"},
    ],
)
def test_malformed_request_headers_are_400(header: dict[str, Any]) -> None:
    srv = server()
    events = srv.receive(header)
    assert isinstance(failure(events), MalformedMessage) and reply(events)["code"] == 400


@pytest.mark.parametrize(
    "header",
    [
        {"code": 200, "step": "server-first"},
        {"code": 500, "step": "server-first", "data": "r=x,s=y,i=4096"},
        {"code": 200, "step": "client-first", "data": "n,,n=a,r=b"},
        {"code": 400, "msg": "auth: nope"},
        {"code": 200, "step": "server-first", "data": "r=x", "principal": 3},
    ],
)
def test_malformed_reply_headers_fail_the_client(header: dict[str, Any]) -> None:
    client = ClientAuthenticator("alice", "correct horse")
    client.start()
    assert isinstance(failure(client.receive(header)), MalformedMessage)
    assert client.state is State.FAILED


def test_server_first_with_a_weak_iteration_count_is_refused() -> None:
    client = ClientAuthenticator("alice", "pw", nonce="abc")
    client.start()
    header = {"code": 200, "step": "server-first", "data": "r=abcdef,s=c2FsdHNhbHRzYWx0,i=1"}
    assert isinstance(failure(client.receive(header)), MalformedMessage)


def test_client_reply_before_start_and_double_start_are_wrong_state() -> None:
    client = ClientAuthenticator("alice", "pw")
    assert isinstance(failure(client.receive({"code": 200, "step": "server-first", "data": "r=x"})), WrongState)
    client = ClientAuthenticator("alice", "pw")
    client.start()
    assert isinstance(failure(client.start()), WrongState)


def test_server_final_in_place_of_server_first_is_wrong_state() -> None:
    client = ClientAuthenticator("alice", "pw")
    client.start()
    header = {"code": 200, "step": "server-final", "data": "v=AAAA"}
    assert isinstance(failure(client.receive(header)), WrongState)


def test_messages_round_trip_through_headers() -> None:
    message = m.AuthMessage(m.CLIENT_FIRST, "n,,n=alice,r=abc")
    assert m.parse_auth_request(m.auth_request(message, 3)) == message
    answer = m.AuthReply(m.AuthMessage(m.SERVER_FINAL, "v=xyz"), principal="alice")
    assert m.parse_auth_reply(m.auth_reply(answer, 3)) == answer


def test_unknown_user_costs_the_server_about_as_much_time_as_a_known_one() -> None:
    """The fastest of many runs, so that load on the machine does not decide the outcome."""
    import time

    def fastest(name: str) -> float:
        best = float("inf")
        prepared = []
        for _ in range(30):
            client, srv = ClientAuthenticator(name, "wrong"), server()
            first = reply(srv.receive(request(client.start())))
            prepared.append((srv, request(client.receive(first)), m.auth_request(m.AuthMessage(m.CLIENT_FIRST, f"n,,n={name},r=abc"), 1)))
        for srv, final, first_again in prepared:
            fresh = server()
            started = time.perf_counter()
            fresh.receive(first_again)
            srv.receive(final)
            best = min(best, time.perf_counter() - started)
        return best

    known, unknown = fastest("alice"), fastest("mallory")
    assert 1 / 3 < unknown / known < 3, (known, unknown)
