"""The Spark source against a secured group: logins (SCRAM), ACLs, TLS and ZooKeeper ACLs on.

A sync master and slave with a group secret, a users file and certificates from a test CA
(tests/integration/trust_support.py, tests/security_support.py). The source logs in with
options ``user``/``passwordFile``/``tlsCa`` on the driver (planning) and in every task;
without a login, or with a wrong password, the query fails at once with one line naming
the options, not after ``timeoutMs`` of failovers.
"""

from __future__ import annotations

import time

import pytest
from kazoo.security import Permissions

from metaq.client.connection import Credentials
from metaq.spark.fetch import AccessRefused
from metaq.spark.reader import MetaQInputPartition, RangeReader
from metaq.spark.login import SparkLogin
from metaq.zk.paths import ZkPaths
from tests.integration.trust_support import PASSWORDS, start_tls_pair
from tests.spark.support import digest, partition_ends, produce, replica, wait_caught_up

pytestmark = pytest.mark.spark
TOPIC = "t"  # the one topic user "reader" may consume


@pytest.fixture
def secured(broker_factory, zk_client, zk_root, tmp_path):  # type: ignore[no-untyped-def]
    """(master, slave, login options of the consume-only user "reader", the app user's Credentials)."""
    _group, ca, master, slave = start_tls_pair(broker_factory, zk_client, zk_root, tmp_path, {TOPIC: 2})
    password_file = tmp_path / "reader.password"
    password_file.write_text(PASSWORDS["reader"] + "\n")
    login = {"user": "reader", "passwordFile": str(password_file), "tlsCa": str(ca.cert_file)}
    app = Credentials("app", PASSWORDS["app"], str(ca.cert_file))
    return master, slave, login, app


def _produce_and_wait(master, slave, app, count, tag=""):  # type: ignore[no-untyped-def]
    produced = produce(master, TOPIC, partitions=2, count=count, tag=tag, credentials=app)
    wait_caught_up([master, slave], TOPIC, partition_ends(produced), credentials=app)
    return produced


def _batch(spark, zk, zk_root, **options):  # type: ignore[no-untyped-def]
    reader = spark.read.format("metaq").option("zkConnect", zk.connect_string).option("zkRoot", zk_root).option("topic", TOPIC)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_from_a_slave_as_a_consume_only_user_and_the_sink_as_a_producer(spark, zk, zk_client, zk_root, secured, tmp_path) -> None:  # type: ignore[no-untyped-def]
    master, slave, login, app = secured
    produced = _produce_and_wait(master, slave, app, 800)

    # ZooKeeper ACLs are on (the group's nodes: the group writes, the world only reads), and
    # discovery needs no ZooKeeper login: it only reads.
    acls, _stat = zk_client.get_acls(ZkPaths(zk_root).master(0))
    assert {(acl.id.scheme, acl.perms) for acl in acls} == {("world", Permissions.READ), ("digest", Permissions.ALL)}

    df = _batch(spark, zk, zk_root, **login)
    rows = df.select("partition", "offset", "data", "broker").collect()
    assert sorted((r.partition, r.offset, digest(r.data)) for r in rows) == sorted((m.partition, m.offset, m.digest) for m in produced)
    assert {r.broker for r in rows} == {slave.url}

    # The sink logs in the same way: the app user (produce) writes exactly once over TLS.
    app_password = tmp_path / "app.password"
    app_password.write_text(app.password + "\n")
    written = spark.range(0, 300, numPartitions=2).selectExpr("CAST(CONCAT('row-', id) AS BINARY) AS value")
    (written.write.format("metaq").mode("append").option("zkConnect", zk.connect_string).option("zkRoot", zk_root)
     .option("topic", TOPIC).option("user", "app").option("passwordFile", str(app_password))
     .option("tlsCa", login["tlsCa"]).save())
    rows = _batch(spark, zk, zk_root, readFrom="master", **login).select("data").collect()
    new = sorted(bytes(r.data) for r in rows if bytes(r.data).startswith(b"row-"))
    assert new == sorted(f"row-{n}".encode() for n in range(300))


def test_no_login_or_a_wrong_password_fails_at_once_naming_the_options(spark, zk, zk_root, secured, tmp_path) -> None:  # type: ignore[no-untyped-def]
    master, slave, login, app = secured
    produced = _produce_and_wait(master, slave, app, 50)

    with pytest.raises(Exception, match="the cluster has security on: log in with options user and passwordFile"):
        _batch(spark, zk, zk_root, tlsCa=login["tlsCa"]).collect()
    with pytest.raises(Exception, match=r"no replica of partition 0-\d answered \(if its brokers use TLS, set option tlsCa\)"):
        # A TLS broker waits for the rest of what it takes for a TLS hello: timeoutMs bounds that wait.
        _batch(spark, zk, zk_root, user=login["user"], passwordFile=login["passwordFile"], timeoutMs="2000").collect()
    wrong = tmp_path / "wrong.password"
    wrong.write_text("guess\n")
    with pytest.raises(Exception, match=r"refused the login: .*check options user \('reader'\) and passwordFile"):
        _batch(spark, zk, zk_root, **{**login, "passwordFile": str(wrong)}).collect()

    # A task (executor side) whose login is refused fails at once: another replica of the
    # group would refuse it too, so it neither fails over nor waits for timeoutMs.
    end = partition_ends(produced)[0]
    part = MetaQInputPartition(
        TOPIC, "0-0", 0, 0, 0, end, (replica(slave), replica(master)), "prefer-slave", zk.connect_string, zk_root,
        4096, 60_000, login=SparkLogin("reader", str(wrong), login["tlsCa"]),
    )
    started = time.monotonic()
    with pytest.raises(AccessRefused, match="refused the login"):
        list(RangeReader(part).batches())
    assert time.monotonic() - started < 10


def test_stream_available_now_with_a_login(spark, zk, zk_root, secured, tmp_path) -> None:  # type: ignore[no-untyped-def]
    master, slave, login, app = secured
    produced = _produce_and_wait(master, slave, app, 600)
    stream = spark.readStream.format("metaq").option("zkConnect", zk.connect_string).option("zkRoot", zk_root)
    stream = stream.option("topic", TOPIC).option("startingOffsets", "earliest")
    for key, value in login.items():
        stream = stream.option(key, value)
    seen: dict[tuple[str, int], str] = {}

    def collect(batch_df, _batch_id):  # type: ignore[no-untyped-def]
        for r in batch_df.select("partition", "offset", "data").collect():
            seen[(r.partition, r.offset)] = digest(r.data)

    query = (
        stream.load().writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert seen == {(m.partition, m.offset): m.digest for m in produced}

