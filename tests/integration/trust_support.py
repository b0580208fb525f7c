"""Helpers for the trust tests (test_trust_*.py): a secured group's files, and a hostile peer's tools."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metaq.client.connection import BrokerConnection, Reply
from metaq.protocol.replies import StatsReply, fetch_stats
from metaq.record import encode_batch
from metaq.security.credentials import SecurityFile
from metaq.security.group import GroupSecret, write_group_secret
from metaq.security.handshake import ClientAuthenticator
from metaq.tools.launcher import BrokerProcess, wait_until
from metaq.zk.paths import ZkPaths
from tests.harness import REPO_ROOT
from tests.security_support import TestCA

PASSWORDS = {"app": "app-password", "ops": "ops-password", "reader": "reader-password", "operator": "operator-password",
             "rival": "rival-password"}


@dataclass
class SecuredGroup:
    """The security file and group secret of one group, and the server.ini keys that point at them."""

    directory: Path
    broker_id: int = 0

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.secret_file = self.directory / "group.secret"
        self.users_file = self.directory / "security.ini"
        if not self.secret_file.exists():
            write_group_secret(self.secret_file)
        users = SecurityFile({}, str(self.users_file))
        users.add_user("app", PASSWORDS["app"], produce="*", consume="*", iterations=4096)
        users.add_user("ops", PASSWORDS["ops"], admin=True, iterations=4096)
        users.add_user("reader", PASSWORDS["reader"], consume="t", iterations=4096)
        # A second producer, not admin: another application on the same cluster.
        users.add_user("rival", PASSWORDS["rival"], produce="*", consume="*", iterations=4096)
        # What metaq drill needs: load (produce, consume) and the brokers' config (admin).
        users.add_user("operator", PASSWORDS["operator"], produce="*", consume="*", admin=True, iterations=4096)
        users.save()

    @property
    def system(self) -> dict[str, Any]:
        return {"securityEnabled": True, "securityConfig": str(self.users_file), "groupSecretFile": str(self.secret_file)}

    def zk_password(self) -> str:
        return GroupSecret.load(self.secret_file, self.broker_id).zookeeper_password()


async def open_as(broker: BrokerProcess, user: str | None) -> BrokerConnection:
    """A connection to ``broker``, logged in as ``user`` (None: not authenticated)."""
    authenticator = ClientAuthenticator(user, PASSWORDS[user]) if user else None
    return await BrokerConnection.open(*broker.address, authenticator=authenticator)


async def request_as(broker: BrokerProcess, user: str | None, header: dict[str, Any], body: bytes = b"") -> Reply:
    conn = await open_as(broker, user)
    try:
        return await conn.request(header, body, timeout=30)
    finally:
        conn.close()


def stats(broker: BrokerProcess, user: str | None = None) -> StatsReply:
    """The broker's general stats, asked as ``user`` (None: not logged in, for a broker with security off)."""

    async def ask() -> StatsReply:
        conn = await open_as(broker, user)
        try:
            return await fetch_stats(conn)
        finally:
            conn.close()

    return run(ask())


def put_as(broker: BrokerProcess, user: str | None, topic: str = "t") -> Reply:
    """One message put to partition 0 of ``topic`` as ``user`` (None: not authenticated)."""
    return run(request_as(broker, user, {"op": "put", "topic": topic, "partition": 0}, encode_batch([(b"m", None)])))


def rss_mb(pid: int) -> float:
    """A process's resident set size, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def metaq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m metaq ARGS`` from this checkout, output captured."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "metaq", *args], capture_output=True, timeout=timeout, cwd=REPO_ROOT, env=env)


def start_tls_pair(
    broker_factory: Any, zk_client: Any, zk_root: str, directory: Path, topics: dict[str, int],
    master_system: dict[str, Any] | None = None, slave_system: dict[str, Any] | None = None,
) -> tuple[SecuredGroup, TestCA, BrokerProcess, BrokerProcess]:
    """A sync master and slave of group 0, security on and TLS on every link (certificates of
    a test CA), returned once the slave, authenticated over TLS, is in the sync set
    (``master_system`` / ``slave_system``: [system] keys of each, over the defaults)."""
    group = SecuredGroup(directory / "security")
    ca = TestCA.create(directory / "tls")

    def tls(name: str) -> dict[str, str]:
        cert, key = ca.issue(name)
        return {"tlsCertFile": str(cert), "tlsKeyFile": str(key), "tlsCaFile": str(ca.cert_file)}

    sync = {"replicationMode": "sync", "unflushThreshold": 0, "syncSlaveTimeoutMs": 1000}
    master = broker_factory(0, topics, {**sync, **group.system, **tls("master"), **(master_system or {})})
    slave_keys = {"unflushThreshold": 0} if slave_system is None else slave_system
    slave = broker_factory(0, topics, {**slave_keys, **group.system, **tls("slave")}, {"slaveId": 0})
    sync_set = ZkPaths(zk_root).sync_set(0)
    wait_until(
        lambda: zk_client.exists(sync_set) and json.loads(zk_client.get(sync_set)[0])["slaves"] == [0],
        30, message="the slave in the sync set, over TLS",
    )
    return group, ca, master, slave
