"""Password checks of the HTTP gateway (``metaq http --http-users``).

A real ZooKeeper and a real gateway process serving HTTPS. The users' secrets have 50,000
PBKDF2 iterations, so a check costs tens of milliseconds and its absence or its place
shows in the timings:

* a wrong password for a known user and any password for an unknown one take the same
  time (the decoy is checked): before, an unknown user was refused ~5x faster;
* four clients hammering wrong passwords leave a logged-in user's latency bounded (the
  check runs in a thread pool): before, each wrong password stalled the event loop;
* failed logins are rate-limited per client address and per user: 429 with Retry-After,
  while a user already logged in keeps working and other users from other addresses too.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import statistics
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from metaq.http.process import GatewayProcess
from metaq.security.credentials import SecurityFile
from tests.security_support import TestCA

ITERATIONS = 50_000
PASSWORDS = {"app": "app-password", "victim": "victim-password", "reader": "reader-password"}


class Client:
    """One keep-alive HTTPS connection to the gateway (from ``source`` when given)."""

    def __init__(self, gateway: GatewayProcess, context: ssl.SSLContext, source: str | None = None) -> None:
        self.connection = http.client.HTTPSConnection("127.0.0.1", gateway.port, context=context, timeout=60,
                                                      source_address=(source, 0) if source else None)

    def get(self, user: str, password: str) -> tuple[int, float, http.client.HTTPResponse]:
        """Status, seconds taken and the response of ``GET /topics`` as ``user``."""
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        started = time.perf_counter()
        self.connection.request("GET", "/topics", headers={"Authorization": f"Basic {token}"})
        response = self.connection.getresponse()
        response.read()
        return response.status, time.perf_counter() - started, response

    def close(self) -> None:
        self.connection.close()


@pytest.fixture
def https(tmp_path: Path) -> tuple[Path, list[str], ssl.SSLContext]:
    """The users file (every secret at ITERATIONS), the gateway's HTTPS options, and a client context trusting it."""
    users = SecurityFile({}, str(tmp_path / "security.ini"))
    for name, password in PASSWORDS.items():
        users.add_user(name, password, produce="*", consume="*", iterations=ITERATIONS)
    users.save()
    ca = TestCA.create(tmp_path / "tls")
    cert, key = ca.issue("gateway")
    return tmp_path / "security.ini", ["--tls-cert", str(cert), "--tls-key", str(key)], ssl.create_default_context(cafile=str(ca.cert_file))


def start_gateway(zk, zk_root: str, log: Path, users_file: Path, tls: list[str], *limits: str) -> GatewayProcess:  # type: ignore[no-untyped-def]
    return GatewayProcess(zk.connect_string, zk_root, log, None, *tls, "--http-users", str(users_file), *limits).start()


@pytest.fixture
def unlimited_gateway(zk, zk_root, tmp_path, https) -> Iterator[GatewayProcess]:  # type: ignore[no-untyped-def]
    """A gateway whose login limit never triggers here: these checks are about the work per check."""
    users_file, tls, _ = https
    gateway = start_gateway(zk, zk_root, tmp_path / "gateway.log", users_file, tls, "--login-failure-burst", "1000000")
    try:
        yield gateway
    finally:
        gateway.stop()


def test_unknown_users_cost_a_check_and_checks_leave_the_loop_free(unlimited_gateway, https) -> None:  # type: ignore[no-untyped-def]
    context = https[2]
    client = Client(unlimited_gateway, context)
    try:
        # Interleaved, so load on the machine hits both series alike.
        known, unknown = [], []
        for i in range(15):
            status, seconds, _ = client.get("victim", f"wrong-{i}")
            assert status == 401
            known.append(seconds)
            status, seconds, _ = client.get(f"nobody-{i}", f"wrong-{i}")
            assert status == 401
            unknown.append(seconds)
        ratio = statistics.median(unknown) / statistics.median(known)
        assert 0.6 < ratio < 1.67, f"unknown user {statistics.median(unknown) * 1000:.1f} ms vs known {statistics.median(known) * 1000:.1f} ms"

        assert client.get("app", PASSWORDS["app"])[0] == 200  # verified once: later requests cost no check
        quiet = [client.get("app", PASSWORDS["app"])[1] for _ in range(30)]

        stop = threading.Event()
        attempts = [0] * 4

        def attack(index: int) -> None:
            attacker = Client(unlimited_gateway, context)
            try:
                while not stop.is_set():
                    assert attacker.get("victim", f"guess-{attempts[index]}")[0] == 401
                    attempts[index] += 1
            finally:
                attacker.close()

        attackers = [threading.Thread(target=attack, args=(i,), daemon=True) for i in range(4)]
        for thread in attackers:
            thread.start()
        try:
            time.sleep(0.3)  # every attacker has a check queued or running
            attacked = [client.get("app", PASSWORDS["app"])[1] for _ in range(30)]
            during = sum(attempts)
        finally:
            stop.set()
            for thread in attackers:
                thread.join(timeout=60)
        # The attack did run (on the old code each of these held the event loop ~ a check long).
        assert during >= 8, attempts
        quiet_ms, attacked_ms = statistics.median(quiet) * 1000, statistics.median(attacked) * 1000
        assert attacked_ms < 3 * quiet_ms + 10, f"logged-in user's median {quiet_ms:.1f} ms quiet, {attacked_ms:.1f} ms under attack ({during} guesses)"
    finally:
        client.close()


def test_failed_logins_are_rate_limited_per_address_and_per_user(zk, zk_root, tmp_path, https) -> None:  # type: ignore[no-untyped-def]
    users_file, tls, context = https
    gateway = start_gateway(zk, zk_root, tmp_path / "gateway.log", users_file, tls)  # the defaults: 10 in a burst, then 1/s
    local, other = Client(gateway, context), Client(gateway, context, source="127.0.0.2")
    try:
        assert local.get("app", PASSWORDS["app"])[0] == 200  # logged in before the attack
        statuses = []
        for i in range(14):
            status, _, response = local.get("victim", f"guess-{i}")
            statuses.append(status)
            if status == 429:
                break
        assert statuses[:10] == [401] * 10 and statuses[-1] == 429, statuses
        assert int(response.getheader("Retry-After")) >= 1
        # Refused before any check: the right password does not get through either, for now.
        assert local.get("reader", PASSWORDS["reader"])[0] == 429  # this address is spent
        assert other.get("victim", PASSWORDS["victim"])[0] == 429  # and so is this user, from anywhere
        assert other.get("reader", PASSWORDS["reader"])[0] == 200  # another user from another address
        assert local.get("app", PASSWORDS["app"])[0] == 200  # a user logged in before is never locked out
        # The bucket fills again: a second later one more check is allowed.
        time.sleep(1.1)
        assert local.get("victim", PASSWORDS["victim"])[0] == 200
    finally:
        local.close()
        other.close()
        gateway.stop()
