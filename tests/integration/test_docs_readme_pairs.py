"""README, "Run a pair by hand", and docs/replication.md: the example configs start working
pairs. Copies of ``conf/server.ini`` + ``conf/slave.ini`` with ``async_slave.properties.example``
(async, group 0) and of ``conf/sync-pair/`` (sync, group 1) run as real brokers on one
ZooKeeper, as the files are, with only what a second copy on one machine must change:
ports, data directories, the ZooKeeper address and a root of this module's own."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tests.harness import REPO_ROOT, BrokerFactory, BrokerProcess, wait_until

from .trust_support import metaq


def copy_conf(broker: BrokerProcess, source: str, zk_connect: str, zk_root: str,
              slave_properties: str | None = None) -> None:
    """Replace the harness's server.ini of ``broker`` with a copy of an example file (and its
    --slave file with a copy of the example properties)."""
    text = (REPO_ROOT / source).read_text()
    for key, value in (("serverPort", broker.port), ("dataPath", broker.dir / "data"), ("zk.zkConnect", zk_connect)):
        text, count = re.subn(rf"(?m)^{re.escape(key)}=.*$", f"{key}={value}", text)
        assert count == 1, (source, key)
    text, count = re.subn(r"(?m)^zk.zkRoot=.*$", f"zk.zkRoot={zk_root}", text)
    if not count:
        text = text.replace("[zookeeper]\n", f"[zookeeper]\nzk.zkRoot={zk_root}\n", 1)
    broker.config_path.write_text(text)
    if slave_properties is not None:
        assert broker.slave_path is not None
        broker.slave_path.write_text((REPO_ROOT / slave_properties).read_text())


@pytest.fixture(scope="module")
def pairs(zk, tmp_path_factory) -> Iterator[tuple[str, str, dict[str, BrokerProcess]]]:
    root = f"/meta-{uuid.uuid4().hex[:12]}"
    factory = BrokerFactory(tmp_path_factory.mktemp("readme-pairs"), zk.connect_string, root)
    layout = {
        "master": (0, "conf/server.ini", None),
        "slave": (0, "conf/slave.ini", "async_slave.properties.example"),
        "sync-master": (1, "conf/sync-pair/master.ini", None),
        "sync-slave": (1, "conf/sync-pair/slave.ini", "conf/sync-pair/slave.properties"),
    }
    brokers = {}
    try:
        for name, (broker_id, ini, properties) in layout.items():
            broker = factory(broker_id, slave_props={"slaveId": 0} if properties else None, start=False, name=name)
            copy_conf(broker, ini, zk.connect_string, root, properties)
            brokers[name] = broker.start()
        yield zk.connect_string, root, brokers
    finally:
        factory.stop_all()


def test_the_example_configs_start_an_async_and_a_sync_pair(pairs):
    zk, root, brokers = pairs
    for topic in ("test", "payments"):
        produced = metaq("produce", "--zk", zk, "--zk-root", root, "--topic", topic, "--count", "200", "--size", "64")
        assert produced.returncode == 0, produced.stderr.decode()

    def healthy() -> dict | None:
        shown = metaq("cluster", "--zk", zk, "--zk-root", root, "--json")
        report = json.loads(shown.stdout)
        members = {(m["broker_id"], m["role"]): m for m in report["members"]}
        ready = shown.returncode == 0 and len(members) == 4 and members[(1, "master")]["sync_set"] == ["slave0"]
        return report if ready else None

    report = wait_until(healthy, 30, interval=0.2, message="both pairs up, the sync slave in the sync set")
    assert {m["url"] for m in report["members"]} == {b.url for b in brokers.values()}
    for broker_id in (0, 1):
        wait_until(lambda: metaq("verify", "--zk", zk, "--zk-root", root, "--broker-id", str(broker_id)).returncode == 0, 30,
                   interval=0.2, message=f"group {broker_id}'s slave to hold the master's log")
    # conf/sync-pair/master.ini: its stats say the mode and the sync set's state.
    stats = metaq("stats", "%s:%d" % brokers["sync-master"].address)
    assert stats.returncode == 0 and {"replication_mode sync", "sync_set 0", "sync_state ok"} <= set(
        stats.stdout.decode().splitlines()), stats.stdout.decode()
    # The sync pair acked only what its slave has: the slave's copy of payments holds every message.
    consumed = metaq("consume", "--zk", zk, "--zk-root", root, "--topic", "payments", "--group", "readme",
                     "--read-from", "slave", "--max", "200", "--idle-timeout", "20")
    assert consumed.returncode == 0 and len(consumed.stdout.splitlines()) == 200, consumed.stderr.decode()[-2000:]


def test_the_slave_keeps_a_copy_of_its_masters_server_ini_and_its_own_untouched(pairs):
    # async_slave.properties.example, autoSyncMasterConfig=true.
    _zk, _root, brokers = pairs
    slave = brokers["slave"]
    copy = Path(f"{slave.config_path}.master")
    wait_until(copy.exists, 30, message="server.ini.master beside the slave's server.ini")
    assert copy.read_bytes() == brokers["master"].config_path.read_bytes()
    assert f"serverPort={slave.port}\n" in slave.config_path.read_text()  # never rewritten with the master's
