"""Stored SCRAM secrets, the security file, the group secret and the ``metaq security`` command."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metaq.cli import main
from metaq.security.credentials import SecurityFile, load_or_new
from metaq.security.errors import SecurityError
from metaq.security.group import GroupSecret, write_group_secret
from metaq.security.handshake import Authenticated, ClientAuthenticator, SendReply, SendRequest, ServerAuthenticator
from metaq.security import messages as m
from metaq.security.principals import check_user_name
from metaq.security.scram import DEFAULT_ITERATIONS, ScramSecret, decoy_secret, make_secret


def handshake(lookup, decoy_key: bytes, username: str, password: str) -> list:
    """Run a whole handshake in memory; the server's last events."""
    client, srv = ClientAuthenticator(username, password), ServerAuthenticator(lookup, decoy_key)
    (send,) = client.start()
    assert isinstance(send, SendRequest)
    (first,) = srv.receive(m.auth_request(send.message, 1))
    assert isinstance(first, SendReply)
    (final,) = client.receive(m.auth_reply(first.reply, 1))
    return srv.receive(m.auth_request(final.message, 2))


# --- SCRAM secrets ----------------------------------------------------------------------------


def test_secret_round_trips_and_never_contains_the_password() -> None:
    secret = make_secret("hunter2hunter2")
    text = secret.encode()
    assert ScramSecret.decode(text) == secret
    assert "hunter2" not in text and text.startswith(f"SCRAM-SHA-256:{DEFAULT_ITERATIONS}:")


def test_same_password_gets_a_new_salt_each_time() -> None:
    assert make_secret("pw").salt != make_secret("pw").salt


@pytest.mark.parametrize(
    "text",
    [
        "",
        "SCRAM-SHA-1:4096:AAAA:BBBB:CCCC",
        "SCRAM-SHA-256:4096:not base64!:AAAA:AAAA",
        "SCRAM-SHA-256:10:c2FsdHNhbHRzYWx0:AAAA:AAAA",
        "SCRAM-SHA-256:4096:c2FsdHNhbHRzYWx0:AAAA:AAAA",  # keys too short
        "SCRAM-SHA-256:4096:c2FsdA==",
    ],
)
def test_bad_secret_text_is_a_clear_error(text: str) -> None:
    with pytest.raises(SecurityError):
        ScramSecret.decode(text)


def test_bad_iterations_and_empty_password_are_refused() -> None:
    with pytest.raises(SecurityError, match="iteration"):
        make_secret("pw", iterations=10)
    with pytest.raises(SecurityError, match="empty"):
        make_secret("")


def test_decoy_secrets_are_stable_per_name_and_key() -> None:
    assert decoy_secret("a", b"k") == decoy_secret("a", b"k")
    assert decoy_secret("a", b"k") != decoy_secret("b", b"k")
    assert decoy_secret("a", b"k").salt != decoy_secret("a", b"other").salt


# --- the security file ------------------------------------------------------------------------


def test_security_file_round_trip_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "security.ini"
    store = load_or_new(path)
    store.add_user("alice", "pw-alice", produce="orders, logs.*", consume="*", admin=True)
    store.add_user("bob", "pw-bob", consume="orders")
    store.save()
    assert os.stat(path).st_mode & 0o777 == 0o600
    loaded = SecurityFile.load(path)
    assert loaded.users.keys() == {"alice", "bob"}
    assert loaded.acls()["alice"].produce == ("orders", "logs.*") and loaded.acls()["alice"].admin
    assert loaded.acls()["bob"].produce == () and not loaded.acls()["bob"].admin
    # The stored secret checks the password, through a real handshake.
    assert isinstance(handshake(loaded.secret_for, b"k", "alice", "pw-alice")[-1], Authenticated)


def test_security_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "security.ini"
    SecurityFile({}, str(path)).save()
    path.chmod(0o644)
    with pytest.raises(SecurityError, match="chmod 600"):
        SecurityFile.load(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[users]\n", "unknown section"),
        ("[user=alice]\nproduce=x\n", "scram: required"),
        ("[user=alice]\nscram=nope\n", r"\[user=alice\]"),
        (f"[user=alice]\nscram={make_secret('x').encode()}\nadmin=maybe\n", "true or false"),
        (f"[user=alice]\nscram={make_secret('x').encode()}\npassword=x\n", "unknown key"),
        (f"[user=alice]\nscram={make_secret('x').encode()}\nproduce=a/b\n", "topic pattern"),
        (f"[user=broker:0:master]\nscram={make_secret('x').encode()}\n", "reserved for brokers"),
        ("not ini at all", "not a valid INI"),
    ],
)
def test_bad_security_file_names_section_and_key(text: str, match: str) -> None:
    with pytest.raises(SecurityError, match=match):
        SecurityFile.parse(text.encode(), "sec.ini")


def test_user_names_are_checked() -> None:
    assert check_user_name("svc.orders@prod") == "svc.orders@prod"
    for bad in ("", "a,b", "a=b", "broker:1:master", "x" * 200):
        with pytest.raises(SecurityError):
            check_user_name(bad)


def test_remove_and_passwd(tmp_path: Path) -> None:
    store = SecurityFile({}, str(tmp_path / "s.ini"))
    store.add_user("alice", "one")
    before = store.secret_for("alice")
    store.set_password("alice", "two")
    assert store.secret_for("alice") != before
    store.remove_user("alice")
    with pytest.raises(SecurityError, match="no user"):
        store.remove_user("alice")


# --- the group secret -------------------------------------------------------------------------


def test_group_secret_authenticates_its_own_brokers_only(tmp_path: Path) -> None:
    path = tmp_path / "group.secret"
    write_group_secret(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    group = GroupSecret.load(path, broker_id=4)
    secret = group.scram_secret()
    lookup = lambda name: secret if group.accepts(name) else None  # noqa: E731
    events = handshake(lookup, group.decoy_key(), group.username("slave2"), group.scram_password())
    assert isinstance(events[-1], Authenticated) and events[-1].principal.group == 4
    # A broker of group 5 with the same secret file still fails: its name is not of group 4.
    other = GroupSecret.load(path, broker_id=5)
    events = handshake(lookup, group.decoy_key(), other.username("master"), other.scram_password())
    assert not isinstance(events[-1], Authenticated)


def test_group_secret_derivations_differ_and_are_stable(tmp_path: Path) -> None:
    path = tmp_path / "g"
    write_group_secret(path)
    a, b = GroupSecret.load(path, 0), GroupSecret.load(path, 1)
    assert len({a.scram_password(), a.zookeeper_password(), b.scram_password(), b.zookeeper_password()}) == 4
    assert a.scram_secret() == GroupSecret.load(path, 0).scram_secret()
    assert "secret=" not in repr(a) and a.secret.decode() not in repr(a)


def test_group_secret_file_problems(tmp_path: Path) -> None:
    path = tmp_path / "g"
    write_group_secret(path)
    with pytest.raises(SecurityError, match="refusing to overwrite"):
        write_group_secret(path)
    path.chmod(0o640)
    with pytest.raises(SecurityError, match="readable by other users"):
        GroupSecret.load(path, 0)
    short = tmp_path / "short"
    short.write_text("abc\n")
    short.chmod(0o600)
    with pytest.raises(SecurityError, match="too short"):
        GroupSecret.load(short, 0)
    with pytest.raises(SecurityError, match="cannot read"):
        GroupSecret.load(tmp_path / "missing", 0)


# --- metaq security ---------------------------------------------------------------------------


def test_cli_add_list_passwd_remove(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret-pass\n")
    ini = str(tmp_path / "security.ini")
    assert main(["security", "add-user", "-f", ini, "--user", "alice", "--password-file", str(pw), "--produce", "orders", "--admin"]) == 0
    assert main(["security", "list", "-f", ini]) == 0
    assert "alice\tproduce=orders consume=- admin=yes" in capsys.readouterr().out
    assert "s3cret" not in Path(ini).read_text()
    assert isinstance(handshake(SecurityFile.load(ini).secret_for, b"k", "alice", "s3cret-pass")[-1], Authenticated)
    assert main(["security", "passwd", "-f", ini, "--user", "alice", "--password-file", str(pw)]) == 0
    assert main(["security", "remove-user", "-f", ini, "--user", "alice"]) == 0
    assert main(["security", "remove-user", "-f", ini, "--user", "alice"]) == 1
    assert "no user 'alice'" in capsys.readouterr().err


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pw = tmp_path / "pw"
    pw.write_text("x\n")
    ini = str(tmp_path / "s.ini")
    assert main(["security", "add-user", "-f", ini, "--user", "broker:0:master", "--password-file", str(pw)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reserved for brokers" in err
    assert main(["security", "add-user", "-f", ini, "--user", "a", "--password-file", str(tmp_path / "nope")]) == 1
    assert main(["security", "new-group-secret", str(tmp_path / "g")]) == 0
    assert main(["security", "new-group-secret", str(tmp_path / "g")]) == 1


def test_cli_zk_super_digest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pw = tmp_path / "pw"
    pw.write_text("admin-pw\n")
    assert main(["security", "zk-super-digest", "--password-file", str(pw)]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("super:") and "admin-pw" not in out


def test_metaq_zk_refuses_a_malformed_super_digest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zk", "--port", "0", "--super-digest", "super:plaintext-password"]) == 2
    assert "super:HASH" in capsys.readouterr().err


def test_metaq_zk_port_0_needs_a_data_dir_or_ephemeral(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zk", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--data-dir" in err and "--ephemeral" in err and len(err.splitlines()) == 1
