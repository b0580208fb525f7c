"""The cost of TLS and authentication on produce and fetch throughput, side by side.

    python bench/security_bench.py [--messages N] [--quick]

Three fresh standalone brokers (``zk.zkEnable=false``), the same workload on each:

    plain       security off, plaintext
    scram       ``securityEnabled=true``: the connection logs in (SCRAM-SHA-256), every
                request is checked against the ACLs
    tls+scram   the same over TLS (a throwaway CA made here; ECDSA P-256 certificates)

Produce: N messages of 100 B in batches of 100 over one pipelined connection (32 puts in
flight), acked after an fsync batch (group commit). Fetch: all of them back with 1 MiB
gets, records delimited. Connect: new connections per second including the handshake
(what a client pays once per connection). Prints each case and its ratio to plain.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metaq.client.connection import BrokerConnection, Credentials  # noqa: E402
from metaq.security.credentials import SecurityFile  # noqa: E402
from metaq.security.group import write_group_secret  # noqa: E402
from metaq.protocol.messages import VersionRequest  # noqa: E402

from bench.broker_bench import BrokerUnderTest, fetch, message_count, produce  # noqa: E402
from tests.security_support import TestCA  # noqa: E402

USER, PASSWORD = "bench", "bench-password"


def security_files(directory: Path) -> tuple[str, str, str]:
    """server.ini lines for the scram case, the extra lines for TLS on top of it, and the CA file."""
    write_group_secret(directory / "group.secret")
    users = SecurityFile({}, str(directory / "security.ini"))
    users.add_user(USER, PASSWORD, produce="*", consume="*")
    users.save()
    scram = f"securityEnabled=true\nsecurityConfig={directory / 'security.ini'}\ngroupSecretFile={directory / 'group.secret'}\n"
    ca = TestCA.create(directory / "tls")
    cert, key = ca.issue("bench")
    tls = f"tlsCertFile={cert}\ntlsKeyFile={key}\ntlsCaFile={ca.cert_file}\n"
    return scram, tls, str(ca.cert_file)


def connector(credentials: Credentials | None):  # type: ignore[no-untyped-def]
    async def connect(port: int) -> BrokerConnection:
        return await (credentials or Credentials()).open("127.0.0.1", port)

    return connect


async def connections_per_second(port: int, connect, count: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for _ in range(count):
        conn = await connect(port)
        reply = await conn.request(VersionRequest().to_header())
        assert reply.code == 200
        conn.close()
    return count / (time.perf_counter() - start)


def main() -> None:
    messages = message_count(__doc__)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="metaq-security-bench-") as tmp:
        scram, tls, ca_file = security_files(Path(tmp))
        cases = {
            "plain": ("", None),
            "scram": (scram, Credentials(USER, PASSWORD)),
            "tls+scram": (scram + tls, Credentials(USER, PASSWORD, ca_file)),
        }
        for name, (extra, credentials) in cases.items():
            connect = connector(credentials)
            with BrokerUnderTest(Path(tmp), 0, extra) as broker:
                put = asyncio.run(produce(broker.port, messages, 100, 100, connect))
                got = asyncio.run(fetch(broker.port, messages + 100, False, connect))
                conns = asyncio.run(connections_per_second(broker.port, connect, 200))
            results[name] = {"produce": put["msgs_per_s"], "p99": put["p99_ms"], "fetch": got["msgs_per_s"], "connect": conns}
    base = results["plain"]
    print(f"{messages} messages of 100 B, batches of 100, group commit; fetch 1 MiB gets; 200 connects")
    print(f"{'case':<11}{'produce msgs/s':>16}{'ratio':>7}{'p99 ms':>8}{'fetch msgs/s':>14}{'ratio':>7}{'connects/s':>12}{'ratio':>7}")
    for name, r in results.items():
        print(
            f"{name:<11}{r['produce']:>16,.0f}{r['produce'] / base['produce']:>7.2f}{r['p99']:>8.2f}"
            f"{r['fetch']:>14,.0f}{r['fetch'] / base['fetch']:>7.2f}{r['connect']:>12,.0f}{r['connect'] / base['connect']:>7.2f}"
        )


if __name__ == "__main__":
    main()
