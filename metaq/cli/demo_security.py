"""``metaq demo`` with security on: the files a secured group needs, and what it refuses.

The demo's pair runs with ``securityEnabled=true`` (the one documented setting), so every
client and tool logs in (SCRAM), ACLs decide per topic, the slave authenticates to its
master with the group secret, and the group's ZooKeeper nodes carry digest ACLs. This
module writes the group secret, a security file with two users and their password files
into the demo's work directory, and then tries what an outsider would, expecting each
attempt to be refused.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..client.connection import Credentials
from ..errors import MetaqError

#: The producer/consumer user, limited to the demo's topic.
APP_USER = "app"
#: The operator: the demo's topic plus the admin permission (verify, drill, stats config).
OPS_USER = "ops"


@dataclass(frozen=True)
class DemoSecurity:
    directory: Path
    app: Credentials
    ops: Credentials

    @classmethod
    def create(cls, directory: Path, topic: str) -> "DemoSecurity":
        """Write the group secret, the users and their password files (mode 0600) into ``directory``."""
        from ..security.credentials import SecurityFile
        from ..security.files import write_private
        from ..security.group import write_group_secret

        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_group_secret(directory / "group.secret")
        users = SecurityFile({}, str(directory / "security.ini"))
        passwords = {APP_USER: secrets.token_urlsafe(16), OPS_USER: secrets.token_urlsafe(16)}
        users.add_user(APP_USER, passwords[APP_USER], produce=topic, consume=topic)
        users.add_user(OPS_USER, passwords[OPS_USER], produce=topic, consume=topic, admin=True)
        users.save()
        for name, password in passwords.items():
            write_private(directory / f"{name}.password", (password + "\n").encode())
        return cls(directory, Credentials(APP_USER, passwords[APP_USER]), Credentials(OPS_USER, passwords[OPS_USER]))

    @property
    def system(self) -> dict[str, Any]:
        """The ``[system]`` keys of every broker of the pair."""
        return {
            "securityEnabled": True,
            "securityConfig": str(self.directory / "security.ini"),
            "groupSecretFile": str(self.directory / "group.secret"),
        }

    def login_hint(self) -> str:
        return f"--user {OPS_USER} --password-file {self.directory / f'{OPS_USER}.password'}"


@dataclass(frozen=True)
class Refusal:
    """One attempt an outsider would make, and what the group answered."""

    attempt: str
    refused: bool
    answer: str


async def try_as_outsider(security: DemoSecurity, master_url: str, zk_connect: str, zk_root: str, topic: str) -> list[Refusal]:
    """An anonymous put, a user's ``stats config`` and forged replication position, and a
    ZooKeeper write to the group's epoch without its credentials: each must be refused."""
    from ..protocol.messages import PositionRequest, PutRequest, StatsRequest, replica_field
    from ..record import encode_batch

    anonymous = Credentials()
    put = PutRequest(topic=topic, partition=0).to_header()
    position = PositionRequest(topic=topic, partition=0, replica=replica_field(0, 999, 10**9)).to_header()
    attempts = [
        ("anonymous put", anonymous, put, encode_batch([(b"anonymous", None)])),
        (f"stats config by {APP_USER} (not an admin)", security.app, StatsRequest(item="config").to_header(), b""),
        (f"forged position by {APP_USER}", security.app, position, b""),
    ]
    results = [await _broker_attempt(master_url, *attempt) for attempt in attempts]
    results.append(await asyncio.to_thread(_zookeeper_attempt, zk_connect, zk_root))
    return results


async def _broker_attempt(url: str, attempt: str, creds: Credentials, header: dict[str, Any], body: bytes) -> Refusal:
    from ..addresses import parse_broker_url

    conn = await creds.open(*parse_broker_url(url))
    try:
        reply = await conn.request(header, body, timeout=10)
    finally:
        conn.close()
    return Refusal(attempt, reply.code == 403, f"{reply.code} {reply.message}".strip())


def _zookeeper_attempt(zk_connect: str, zk_root: str) -> Refusal:
    from kazoo.exceptions import NoAuthError

    from ..zk.paths import ZkPaths
    from ..zk.session import zk_session

    attempt = "ZooKeeper epoch write, no group secret"
    with zk_session(zk_connect) as client:
        try:
            client.set(ZkPaths(zk_root).epoch(0), b"999")
        except NoAuthError:
            return Refusal(attempt, True, "NoAuth (the node's ACL admits only the group)")
    return Refusal(attempt, False, "written")


def check_refused(results: list[Refusal]) -> None:
    """MetaqError naming every attempt the group let through."""
    accepted = [r for r in results if not r.refused]
    if accepted:
        raise MetaqError("security is on but the group accepted: " + "; ".join(f"{r.attempt} ({r.answer})" for r in accepted))
