"""ZooKeeper over TLS: a TLS-only ZooKeeper (no plaintext port), a sync broker pair and a client.

One embedded ZooKeeper serves mutual TLS with a throwaway CA (tests/security_support.py);
the brokers reach it through the ``zk.zkTls*`` keys of their server.ini, the client through
``MetaClientConfig.zk_tls``. Checked: put/consume, a failover (the slave's election goes over
TLS), a client with the wrong CA and a plaintext client refused with one line naming ZooKeeper
TLS, and that nothing listens in clear (``metaq zk`` prints the secure port only).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from metaq.client import AsyncMessageSessionFactory, ConsumerConfig, Message, MetaClientConfig
from metaq.errors import MetaqError
from metaq.tools.launcher import BrokerFactory
from metaq.zk.embedded import EmbeddedZooKeeper
from metaq.zk.tls import ZkServerTls, ZkTls, make_kazoo_client

from ..harness import REPO_ROOT, metaq_zk_command
from ..security_support import TestCA
from .failover_support import GROUP, SESSION_MS, SLAVE_B, TOPIC, Group, fetch_all, sync_system, wait_follows, wait_in_sync_set, wait_leads

ROOT = "/meta-tls"


@dataclass(frozen=True)
class Certs:
    ca_file: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def make_certs(directory: Path, ca_name: str = "metaq test ZooKeeper CA") -> Certs:
    ca = TestCA.create(directory, ca_name)
    server_cert, server_key = ca.issue("zookeeper")
    client_cert, client_key = ca.issue("zk-client", ())
    return Certs(str(ca.cert_file), str(server_cert), str(server_key), str(client_cert), str(client_key))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("zk-certs"))


@pytest.fixture(scope="module")
def tls_zk(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedZooKeeper]:
    server = EmbeddedZooKeeper(data_dir=tmp_path_factory.mktemp("zk-tls"), tick_ms=200,
                               tls=ZkServerTls(certs.server_cert, certs.server_key, certs.ca_file))
    server.start()
    yield server
    server.stop()


def client_tls(certs: Certs) -> ZkTls:
    return ZkTls(certs.ca_file, certs.client_cert, certs.client_key)


@pytest.fixture(scope="module")
def pair(certs: Certs, tls_zk: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    settings = {"zk.zkSessionTimeoutMs": SESSION_MS, "zk.zkTlsCaFile": certs.ca_file,
                "zk.zkTlsCertFile": certs.client_cert, "zk.zkTlsKeyFile": certs.client_key}
    factory = BrokerFactory(tmp_path_factory.mktemp("brokers"), tls_zk.connect_string, ROOT)
    zk = make_kazoo_client(tls_zk.connect_string, tls=client_tls(certs), timeout=10)
    zk.start(timeout=20)
    try:
        group = Group(zk, ROOT)
        a = factory(GROUP, {TOPIC: 1}, sync_system(), name="A", zookeeper=settings)
        b = factory(GROUP, {TOPIC: 1}, sync_system(), {"slaveId": SLAVE_B}, name="B", zookeeper=settings)
        wait_follows(b, a, group)
        wait_in_sync_set(group, SLAVE_B)
        yield a, b, group
    finally:
        factory.stop_all()
        zk.stop()
        zk.close()


def client_config(tls_zk: EmbeddedZooKeeper, tls: ZkTls | None, **overrides: Any) -> MetaClientConfig:
    return MetaClientConfig(zk_connect=tls_zk.connect_string, zk_root=ROOT, zk_tls=tls, zk_session_timeout_ms=4000,
                            request_timeout_s=5, send_timeout_s=20, **overrides)


async def send_and_consume(config: MetaClientConfig, payloads: list[bytes], group: str = "tls-readers") -> list[bytes]:
    """Send ``payloads`` (each must succeed), then consume as ``group`` (registered in ZooKeeper over TLS)
    until they have all arrived; returns everything the consumer got, in order."""
    async with AsyncMessageSessionFactory(config) as factory:
        producer = factory.create_producer()
        await producer.publish(TOPIC)
        for payload in payloads:
            result = await producer.send_message(Message(TOPIC, payload))
            assert result.success, result.error_message
        consumer = factory.create_consumer(ConsumerConfig(group=group, offset_store_path=None, iterator_timeout_s=20))
        consumer.subscribe(TOPIC)
        got: list[bytes] = []
        async with consumer:
            async for message in consumer:
                got.append(bytes(message.data))
                if got[-len(payloads):] == payloads:
                    break
        return got


def test_put_consume_and_failover_over_zookeeper_tls(pair, tls_zk, certs):
    a, b, group = pair
    config = client_config(tls_zk, client_tls(certs))
    assert asyncio.run(send_and_consume(config, [b"tls-1", b"tls-2"])) == [b"tls-1", b"tls-2"]

    epoch = group.epoch()
    a.kill()
    # B saw A's session end and won the election: every ZooKeeper call of both went over TLS.
    wait_leads(b, group, epoch)
    # A new group reads from the start: everything is on B, and the send after the failover too.
    assert asyncio.run(send_and_consume(config, [b"tls-3"], group="tls-after")) == [b"tls-1", b"tls-2", b"tls-3"]
    assert sorted(fetch_all(b).values()) == [b"tls-1", b"tls-2", b"tls-3"]


def test_wrong_ca_is_one_line_naming_zookeeper_tls(tls_zk, certs, tmp_path):
    other = make_certs(tmp_path / "other", ca_name="some other CA")
    config = client_config(tls_zk, ZkTls(other.ca_file, certs.client_cert, certs.client_key), zk_connection_timeout_ms=1500)
    with pytest.raises(MetaqError) as caught:
        asyncio.run(send_and_consume(config, [b"never"]))
    message = str(caught.value)
    assert "\n" not in message
    assert "ZooKeeper TLS handshake failed" in message and "not trusted" in message and other.ca_file in message


def test_missing_client_certificate_is_named(tls_zk, certs):
    config = client_config(tls_zk, ZkTls(certs.ca_file), zk_connection_timeout_ms=1500)
    with pytest.raises(MetaqError, match=r"ZooKeeper TLS handshake failed: .* refused our client certificate"):
        asyncio.run(send_and_consume(config, [b"never"]))


def test_plaintext_client_to_the_secure_port_is_refused_clearly(tls_zk, monkeypatch):
    monkeypatch.delenv("METAQ_ZK_TLS_CA", raising=False)
    config = client_config(tls_zk, None, zk_connection_timeout_ms=1500)
    with pytest.raises(MetaqError) as caught:
        asyncio.run(send_and_consume(config, [b"never"]))
    assert "speaks ZooKeeper TLS only" in str(caught.value) and "\n" not in str(caught.value)


def test_no_plaintext_listener_and_no_plaintext_four_letter_words(tls_zk):
    # The only port is the TLS one: a plaintext ZooKeeper answers "srvr\r\n" at once; the TLS
    # port reads it as a bad TLS record and closes without a word.
    with socket.create_connection((tls_zk.host, tls_zk.port), timeout=10) as sock:
        sock.sendall(b"srvr\r\n")
        try:
            reply = sock.recv(100)
        except ConnectionResetError:
            reply = b""
    assert reply == b"", reply
    config = Path(tls_zk.data_dir, "zoo.cfg").read_text()
    assert "clientPort=" not in config.replace("secureClientPort=", "")
    assert tls_zk.mode() == "standalone"  # while our probe, over TLS, gets its answer


def test_metaq_zk_serves_tls_only_and_tools_reach_it_through_the_environment(certs, tmp_path):
    bad = subprocess.run([sys.executable, "-m", "metaq", "zk", "--port", "0", "--ephemeral", "--tls-cert", certs.server_cert],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == "metaq zk: --tls-cert and --tls-key go together", bad.stderr

    # docs/operations.md: a bad file is one line before any JVM starts; with --tls-client-ca,
    # the server's own certificate must be signed by that CA.
    other = make_certs(tmp_path / "other", "another CA")
    not_pem = tmp_path / "not-a-ca.pem"
    not_pem.write_text("not a certificate\n")
    for client_ca, says in ((str(not_pem), "cannot use client CA"), (other.ca_file, f"client CA {other.ca_file} did not sign")):
        bad = subprocess.run([sys.executable, "-m", "metaq", "zk", "--port", "0", "--ephemeral", "--tls-cert", certs.server_cert,
                              "--tls-key", certs.server_key, "--tls-client-ca", client_ca],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and says in bad.stderr, bad.stderr

    # Relative paths, as docs/security.md writes them, name files from the operator's directory
    # (the JVM runs in the data directory).
    relative = {name: os.path.relpath(path, REPO_ROOT) for name, path in
                (("cert", certs.server_cert), ("key", certs.server_key), ("ca", certs.ca_file))}
    with metaq_zk_command("--port", "0", "--ephemeral", "--tick-ms", "200", "--tls-cert", relative["cert"],
                          "--tls-key", relative["key"], "--tls-client-ca", relative["ca"]) as process:
        line = process.stdout.readline()
        assert "serving TLS only on 127.0.0.1:" in line, line + process.stderr.read()
        address = line.split("on ", 1)[1].split()[0]

        def cluster_tool(timeout: int, **env: str) -> subprocess.CompletedProcess[str]:
            clean = {k: v for k, v in os.environ.items() if not k.startswith("METAQ_ZK_TLS_")}
            return subprocess.run([sys.executable, "-m", "metaq", "cluster", "--zk", address, "--timeout", str(timeout)],
                                  cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env={**clean, **env})

        # Over TLS the tool gets its answer: an empty cluster.
        reached = cluster_tool(20, **client_tls(certs).to_env())
        assert "no brokers registered" in reached.stdout + reached.stderr, reached.stdout + reached.stderr
        plaintext = cluster_tool(2)  # it can only time out: the cause is found after
        assert plaintext.returncode != 0
        assert "speaks ZooKeeper TLS only" in plaintext.stderr and plaintext.stderr.count("\n") == 1, plaintext.stderr


def test_spark_options_reach_a_tls_only_zookeeper(pair, tls_zk, certs, monkeypatch):
    # The Spark source plans (on the driver) and the sink writes (on executors) through
    # ZooKeeper: the zkTls* options carry the same settings as the brokers' zk.zkTls* keys.
    from metaq.spark.options import SourceOptions
    from metaq.spark.planning import discover
    from metaq.spark.sink import client_config as sink_client_config
    from metaq.spark.sink_options import SinkOptions

    monkeypatch.delenv("METAQ_ZK_TLS_CA", raising=False)
    tls_options = {"zkConnect": tls_zk.connect_string, "zkRoot": ROOT, "topic": TOPIC, "zkTlsCaFile": certs.ca_file,
                   "zkTlsCertFile": certs.client_cert, "zkTlsKeyFile": certs.client_key}
    partitions = discover(SourceOptions.parse({**tls_options, "readFrom": "master", "timeoutMs": "5000"}))
    assert [p.partition for p in partitions] == [0]
    assert sink_client_config(SinkOptions.parse(tls_options)).zk_tls == client_tls(certs)
    # Spark lower-cases option keys; without the options the plaintext attempt is named.
    lowered = {k.lower(): v for k, v in tls_options.items() if not k.startswith("zkTls")}
    with pytest.raises(Exception, match="ZooKeeper TLS"):
        discover(SourceOptions.parse({**lowered, "timeoutMs": "1500"}))
