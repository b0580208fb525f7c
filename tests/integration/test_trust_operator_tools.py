"""The operator tools log in like the clients do (``--user --password-file``).

A secured sync master and slave (real processes, real ZooKeeper): ``metaq stats`` and
``metaq cluster`` answer for an admin user and are refused without a login; ``metaq
groups describe`` names the missing login; ``metaq verify`` compares the logs and a ``metaq drill`` (kill -9 under load) loses nothing as
that user; ``metaq promote`` writes the group's ZooKeeper nodes only with its secret.
"""

from __future__ import annotations

import asyncio
import json

from metaq.client.connection import Credentials
from metaq.process import stop_pid
from metaq.record import encode_batch
from metaq.tools.drill import Drill
from metaq.tools.launcher import wait_until
from metaq.zk.paths import ZkPaths

from .failover_support import GROUP, ZK_SETTINGS, sync_system
from .failover_support import TOPIC as FO_TOPIC
from .trust_support import PASSWORDS, SecuredGroup, metaq, request_as, run

TOPIC = "t"


def test_stats_cluster_and_verify_need_a_login_with_security_on(broker_factory, zk, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    group = SecuredGroup(tmp_path / "security")
    sync = {"replicationMode": "sync", "unflushThreshold": 0, "syncSlaveTimeoutMs": 1000}
    master = broker_factory(0, {TOPIC: 1}, {**sync, **group.system})
    broker_factory(0, {TOPIC: 1}, {"unflushThreshold": 0, **group.system}, {"slaveId": 0})
    sync_set = ZkPaths(zk_root).sync_set(0)
    wait_until(
        lambda: zk_client.exists(sync_set) and json.loads(zk_client.get(sync_set)[0])["slaves"] == [0],
        30, message="the slave in the sync set",
    )
    put = {"op": "put", "topic": TOPIC, "partition": 0}
    assert run(request_as(master, "app", put, encode_batch([(b"m", None)]))).code == 200
    password_file = tmp_path / "ops.password"
    password_file.write_text(PASSWORDS["ops"] + "\n")
    admin = ["--user", "ops", "--password-file", str(password_file)]
    address = "%s:%d" % master.address

    done = metaq("stats", address, "config", *admin)
    assert done.returncode == 0 and "zkConnect" in done.stdout.decode(), done.stderr
    refused = metaq("stats", address, "config")
    assert refused.returncode != 0 and "zkConnect" not in refused.stdout.decode()
    assert "403" in refused.stderr.decode() or "not authenticated" in refused.stderr.decode(), refused.stderr

    zk_args = ["--zk", zk.connect_string, "--zk-root", zk_root]
    done = metaq("cluster", *zk_args, *admin)
    table = done.stdout.decode()
    assert done.returncode == 0 and "UNHEALTHY" not in table and table.count(" up ") == 2, table
    refused = metaq("cluster", *zk_args)
    assert refused.returncode == 1 and "UNKNOWN broker group 0: master needs login" in refused.stdout.decode()

    done = metaq("verify", *zk_args, "--broker-id", "0", *admin)
    assert done.returncode == 0, done.stdout + done.stderr
    assert metaq("verify", *zk_args, "--broker-id", "0").returncode != 0

    # metaq groups describe: without a login, one line naming the missing login (it said
    # "unreachable" in the table before); logged in as a consumer, the group's lag.
    zk_client.create(ZkPaths(zk_root).offset("billing", TOPIC, "0-0"), b"-1-0", makepath=True)
    app_password = tmp_path / "app.password"
    app_password.write_text(PASSWORDS["app"] + "\n")
    refused = metaq("groups", "describe", *zk_args, "--group", "billing")
    error = refused.stderr.decode().strip()
    assert refused.returncode == 1 and "unreachable" not in refused.stdout.decode() + error, refused.stdout
    assert len(error.splitlines()) == 1 and "needs a login" in error and "--user" in error, error
    described = metaq("groups", "describe", *zk_args, "--group", "billing", "--user", "app", "--password-file", str(app_password))
    assert described.returncode == 0 and " 0-0 " in described.stdout.decode(), described.stderr
    assert "unreachable" not in described.stdout.decode(), described.stdout


def test_promote_writes_a_secured_groups_nodes_only_with_its_secret(broker_factory, zk, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    group = SecuredGroup(tmp_path / "security")
    sync = {"replicationMode": "sync", "unflushThreshold": 0, "syncSlaveTimeoutMs": 1000}
    broker_factory(0, {TOPIC: 1}, {**sync, **group.system})
    slave = broker_factory(0, {TOPIC: 1}, {"unflushThreshold": 0, **group.system}, {"slaveId": 0})
    sync_set = ZkPaths(zk_root).sync_set(0)
    wait_until(
        lambda: zk_client.exists(sync_set) and json.loads(zk_client.get(sync_set)[0])["slaves"] == [0],
        30, message="the slave in the sync set",
    )
    promote = ["promote", "--zk", zk.connect_string, "--zk-root", zk_root, "--broker-id", "0", "--slave", "0"]

    refused = metaq(*promote)
    assert refused.returncode != 0 and "--group-secret" in refused.stderr.decode(), refused.stderr

    done = metaq(*promote, "--group-secret", str(group.secret_file))
    assert done.returncode == 0 and "leads broker group 0" in done.stdout.decode(), done.stderr
    assert ("%s:%d" % slave.address) in done.stdout.decode()


def test_a_drill_logs_in_and_loses_nothing_with_security_on(broker_factory, zk, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    group = SecuredGroup(tmp_path / "security")
    system = {**sync_system(), **group.system}
    broker_factory(GROUP, {FO_TOPIC: 1}, system, name="master", zookeeper=ZK_SETTINGS)
    broker_factory(GROUP, {FO_TOPIC: 1}, system, {"slaveId": 0}, name="slave", zookeeper=ZK_SETTINGS)
    sync_set = ZkPaths(zk_root).sync_set(GROUP)
    wait_until(
        lambda: zk_client.exists(sync_set) and json.loads(zk_client.get(sync_set)[0])["slaves"] == [0],
        30, message="the slave in the sync set",
    )
    creds = Credentials("operator", PASSWORDS["operator"])
    drill = Drill(zk.connect_string, GROUP, "kill", zk_root=zk_root, topic=FO_TOPIC, rate=100, settle_s=1.0, rejoin_timeout_s=30, creds=creds)
    report = asyncio.run(drill.run())
    try:
        assert report.new_master is not None and report.new_master != report.old_master, report
        assert report.acked_total > 0 and report.lost == 0, report
        assert report.ok, report
    finally:
        if report.restarted_pid:
            stop_pid(report.restarted_pid)
