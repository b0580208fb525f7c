"""The CLI as a user meets it at its edges, against one shared cluster (real ZooKeeper, real
broker processes): every ``--json`` output keeps its numbers numbers, a topic no broker
group has is an error naming it, a file is never written into a directory that a typo made
up, and a drill reports where a master with ``serverPort=0`` came back.

Group 0: a sync pair, A (master) and B (``--slave``, slaveId 1), topic ``fo`` with 10
messages, and consumer group ``g`` with stored offsets.
Group 1 (the drill's own): a master with ``serverPort=0`` and its slave 0, topic ``dr``.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Iterator

import pytest

from metaq.addresses import parse_broker_url
from metaq.process import stop_pid
from metaq.tools.launcher import BrokerFactory, BrokerProcess, wait_until
from tests.harness import kazoo_client

from .failover_support import TOPIC, ZK_SETTINGS, Group, make_pair, sync_system, wait_follows, wait_in_sync_set
from .replication_support import put, wait_caught_up
from .test_topics_cli import run_cli as metaq


class Cluster:
    def __init__(self, zk: Any, root: str, factory: BrokerFactory) -> None:
        self.zk, self.root, self.factory = zk, root, factory
        self.a: BrokerProcess
        self.b: BrokerProcess

    def metaq(self, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
        """``metaq ARGV --zk … --zk-root …`` in this process: (exit code, stdout + stderr)."""
        return metaq(capsys, *argv, "--zk", self.zk.connect_string, "--zk-root", self.root)


@pytest.fixture(scope="module")
def cluster(zk: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = f"/meta-{uuid.uuid4().hex[:12]}"
    factory = BrokerFactory(tmp_path_factory.mktemp("cli-edges"), zk.connect_string, root)
    edges = Cluster(zk, root, factory)
    try:
        with kazoo_client(zk.connect_string) as client:
            edges.a, edges.b = make_pair(factory, sync_system(), Group(client, root))
        put(edges.a, TOPIC, 0, 10, size=64, batch=5)
        wait_caught_up(edges.a, edges.b, [(TOPIC, 0)])
        yield edges
    finally:
        factory.stop_all()


# --- --json: numbers are numbers ------------------------------------------------------------

NUMBER = re.compile(r"[+-]?\d+(\.\d+)?")
#: Free text (a message's data and attribute) and verbatim server.ini settings: strings by nature.
TEXT_KEYS = {"data", "attribute", "settings"}


def numeric_strings(value: Any, where: str = "") -> list[str]:
    """Where a JSON document holds a number as a string (free-text keys aside)."""
    if isinstance(value, dict):
        return [found for key, item in value.items() if key not in TEXT_KEYS for found in numeric_strings(item, f"{where}.{key}")]
    if isinstance(value, list):
        return [found for i, item in enumerate(value) for found in numeric_strings(item, f"{where}[{i}]")]
    return [f"{where}={value!r}"] if isinstance(value, str) and NUMBER.fullmatch(value) else []


def test_every_json_output_keeps_numbers_numbers(cluster, capsys):
    code, out = cluster.metaq(capsys, "groups", "reset-offsets", "--group", "g", "--topic", TOPIC, "--to-earliest", "--execute")
    assert code == 0, out
    outputs = {}
    for argv in (
        ("cluster", "show"),
        ("topics", "list"),
        ("topics", "describe", "--topic", TOPIC),
        ("topics", "get", "--topic", TOPIC, "--partition", "0-0", "--offset", "0"),
        ("groups", "list"),
        ("groups", "describe", "--group", "g"),
        ("verify", "--broker-id", "0"),
    ):
        code, out = cluster.metaq(capsys, *argv, "--json")
        assert code == 0, (argv, out)
        outputs[" ".join(argv[:2])] = document = json.loads(out)
        assert numeric_strings(document) == [], (argv, out)
    code, out = metaq(capsys, "verify", "--data-dir", str(cluster.b.dir / "data"), "--json")
    assert code == 0 and numeric_strings(json.loads(out)) == [], out

    # The epoch, the field that was a string, is the group's epoch in both places.
    epoch = outputs["topics describe"][0]["epoch"]
    assert isinstance(epoch, int) and epoch >= 1, outputs["topics describe"]
    assert [(m["role"], m["epoch"]) for m in outputs["cluster show"]["members"]] == [("master", epoch), ("slave1", epoch)]
    # The sync set is a list of slave names, membership a boolean (null for the master's row).
    assert outputs["topics describe"][0]["sync_set"] == ["slave1"], outputs["topics describe"]
    assert [(p["member"], p["in_sync_set"]) for p in outputs["topics describe"][0]["partitions"]] == [("master", None), ("slave1", True)]
    assert {m["sync_set"] == ["slave1"] for m in outputs["cluster show"]["members"]} == {True}
    described = outputs["groups describe"]["partitions"]
    assert [(p["committed"], p["log_end"] > 0, p["lag_messages"], p["problem"]) for p in described] == [(0, True, 10, None)], described


# --- a topic no broker group has --------------------------------------------------------------


def test_a_topic_no_group_has_is_an_error_naming_it(cluster, capsys):
    unknown = f"no broker group has a topic 'nosuch' under {cluster.root} (see metaq topics list)"
    # It used to exit 0 after --idle-timeout (consume), or after --send-timeout with a send error (produce).
    for argv, line in (
        (("consume", "--topic", "nosuch", "--group", "g2", "--idle-timeout", "30"),
         unknown.replace(")", "; --wait-for-topic waits for it)")),
        (("produce", "--topic", "nosuch", "--count", "1", "--send-timeout", "30"), unknown),
        (("groups", "describe", "--group", "g", "--topic", "nosuch"), unknown),
    ):
        code, out = cluster.metaq(capsys, *argv)
        assert (code, out.strip().splitlines()[-1]) == (1, f"metaq {argv[0]}: error: {line}"), (argv, out)
    # The other commands that take a topic say so too.
    for argv in (("topics", "get", "--topic", "nosuch", "--partition", "0-0", "--offset", "0"), ("verify", "--broker-id", "0", "--topic", "nosuch")):
        code, out = cluster.metaq(capsys, *argv)
        assert code == 1 and "nosuch" in out.strip().splitlines()[-1], (argv, out)
    code, out = metaq(capsys, "stats", "%s:%d" % cluster.a.address, "nosuch")
    assert code == 1 and "nosuch" in out, out
    code, out = cluster.metaq(capsys, "topics", "describe", "--topic", "nosuch")
    assert (code, out.strip()) == (1, f"metaq topics: error: {unknown}"), out
    code, out = cluster.metaq(capsys, "topics", "describe", "--topic", "nosuch", "--broker-id", "0")
    assert (code, out.strip()) == (1, "metaq topics: error: broker group 0 has no topic 'nosuch' (see metaq topics list)"), out

    # Waiting for a topic to be created is asked for by name.
    code, out = cluster.metaq(capsys, "consume", "--topic", "nosuch", "--group", "g2", "--wait-for-topic", "--idle-timeout", "1")
    assert code == 0 and "warning: no broker serves topic 'nosuch' (yet); waiting for it" in out, out
    # A topic the group has is read and written as before.
    code, out = cluster.metaq(capsys, "consume", "--topic", TOPIC, "--group", "g2", "--max", "10")
    assert code == 0 and len([line for line in out.splitlines() if line.startswith(f"{TOPIC}-0-")]) == 10, out
    code, out = cluster.metaq(capsys, "produce", "--topic", TOPIC, "--count", "1")
    assert code == 0 and "sent 1 of 1 messages" in out, out


# --- files written where the user said ----------------------------------------------------------


def test_a_file_in_a_directory_that_does_not_exist_is_refused_naming_it(tmp_path, capsys):
    password = tmp_path / "password"
    password.write_text("secret-1\n")
    typo = tmp_path / "secuirty"
    missing = f"directory {typo} does not exist (create it first, or fix the path)"
    cases = [
        (("security", "add-user", "-f", str(typo / "users.ini"), "--user", "alice", "--password-file", str(password)),
         f"metaq security: error: -f {typo / 'users.ini'}: {missing}"),
        (("security", "new-group-secret", str(typo / "group.secret")),
         f"metaq security: error: new-group-secret {typo / 'group.secret'}: {missing}"),
        (("security", "passwd", "-f", str(typo / "users.ini"), "--user", "alice", "--password-file", str(password)),
         f"metaq security: error: -f {typo / 'users.ini'}: {missing}"),
        (("security", "list", "-f", str(tmp_path / "users.ini")),
         f"metaq security: error: -f {tmp_path / 'users.ini'}: no such security file (metaq security add-user creates one)"),
        # Checked before ZooKeeper is asked (nothing listens at 127.0.0.1:1).
        (("consume", "--zk", "127.0.0.1:1", "--topic", "t", "--group", "g", "--offset-file", str(typo / "offsets.json")),
         f"metaq consume: error: --offset-file {typo / 'offsets.json'}: {missing}"),
        (("consume", "--zk", "127.0.0.1:1", "--topic", "t", "--group", "g", "--offset-url", f"sqlite:///{typo / 'offsets.db'}"),
         f"metaq consume: error: --offset-url {typo / 'offsets.db'}: {missing}"),
        (("security", "add-user", "-f", str(password / "users.ini"), "--user", "alice", "--password-file", str(password)),
         f"metaq security: error: -f {password / 'users.ini'}: {password} is not a directory"),
    ]
    for argv, line in cases:
        code, out = metaq(capsys, *argv)
        assert (code, out.strip().splitlines()) == (1, [line]), (argv, out)
    # --log-file is opened before the command runs: a usage error.
    code, out = metaq(capsys, "--log-file", str(typo / "metaq.log"), "stats", "127.0.0.1:1")
    assert (code, out.strip().splitlines()) == (2, [f"metaq: error: --log-file {typo / 'metaq.log'}: {missing}"]), out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["password"], "a directory or file was created"

    # Where the directory exists, the file is made there, owner-only.
    code, out = metaq(capsys, "security", "add-user", "-f", str(tmp_path / "users.ini"), "--user", "alice", "--password-file", str(password))
    assert code == 0 and (tmp_path / "users.ini").stat().st_mode & 0o777 == 0o600, out


# --- a drill against a master with serverPort=0 ------------------------------------------------


def start_on_any_port(broker: BrokerProcess, client: Any) -> None:
    """Start ``broker`` with ``serverPort=0`` and learn its port from its registration (the
    harness picks fixed ports: the one it chose is replaced in its server.ini)."""
    config = broker.config_path.read_text()
    broker.config_path.write_text(config.replace(f"serverPort={broker.port}\n", "serverPort=0\n"))
    broker.start(wait=False)
    node = broker.zk_node
    url = wait_until(lambda: client.exists(node) and client.get(node)[0].decode(), 30, message=f"{broker.name} to register")
    broker.port = parse_broker_url(url)[1]
    broker.wait_ready()


def test_a_drill_finds_a_master_that_comes_back_on_another_port(cluster, capsys):
    with kazoo_client(cluster.zk.connect_string) as client:
        group = Group(client, cluster.root, broker_id=1)
        master = cluster.factory(1, {"dr": 1}, sync_system(), name="M1", zookeeper=ZK_SETTINGS, start=False)
        start_on_any_port(master, client)
        slave = cluster.factory(1, {"dr": 1}, sync_system(), {"slaveId": 0}, name="S1", zookeeper=ZK_SETTINGS)
        wait_follows(slave, master, group)
        wait_in_sync_set(group, 0)
        old_port = master.port

        code, out = cluster.metaq(capsys, "drill", "--broker-id", "1", "--topic", "dr", "--rate", "50", "--json")
        restarted = re.search(r'"restarted_pid": (\d+)', out)
        try:
            report = json.loads(out[out.index("{"):])
            run = report["runs"][0]
            assert numeric_strings(report) == [], out
            assert run["new_master"] == slave.url and run["lost"] == 0, out
            # It said "rejoined as nothing (yet)": it was looked for at its old port only.
            rejoined_port = parse_broker_url(run["rejoined_at"])[1]
            assert run["rejoined_as"].startswith("slave") and rejoined_port != old_port, out
            assert group.slaves().get(int(run["rejoined_as"][5:])) == run["rejoined_at"], out
            assert any("came back at " + run["rejoined_at"] in note for note in run["notes"]), out
            assert run["logs_identical"] is True and code == 0, out
        finally:
            if restarted:
                stop_pid(int(restarted.group(1)))
