"""The operator's commands against one shared cluster (real ZooKeeper, real broker processes).

Group 0: a plain sync pair, A (master) and B (``--slave``, slaveId 1), topic ``fo`` from server.ini.
Group 1: a secured master alone (SCRAM users from tests/integration/trust_support.py).
Group 2: a throwaway sync pair, started and stopped by the removal test.

Item 9: ``metaq cluster`` shows secured and plain groups in one call, exits 1 with no brokers.
Item 8: ``metaq cluster remove-group|remove-slave`` forget dead members, never live ones.
Item 5: ``metaq topics`` refuses an unknown group, unsets overrides, and a ``[system]`` edit
applies to every topic that does not override the key.
Item 12: ``metaq drill`` checks its permissions before any fault.
Item 13: SIGHUP reloads the security file's users and always logs its line.
Parity with kafka-consumer-groups / kafka-topics: shift, duration, export and import of
offsets, deleting a group, one message by offset or msg id, describe's partition filters.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from metaq.client.connection import BrokerConnection, ConnectionClosed
from metaq.ha.election import Handover, write_handover
from metaq.record import encode_batch, iter_records
from metaq.security.credentials import SecurityFile
from metaq.security.handshake import ClientAuthenticator
from metaq.tools.launcher import BrokerFactory, BrokerProcess
from metaq.zk.paths import ZkPaths
from tests.harness import kazoo_client

from .failover_support import ZK_SETTINGS, Group, make_pair, sync_system, wait_follows, wait_in_sync_set
from .replication_support import put, request, wait_caught_up, wait_for
from .test_topics_cli import metaq as cli
from .trust_support import PASSWORDS, SecuredGroup
from .trust_support import metaq as metaq_process


class Cluster:
    def __init__(self, zk: Any, root: str, factory: BrokerFactory, directory: Path) -> None:
        self.zk, self.root, self.factory, self.directory = zk, root, factory, directory
        self.paths = ZkPaths(root)
        self.secured = SecuredGroup(directory / "security", broker_id=1)
        self.ops_password = directory / "ops.password"
        self.ops_password.write_text(PASSWORDS["ops"] + "\n")
        self.a: BrokerProcess
        self.b: BrokerProcess
        self.s: BrokerProcess

    def login(self, user: str = "ops") -> list[str]:
        return ["--user", user, "--password-file", str(self.ops_password)]


@pytest.fixture(scope="module")
def cluster(zk: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = f"/meta-{uuid.uuid4().hex[:12]}"
    directory = tmp_path_factory.mktemp("operator")
    factory = BrokerFactory(directory, zk.connect_string, root)
    ops = Cluster(zk, root, factory, directory)
    try:
        with kazoo_client(zk.connect_string) as client:
            ops.a, ops.b = make_pair(factory, sync_system(), Group(client, root))
        ops.s = factory(1, {"t": 1}, {"unflushThreshold": 0, **ops.secured.system}, name="S")
        yield ops
    finally:
        factory.stop_all()


def zk_node(cluster: Cluster, path: str) -> bytes | None:
    with kazoo_client(cluster.zk.connect_string) as client:
        found = client.exists(path)
        return client.get(path)[0] if found else None


def served_setting(broker: BrokerProcess, topic: str, key: str) -> str | None:
    """The value of ``key`` the broker serves ``topic`` with (its ``stats config`` topic lines)."""
    text = bytes(request(broker, {"op": "stats", "item": "config"}).body).decode()
    for line in text.splitlines():
        if line.startswith(f"; [topic={topic}] "):
            found = re.search(rf" {key}=(\S+)", line)
            return found.group(1) if found else None
    return None


# --- item 9: metaq cluster ---------------------------------------------------------------------


def test_the_start_line_says_whether_security_and_tls_are_on(cluster):
    assert "listening on 127.0.0.1:%d; security on (SCRAM logins, ACLs, ZooKeeper ACLs), TLS off" % cluster.s.port in cluster.s.log_text()
    assert "listening on 127.0.0.1:%d; security off, TLS off (plaintext)" % cluster.a.port in cluster.a.log_text()


def test_cluster_shows_secured_and_plain_groups_in_one_call(cluster, capsys):
    code, out = cli(capsys, cluster.zk, cluster.root, "cluster", "show")
    assert code == 1, out
    assert "UNKNOWN broker group 1: master needs login" in out and "unreachable" not in out, out
    assert "UNHEALTHY" not in out and out.count(" up ") == 2, out

    # One login: the secured group answers it, the plain group is asked without one.
    code, out = cli(capsys, cluster.zk, cluster.root, "cluster", "show", *cluster.login())
    assert code == 0 and out.count(" up ") == 3, out

    code, out = cli(capsys, cluster.zk, cluster.root, "cluster", "show", "--json", "--group-login", f"1=ops:{cluster.ops_password}")
    report = json.loads(out)
    assert code == 0 and report["healthy"] and report["problems"] == [], out
    assert sorted((m["broker_id"], m["role"], m["state"]) for m in report["members"]) == [
        (0, "master", "up"), (0, "slave1", "up"), (1, "master", "up")]

    wrong = cluster.directory / "wrong.password"
    wrong.write_text("not-the-password\n")
    code, out = cli(capsys, cluster.zk, cluster.root, "cluster", "show", "--group-login", f"1=ops:{wrong}")
    assert code == 1 and "UNKNOWN broker group 1: master login refused" in out and out.count(" up ") == 2, out
    code, out = cli(capsys, cluster.zk, cluster.root, "cluster", "show", "--group-login", "1=ops")
    assert code == 1 and "--group-login expects ID=USER:PASSWORD_FILE" in out, out


def test_cluster_with_no_brokers_registered_is_unhealthy(cluster, capsys):
    code, out = cli(capsys, cluster.zk, f"{cluster.root}-empty", "cluster", "show")
    assert code == 1 and "no brokers registered" in out, out
    code, out = cli(capsys, cluster.zk, cluster.root, "cluster", "show", "--json", "--broker-id", "5")
    assert code == 1 and json.loads(out)["problems"] == [f"UNHEALTHY: no brokers registered under {cluster.root} as broker group 5"]


# --- item 8: removing a dead group or slave ---------------------------------------------------


def test_remove_group_and_slave_only_once_they_are_dead(cluster, capsys):
    zk, root = cluster.zk, cluster.root
    master = cluster.factory(2, {"x": 1}, sync_system(), name="M2", zookeeper=ZK_SETTINGS)
    slave = cluster.factory(2, {"x": 1}, sync_system(), {"slaveId": 0}, name="S2", zookeeper=ZK_SETTINGS)
    with kazoo_client(zk.connect_string) as client:
        group = Group(client, root, broker_id=2)
        wait_follows(slave, master, group)
        wait_in_sync_set(group, 0)

        code, out = cli(capsys, zk, root, "cluster", "remove-group", "--broker-id", "2")
        assert code == 1 and "has live members" in out and "nothing removed" in out, out
        code, out = cli(capsys, zk, root, "cluster", "remove-slave", "--broker-id", "2", "--slave-id", "0")
        assert code == 1 and "slave0 of broker group 2 is alive" in out, out
        # Both die, the master first (it cannot take slave0 out of the sync set), the slave
        # before the master's session expires (it never takes over).
        master.kill()
        slave.kill()
        wait_for(lambda: group.master() is None and not group.slaves(), 15, "the group's sessions to expire")
        assert group.sync_set() == {0}
        # Nobody serves x now, and slave0 of the sync set is gone: describe's filters say so.
        for flag in ("--unavailable-partitions", "--under-replicated-partitions"):
            code, out = cli(capsys, zk, root, "topics", "describe", "--topic", "x", "--broker-id", "2", flag, "--json")
            rows = json.loads(out)[0]["partitions"]
            assert code == 0 and {(r["partition"], r["member"], r["state"]) for r in rows} == {
                (0, "master", "not registered"), (0, "slave0", "not registered")}, out
        code, out = cli(capsys, zk, root, "cluster", "show")
        assert code == 1 and "UNHEALTHY broker group 2: master NO MASTER" in out, out

        # An operator's hand-over to slave0 (metaq promote) that it never took.
        write_handover(client, cluster.paths, 2, Handover(0, group.epoch()))
        code, out = cli(capsys, zk, root, "cluster", "remove-slave", "--broker-id", "2", "--slave-id", "0")
        assert code == 0 and "slave0 removed from the sync set" in out and "hand-over to slave0" in out, out
        assert group.sync_set() == set() and client.exists(cluster.paths.handover(2)) is None
        code, out = cli(capsys, zk, root, "cluster", "remove-slave", "--broker-id", "2", "--slave-id", "0")
        assert code == 1 and "nothing to remove" in out, out
        code, out = cli(capsys, zk, root, "cluster", "remove-group", "--broker-id", "2")
        assert code == 0 and "broker group 2 removed" in out, out
        assert client.exists(cluster.paths.broker(2)) is None
        assert group_topics(cluster, 2) == {}, "a new group 2 must not serve the old one's topics"

    code, out = cli(capsys, zk, root, "cluster", "show", *cluster.login())
    assert code == 0 and "broker group 2" not in out, out
    code, out = cli(capsys, zk, root, "cluster", "remove-group", "--broker-id", "2")
    assert code == 1 and "no broker group 2" in out, out
    code, out = cli(capsys, zk, root, "cluster", "remove-group", "--broker-id", "0")
    assert code == 1 and "has live members" in out and cluster.a.alive, out


# --- item 5: topics ---------------------------------------------------------------------------


def group_topics(cluster: Cluster, broker_id: int = 0) -> dict[str, dict[str, str]]:
    data = zk_node(cluster, cluster.paths.topic_config(broker_id))
    return json.loads(data)["topics"] if data else {}


def test_topics_create_alter_and_a_system_default_edit(cluster, capsys):
    zk, root = cluster.zk, cluster.root
    code, out = cli(capsys, zk, root, "topics", "create", "--broker-id", "7", "--topic", "lost")
    assert code == 1 and "no broker group 7" in out, out
    assert zk_node(cluster, cluster.paths.topic_config(7)) is None

    code, out = cli(capsys, zk, root, "topics", "create", "--broker-id", "0", "--topic", "made", "--set", "unflushThreshold=3")
    assert code == 0, out
    code, out = cli(capsys, zk, root, "topics", "create", "--broker-id", "0", "--topic", "made", "--if-not-exists")
    assert code == 0 and "already has a topic 'made'" in out, out
    code, out = cli(capsys, zk, root, "topics", "alter", "--broker-id", "0", "--topic", "made", "--set", "unflushThreshold=")
    assert code == 0 and "applied by every live member" in out, out
    assert group_topics(cluster)["made"] == {"numPartitions": "1"}
    code, out = cli(capsys, zk, root, "topics", "alter", "--broker-id", "0", "--topic", "made", "--set", "unflushThreshold=")
    assert code == 1 and "nothing to change" in out, out
    code, out = cli(capsys, zk, root, "topics", "delete", "--broker-id", "0", "--topic", "gone", "--if-exists")
    assert code == 0 and "nothing changed" in out, out

    # The seeded topic fo stores only what its section overrides, never a [system] value.
    assert "unflushInterval" not in group_topics(cluster)["fo"], group_topics(cluster)
    # An edit of the master's [system] unflushInterval applies to fo and made alike.
    a = cluster.a
    a.config_path.write_text(a.config_path.read_text().replace("[system]\n", "[system]\nunflushInterval=777\n", 1))
    a._signal(signal.SIGHUP)
    wait_for(lambda: served_setting(a, "fo", "unflushInterval") == "777", 10, "the master to apply the edit")
    assert served_setting(a, "made", "unflushInterval") == "777"
    assert "unflushInterval" not in group_topics(cluster)["fo"], group_topics(cluster)
    # The slave's own [system] default holds for every topic there (no pinned value on some).
    b = cluster.b
    assert served_setting(b, "fo", "unflushInterval") == served_setting(b, "made", "unflushInterval") != "777"

    code, out = cli(capsys, zk, root, "topics", "list", "--broker-id", "0", "--json")
    listed = {t["topic"]: t for t in json.loads(out)}
    assert code == 0 and listed["made"]["partitions"] == 1 and "unflushInterval" not in listed["fo"]["settings"], out


# --- item 12: a drill checks its permissions before any fault ------------------------------------


@pytest.mark.parametrize("user, missing", [("ops", "may not consume topic 't'"), ("app", "(admin)")])
def test_a_drill_without_a_permission_refuses_before_any_fault(cluster, user, missing):
    from metaq.client.connection import Credentials
    from metaq.errors import MetaqError
    from metaq.tools.drill import Drill

    pid = cluster.s.pid
    drill = Drill(cluster.zk.connect_string, 1, "kill", zk_root=cluster.root, topic="t", rate=50,
                  creds=Credentials(user, PASSWORDS[user]))
    with pytest.raises(MetaqError) as refused:
        asyncio.run(drill.run())
    message = str(refused.value)
    assert message.startswith("not starting the drill:") and missing in message and "nothing was injected" in message
    assert "\n" not in message
    assert cluster.s.alive and cluster.s.pid == pid, "the master was faulted"


# --- item 13: SIGHUP -------------------------------------------------------------------------------


async def login(broker: BrokerProcess, user: str, password: str) -> BrokerConnection:
    return await BrokerConnection.open(*broker.address, authenticator=ClientAuthenticator(user, password))


def test_sighup_reloads_the_users_and_always_logs_its_line(cluster):
    s = cluster.s
    s.config_path.write_text(s.config_path.read_text().replace("[system]\n", "[system]\nlogLevel=WARNING\n", 1))
    s._signal(signal.SIGHUP)
    wait_for(lambda: "reload: applied logLevel" in s.log_text(), 10, "the reload line at logLevel=WARNING")

    async def scenario() -> None:
        rival = await login(s, "rival", PASSWORDS["rival"])
        reader = await login(s, "reader", PASSWORDS["reader"])
        users = SecurityFile.load(cluster.secured.users_file)
        users.add_user("newbie", "newbie-password", consume="t", iterations=4096)
        users.set_password("reader", "reader-password-2", iterations=4096)
        users.remove_user("rival")
        users.save()
        s._signal(signal.SIGHUP)
        await asyncio.to_thread(wait_for, lambda: "security.ini users" in s.log_text(), 10, "the users' reload line")
        line = next(line for line in s.log_text().splitlines() if "security.ini users" in line)
        assert "added newbie" in line and "removed rival" in line and "new password for reader" in line, line
        assert "closed 2 connection(s)" in line, line
        for conn in (rival, reader):  # their proof is no longer valid
            with pytest.raises(ConnectionClosed):
                await conn.request({"op": "offset", "topic": "t", "partition": 0, "offset": 0}, timeout=5)
        with pytest.raises(ConnectionClosed):
            await login(s, "rival", PASSWORDS["rival"])
        with pytest.raises(ConnectionClosed):
            await login(s, "reader", PASSWORDS["reader"])
        for user, password in (("newbie", "newbie-password"), ("reader", "reader-password-2")):
            conn = await login(s, user, password)
            try:
                reply = await conn.request({"op": "offset", "topic": "t", "partition": 0, "offset": 0}, timeout=5)
                assert reply.ok, (user, reply.header)
            finally:
                conn.close()

    asyncio.run(scenario())
    assert s.alive


def test_a_reload_with_a_delete_when_retention_cannot_run_is_refused_whole(cluster):
    """An hour 25 has six fields: it used to pass the file's check, be applied with the rest of
    the reload, and fail in the retention scheduler (an unretrieved task exception)."""
    s = cluster.s
    original = s.config_path.read_text()
    s.config_path.write_text(original.replace("[system]\n", "[system]\nunflushInterval=4321\ndeleteWhen=0 0 25 * * ?\n", 1))
    try:
        s._signal(signal.SIGHUP)
        wait_for(lambda: "reload refused, still running the old configuration" in s.log_text(), 10, "the refusal line")
    finally:
        s.config_path.write_text(original)
    line = next(line for line in s.log_text().splitlines() if "reload refused" in line)
    assert "deleteWhen" in line and "bad hour value '25'" in line, line
    assert "Task exception was never retrieved" not in s.log_text()
    assert served_setting(s, "t", "unflushInterval") != "4321", "part of a refused reload was applied"
    assert s.alive


# --- parity with kafka-consumer-groups / kafka-topics ----------------------------------------------


def test_offsets_reset_export_import_delete_and_one_message(cluster, capsys, tmp_path):
    zk, root, a = cluster.zk, cluster.root, cluster.a
    put(a, "fo", 0, 10, size=64, batch=10)
    records = disk_records(a)  # group commit: acked means on disk
    assert len(records) == 10
    wait_caught_up(a, cluster.b, [("fo", 0)])
    reset = ("groups", "reset-offsets", "--group", "g", "--topic", "fo")

    def offset_now() -> int:
        data = zk_node(cluster, cluster.paths.offset("g", "fo", "0-0"))
        assert data is not None
        return int(data.decode().rsplit("-", 1)[1])

    code, out = cli(capsys, zk, root, *reset, "--to-earliest", "--execute")
    assert code == 0 and offset_now() == records[0].offset, out
    code, out = cli(capsys, zk, root, *reset, "--shift-by", "3", "--execute")
    assert code == 0 and offset_now() == records[3].offset, out
    code, out = cli(capsys, zk, root, *reset, "--shift-by", "-2", "--execute")
    assert code == 0 and offset_now() == records[1].offset, out
    code, out = cli(capsys, zk, root, *reset, "--shift-by", "-50", "--execute")
    assert code == 0 and offset_now() == records[0].offset, out
    code, out = cli(capsys, zk, root, *reset, "--shift-by", "4", "--execute")
    assert code == 0 and offset_now() == records[4].offset, out

    # --export of --to-current is a backup --from-file restores.
    code, out = cli(capsys, zk, root, "groups", "reset-offsets", "--group", "g", "--all-topics", "--to-current", "--export")
    assert code == 0 and out.splitlines()[0] == f"fo,0-0,{records[4].offset}", out
    backup = tmp_path / "g.csv"
    backup.write_text(out)
    code, out = cli(capsys, zk, root, *reset, "--to-latest", "--execute")
    assert code == 0 and offset_now() == records[-1].offset + records[-1].size, out
    code, out = cli(capsys, zk, root, "groups", "reset-offsets", "--group", "g", "--from-file", str(backup), "--execute")
    assert code == 0 and offset_now() == records[4].offset, out
    backup.write_text(f"fo,0-0,{records[4].offset + 1}\n")
    code, out = cli(capsys, zk, root, "groups", "reset-offsets", "--group", "g", "--from-file", str(backup), "--execute")
    assert code == 1 and "does not start a message" in out and offset_now() == records[4].offset, out
    code, out = cli(capsys, zk, root, *reset, "--by-duration", "1h")
    planned = next(line for line in out.splitlines() if line.startswith("fo ")).split()
    assert code == 0 and planned[2:] == [str(records[4].offset), str(records[0].offset)], out
    code, out = cli(capsys, zk, root, *reset, "--by-duration", "soon")
    assert code == 1 and "--by-duration: expected" in out, out

    # One message, by offset and by msg id.
    code, out = cli(capsys, zk, root, "topics", "get", "--topic", "fo", "--partition", "0-0", "--offset", str(records[5].offset), "--json")
    shown = json.loads(out)
    assert code == 0 and (shown["msg_id"], shown["data"]) == (records[5].msg_id, records[5].data.decode()), out
    code, out = cli(capsys, zk, root, "topics", "get", "--topic", "fo", "--partition", "0-0", "--msg-id", str(records[7].msg_id))
    assert code == 0 and f"offset {records[7].offset} msg id {records[7].msg_id}" in out and records[7].data.decode() in out, out
    code, out = cli(capsys, zk, root, "topics", "get", "--topic", "fo", "--partition", "0-0", "--offset", str(records[5].offset + 3))
    assert code == 1 and "does not start a message" in out, out

    # A healthy pair: nothing under-replicated, nothing unavailable.
    for flag in ("--under-replicated-partitions", "--unavailable-partitions"):
        code, out = cli(capsys, zk, root, "topics", "describe", "--topic", "fo", "--broker-id", "0", flag, "--json")
        assert code == 0 and json.loads(out)[0]["partitions"] == [], out

    # Deleting: refused while a member is live, then one topic's offsets, then the group.
    with kazoo_client(zk.connect_string) as client:
        client.create(cluster.paths.consumer_id("g", "c1"), b"fo", ephemeral=True, makepath=True)
        code, out = cli(capsys, zk, root, "groups", "delete", "--group", "g")
        assert code == 1 and "live member" in out and zk_node(cluster, cluster.paths.offset("g", "fo", "0-0")), out
    code, out = cli(capsys, zk, root, "groups", "delete", "--group", "g", "--topic", "fo")
    assert code == 0 and zk_node(cluster, cluster.paths.offsets("g", "fo")) is None, out
    code, out = cli(capsys, zk, root, "groups", "delete", "--group", "g")
    assert code == 0 and zk_node(cluster, cluster.paths.consumer_group("g")) is None, out
    code, out = cli(capsys, zk, root, "groups", "list", "--json")
    assert code == 0 and json.loads(out) == [], out

    # A message that is not UTF-8 comes back exactly (docs/operations.md: "then the message's
    # data"): base64 in JSON, its bytes on stdout, never a lossy decode.
    binary = bytes(range(256))
    stored = request(a, {"op": "put", "topic": "fo", "partition": 0}, encode_batch([(binary, None)]))
    assert stored.ok, stored.header
    get = ("topics", "get", "--topic", "fo", "--partition", "0-0", "--offset", str(stored["offset"]))
    code, out = cli(capsys, zk, root, *get, "--json")
    shown = json.loads(out)
    assert code == 0 and "data" not in shown and base64.b64decode(shown["data_base64"]) == binary, out
    printed = metaq_process(*get[:2], "--zk", zk.connect_string, "--zk-root", root, *get[2:])
    assert printed.returncode == 0 and printed.stdout.split(b"\n", 1)[1] == binary + b"\n", printed.stderr


def disk_records(broker: BrokerProcess) -> list[Any]:
    start, data = broker.disk_log("fo", 0)
    return list(iter_records(data, start))


def test_removing_a_secured_group_needs_its_secret(cluster, capsys):
    """Last in the module: it stops the secured master."""
    zk, root = cluster.zk, cluster.root
    cluster.s.stop()
    remove = ("cluster", "remove-group", "--broker-id", "1")
    code, out = cli(capsys, zk, root, *remove)
    assert code == 1 and "--group-secret" in out and zk_node(cluster, cluster.paths.epoch(1)) is not None, out
    code, out = cli(capsys, zk, root, *remove, "--group-secret", str(cluster.secured.secret_file))
    assert code == 0 and "broker group 1 removed" in out, out
    assert zk_node(cluster, cluster.paths.broker(1)) is None and group_topics(cluster, 1) == {}
