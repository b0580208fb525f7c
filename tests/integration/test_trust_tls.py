"""Everything on, as docs/security.md says to turn it on: TLS for every link, SCRAM, ACLs.

A sync master and slave with certificates from a test CA replicate over TLS (the slave
verifies the master by the CA, then authenticates with the group secret); ``metaq produce``
and ``metaq consume`` log in with ``--user --password-file --tls-ca``. A plaintext client,
and a TLS client without credentials, get nothing.
"""

from __future__ import annotations

import json

import pytest

from metaq.client.connection import BrokerConnection, ConnectionClosed, Credentials

from .trust_support import PASSWORDS, metaq, run, start_tls_pair

TOPIC = "t"


def test_tls_and_scram_end_to_end_with_the_cli(broker_factory, zk, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _group, ca, master, _slave = start_tls_pair(broker_factory, zk_client, zk_root, tmp_path, {TOPIC: 2})

    password_file = tmp_path / "app.password"
    password_file.write_text(PASSWORDS["app"] + "\n")
    login = ["--user", "app", "--password-file", str(password_file), "--tls-ca", str(ca.cert_file)]
    zk_args = ["--zk", zk.connect_string, "--zk-root", zk_root, "--topic", TOPIC]
    done = metaq("produce", *zk_args, *login, "--count", "30", "--size", "20")
    assert done.returncode == 0 and "sent 30 of 30" in done.stdout.decode(), done.stderr
    consume = ["consume", *zk_args, *login, "--group", "g", "--from-beginning", "--recover-dir", str(tmp_path / "r")]
    done = metaq(*consume, "--max", "30")
    assert done.returncode == 0 and len(done.stdout.decode().splitlines()) == 30, done.stderr

    refused = metaq("produce", *zk_args, "--tls-ca", str(ca.cert_file), "--count", "1", "--send-timeout", "3")
    assert refused.returncode != 0 and "sent 0 of 1" in (refused.stdout + refused.stderr).decode()

    async def plaintext() -> None:
        conn = await BrokerConnection.open(*master.address, authenticator=Credentials("app", PASSWORDS["app"]).authenticator())
        conn.close()

    with pytest.raises((ConnectionClosed, OSError)):
        run(plaintext())

    # docs/operations.md, "Cluster health": a tool left without --tls-ca says so, logged in or
    # not, instead of calling a running TLS broker "unreachable".
    for login_args in ([], ["--user", "app", "--password-file", str(password_file)]):
        shown = metaq("cluster", "--zk", zk.connect_string, "--zk-root", zk_root, "--json", *login_args)
        report = json.loads(shown.stdout)
        assert shown.returncode == 1 and {m["state"] for m in report["members"]} == {"needs TLS (--tls-ca)"}, shown.stdout
        assert report["problems"] == [f"UNKNOWN broker group 0: master needs TLS (--tls-ca) ({master.url}): "
                                      "pass --tls-ca with the CA of the brokers' certificates"]
