"""The Prometheus port of a secured broker (``metricsPort``).

Before, it listened on ``hostName`` and served every series to anyone, with no login and
no TLS, also with ``securityEnabled``. Now it listens on loopback unless ``metricsHost``
says otherwise, and a port other hosts can reach needs a login (``metricsPasswordFile``,
HTTP Basic) and HTTPS (``metricsTls``, the broker's certificate). Real broker processes.
"""

from __future__ import annotations

import base64
import os
import ssl
import urllib.error
import urllib.request

import pytest

from metaq.tools.launcher import free_port
from tests.security_support import TestCA

from .trust_support import SecuredGroup

TOPIC = "t"


def scrape(url: str, context: ssl.SSLContext | None = None, login: tuple[str, str] | None = None) -> tuple[int, str]:
    headers = {"Authorization": "Basic " + base64.b64encode(":".join(login).encode()).decode()} if login else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10, context=context) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_metrics_port_listens_on_loopback_by_default(broker_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    group = SecuredGroup(tmp_path / "security")
    port = free_port("127.0.0.1")
    # The broker serves clients on another address: the metrics port does not follow it.
    broker = broker_factory(0, {TOPIC: 1}, {**group.system, "hostName": "127.0.0.2", "metricsPort": port}, start=False)
    broker.host = "127.0.0.2"
    broker.start()
    status, text = scrape(f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and 'metaq_role{role="master"} 1.0' in text
    with pytest.raises(urllib.error.URLError):
        scrape(f"http://127.0.0.2:{port}/metrics")
    assert f"metrics on http://127.0.0.1:{port}/metrics" in broker.log_text()


def test_an_open_metrics_port_needs_a_login_over_https(broker_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    group = SecuredGroup(tmp_path / "security")
    ca = TestCA.create(tmp_path / "tls")
    cert, key = ca.issue("broker")
    password_file = tmp_path / "metrics.password"
    password_file.write_text("scrape-password\n")
    os.chmod(password_file, 0o600)
    port = free_port("127.0.0.1")
    broker_factory(0, {TOPIC: 1}, {
        **group.system, "tlsCertFile": str(cert), "tlsKeyFile": str(key), "tlsCaFile": str(ca.cert_file),
        "metricsPort": port, "metricsHost": "0.0.0.0", "metricsTls": True,
        "metricsUser": "prometheus", "metricsPasswordFile": str(password_file),
    })
    trusted = ssl.create_default_context(cafile=str(ca.cert_file))
    url = f"https://127.0.0.1:{port}/metrics"
    assert scrape(url, trusted)[0] == 401
    assert scrape(url, trusted, ("prometheus", "wrong"))[0] == 401
    assert scrape(url, trusted, ("metrics", "scrape-password"))[0] == 401
    status, text = scrape(url, trusted, ("prometheus", "scrape-password"))
    assert status == 200 and 'metaq_role{role="master"} 1.0' in text
    # Reachable from other hosts (0.0.0.0), and only over TLS: plain HTTP gets no answer.
    assert scrape(url.replace("127.0.0.1", "127.0.0.2"), ssl._create_unverified_context(), ("prometheus", "scrape-password"))[0] == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape(url.replace("https://", "http://"), None, ("prometheus", "scrape-password"))
