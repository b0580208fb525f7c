"""server.ini's security keys, and load_broker_security turning them into working parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.config import ConfigError, SecurityConfig, parse_server_ini
from metaq.security import messages as m
from metaq.security.acl import Operation
from metaq.security.credentials import SecurityFile
from metaq.security.errors import SecurityError
from metaq.security.group import write_group_secret
from metaq.security.handshake import Authenticated, Failed
from metaq.security.principals import Principal
from metaq.security.settings import load_broker_security
from tests.security_support import TestCA


def ini(extra: str = "", broker_id: int = 0) -> bytes:
    return f"[system]\nbrokerId={broker_id}\n{extra}\n[zookeeper]\nzk.zkRoot=/sec\n".encode()


def test_security_is_off_by_default() -> None:
    config = parse_server_ini(ini(), "/etc/metaq/server.ini")
    assert config.security.enabled is False and not config.security.tls_enabled
    # Paths are resolved beside server.ini even while off, so turning it on needs one key.
    assert config.security.security_config == "/etc/metaq/security.ini"
    assert config.security.group_secret_file == "/etc/metaq/group.secret"


def test_all_keys_parse_and_resolve_relative_paths() -> None:
    config = parse_server_ini(
        ini(
            "securityEnabled=true\nsecurityConfig=sec/users.ini\ngroupSecretFile=/abs/g.secret\n"
            "tlsCertFile=tls/b.crt\ntlsKeyFile=tls/b.key\ntlsCaFile=tls/ca.pem\n"
            "tlsClientAuth=required\ntlsReloadIntervalMs=0\n"
        ),
        "/etc/metaq/server.ini",
    )
    assert config.security == SecurityConfig(
        enabled=True,
        security_config="/etc/metaq/sec/users.ini",
        group_secret_file="/abs/g.secret",
        tls_cert_file="/etc/metaq/tls/b.crt",
        tls_key_file="/etc/metaq/tls/b.key",
        tls_ca_file="/etc/metaq/tls/ca.pem",
        tls_client_auth="required",
        tls_reload_interval_ms=0,
    )
    assert config.security.tls_enabled


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("securityEnabled=maybe", r"\[system\] securityEnabled: expected true or false"),
        ("tlsClientAuth=sometimes", r"\[system\] tlsClientAuth: expected one of none, optional, required"),
        ("tlsReloadIntervalMs=-1", r"\[system\] tlsReloadIntervalMs: must be >= 0"),
        ("tlsCertFile=a.crt", r"\[system\] tlsKeyFile: required when tlsCertFile is set"),
        ("tlsKeyFile=a.key", r"\[system\] tlsCertFile: required when tlsKeyFile is set"),
        ("tlsCertFile=a\ntlsKeyFile=b\ntlsClientAuth=required", r"tlsCaFile: required when tlsClientAuth"),
        ("tlsCaFile=ca\ntlsClientAuth=optional", r"tlsClientAuth: needs TLS on"),
        ("securityConfig=", r"securityConfig: must not be empty"),
        ("securityEnable=true", r"\[system\] securityEnable: unknown key"),
    ],
)
def test_bad_security_values_name_file_and_key(extra: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        parse_server_ini(ini(extra), "conf/server.ini")
    assert str(info.value).startswith("conf/server.ini: ")


@pytest.fixture
def secured(tmp_path: Path) -> Path:
    """A broker directory with server.ini, group.secret, security.ini and TLS files."""
    write_group_secret(tmp_path / "group.secret")
    users = SecurityFile({}, str(tmp_path / "security.ini"))
    users.add_user("alice", "alice-pw", produce="orders", consume="*")
    users.save()
    ca = TestCA.create(tmp_path / "tls")
    ca.issue("broker0", file_stem="broker")
    (tmp_path / "server.ini").write_bytes(
        ini("securityEnabled=true\ntlsCertFile=tls/broker.crt\ntlsKeyFile=tls/broker.key\ntlsCaFile=tls/metaq-test-CA.pem")
    )
    return tmp_path


def _authenticate(security, username: str, password: str):  # type: ignore[no-untyped-def]
    from metaq.security.handshake import ClientAuthenticator

    client, server = ClientAuthenticator(username, password), security.server_authenticator()
    (send,) = client.start()
    (first,) = server.receive(m.auth_request(send.message, 1))
    (final,) = client.receive(m.auth_reply(first.reply, 1))
    return server.receive(m.auth_request(final.message, 2))[-1]


def test_one_setting_turns_everything_on(secured: Path) -> None:
    from metaq.config import load_server_ini

    security = load_broker_security(load_server_ini(secured / "server.ini"))
    assert security.authentication_required and security.tls is not None
    assert security.zookeeper is not None and security.zookeeper.root == "/sec"
    # A user from the security file and a broker of the group both authenticate.
    assert isinstance(_authenticate(security, "alice", "alice-pw"), Authenticated)
    slave = security.broker_authenticator("slave1")
    event = _authenticate(security, slave.username, security.group.scram_password())
    assert isinstance(event, Authenticated) and event.principal.group == 0
    assert isinstance(_authenticate(security, "broker:1:master", security.group.scram_password()), Failed)
    assert security.authorizer is not None
    assert security.authorizer.allowed(Principal("alice"), Operation.PRODUCE, "orders")
    assert security.authorizer.allowed(event.principal, Operation.REPLICATION, "orders")
    assert security.peer_client_context() is not None
    assert security.describe() == "security on (SCRAM logins, ACLs, ZooKeeper ACLs), TLS on (client certificates: none)"


class Connection:
    """A logged-in connection as ``BrokerSecurity`` sees it: it can be closed."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_reloaded_users_apply_at_once_and_a_removed_users_tokens_stop_verifying(secured: Path) -> None:
    from metaq.config import load_server_ini

    config = load_server_ini(secured / "server.ini")
    security = load_broker_security(config)
    tokens = security.producer_tokens
    assert tokens is not None
    token = tokens.issue(7, 0, "alice")
    assert tokens.valid(7, 0, "alice", token)
    assert security.reload_users() is None, "an unchanged file changes nothing"
    # The connections that proved a user's password (the principal the handshake gave, not
    # an attribute read off the connection); a broker's login is never closed by a reload.
    alice_conn, broker_conn = Connection(), Connection()
    security.logged_in(alice_conn, Principal("alice"))
    security.logged_in(broker_conn, Principal("broker:0:slave1", group=0))

    users = SecurityFile.load(config.security.security_config)
    users.remove_user("alice")
    users.add_user("bob", "bob-pw", consume="*")
    users.save()
    assert security.reload_users() == "security.ini users (added bob; removed alice; closed 1 connection(s))"
    assert alice_conn.closed and not broker_conn.closed
    assert not tokens.valid(7, 0, "alice", token), "a removed user's producer token"
    assert isinstance(_authenticate(security, "alice", "alice-pw"), Failed)
    assert isinstance(_authenticate(security, "bob", "bob-pw"), Authenticated)
    assert security.authorizer is not None and security.authorizer.allowed(Principal("bob"), Operation.CONSUME, "x")

    (secured / "security.ini").write_text("[user=broken]\n")
    with pytest.raises(SecurityError):
        security.reload_users()
    assert isinstance(_authenticate(security, "bob", "bob-pw"), Authenticated), "a bad file keeps the users"


def test_off_loads_nothing(tmp_path: Path) -> None:
    security = load_broker_security(parse_server_ini(ini(), str(tmp_path / "server.ini")))
    assert not security.authentication_required and security.tls is None and security.zookeeper is None
    assert security.peer_client_context() is None
    assert security.describe() == "security off, TLS off (plaintext)"


def test_missing_files_refuse_to_start_with_one_line(secured: Path) -> None:
    from metaq.config import load_server_ini

    (secured / "group.secret").unlink()
    with pytest.raises(SecurityError, match="group secret file .*group.secret: cannot read"):
        load_broker_security(load_server_ini(secured / "server.ini"))
    write_group_secret(secured / "group.secret")
    (secured / "security.ini").chmod(0o644)
    with pytest.raises(SecurityError, match="security file .* chmod 600"):
        load_broker_security(load_server_ini(secured / "server.ini"))


@pytest.mark.parametrize(
    "extra, named", [("securityEnabled=true", "group.secret: cannot read"), ("tlsCertFile=a.crt\ntlsKeyFile=a.key", "a.crt")]
)
def test_broker_with_a_missing_security_file_stops_with_one_line(
    tmp_path: Path, extra: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from metaq.cli import main

    (tmp_path / "server.ini").write_bytes(ini(extra))
    assert main(["broker", "-c", str(tmp_path / "server.ini")]) == 1
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
