"""The HTTP link. ``metaq http`` serves HTTPS (``--tls-cert --tls-key``), lets HTTP
clients log in as the security file's users with their ACLs (``--http-users``), and logs in to
a secured group's brokers like any client (``--user --password-file --tls-ca``).

A secured master (SCRAM, ACLs, TLS on its listener) and a gateway as real processes: a
message produced over HTTPS by one user is fetched back by another; no login gets 401, a
user without the produce ACL 403; a plain-HTTP request to the HTTPS port gets no answer; a
gateway without a broker login gets the brokers' refusal (403) and stores nothing.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest

from metaq.http.process import GatewayProcess
from tests.security_support import TestCA

from .trust_support import PASSWORDS, SecuredGroup, metaq

TOPIC = "t"


def call(url: str, context: ssl.SSLContext | None, payload: Any = None, user: str | None = None) -> tuple[int, Any]:
    body = json.dumps(payload).encode() if payload is not None else None
    headers = {"Content-Type": "application/json"}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    request = urllib.request.Request(url, data=body, method="POST" if body else "GET", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_https_gateway_logged_in_to_a_secured_group(broker_factory, zk, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    group = SecuredGroup(tmp_path / "security")
    ca = TestCA.create(tmp_path / "tls")
    broker_cert, broker_key = ca.issue("broker")
    tls = {"tlsCertFile": str(broker_cert), "tlsKeyFile": str(broker_key), "tlsCaFile": str(ca.cert_file)}
    broker_factory(0, {TOPIC: 1}, {"unflushThreshold": 0, **group.system, **tls})
    password_file = tmp_path / "app.password"
    password_file.write_text(PASSWORDS["app"] + "\n")
    http_cert, http_key = ca.issue("gateway")
    https = ["--tls-cert", str(http_cert), "--tls-key", str(http_key)]
    login = ["--user", "app", "--password-file", str(password_file), "--tls-ca", str(ca.cert_file)]
    trusted = ssl.create_default_context(cafile=str(ca.cert_file))

    users = ["--http-users", str(group.users_file)]
    gateway = GatewayProcess(zk.connect_string, zk_root, tmp_path / "gateway.log", None, *https, *users, *login).start()
    try:
        assert gateway.url.startswith("https://")
        produce = f"{gateway.url}/topics/{TOPIC}/messages"
        status, reply = call(produce, trusted, {"data": "over https"}, user="app")
        assert status == 200 and reply["results"][0]["success"], reply
        offset = reply["results"][0]["offset"]
        status, page = call(f"{gateway.url}/topics/{TOPIC}/partitions/0-0/messages?offset={offset}&read_from=master&encoding=utf-8", trusted, user="reader")
        assert status == 200 and page["messages"][0]["data"] == "over https", page
        # HTTP clients log in as the brokers' users, with their ACLs: none, or reader's (consume only).
        assert call(produce, trusted, {"data": "anonymous"})[0] == 401
        status, reply = call(produce, trusted, {"data": "from reader"}, user="reader")
        assert status == 403 and "may not produce" in reply["error"], reply
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            call(gateway.url.replace("https://", "http://") + "/topics", None)
    finally:
        gateway.stop()

    anonymous = GatewayProcess(zk.connect_string, zk_root, tmp_path / "anonymous.log", None, "--tls-ca", str(ca.cert_file), "--send-timeout", "2").start()
    try:
        status, reply = call(f"{anonymous.url}/topics/{TOPIC}/messages", None, {"data": "no login"})
        result = reply["results"][0]
        assert status != 200 and not result["success"] and result["code"] == 403, reply
        assert "not authenticated" in result["error"], reply
    finally:
        anonymous.stop()


def test_https_options_are_checked_before_anything_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plain = metaq("http", "--zk", "127.0.0.1:1", "--http-users", str(tmp_path / "security.ini"))
    assert plain.returncode == 2 and "--http-users needs --tls-cert" in plain.stderr.decode()
    alone = metaq("http", "--zk", "127.0.0.1:1", "--tls-cert", str(tmp_path / "c.pem"))
    assert alone.returncode == 2 and "--tls-cert and --tls-key go together" in alone.stderr.decode()
    missing = metaq("http", "--zk", "127.0.0.1:1", "--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem"))
    assert missing.returncode == 1 and "c.pem" in missing.stderr.decode() and "Traceback" not in missing.stderr.decode()
