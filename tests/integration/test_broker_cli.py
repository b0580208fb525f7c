"""`metaq broker` refusing bad configs: exit code 1, one line naming the file and key, no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from metaq.zk.embedded import free_port as any_free_port

GOOD_SYSTEM = "[system]\nbrokerId=0\nhostName=127.0.0.1\nserverPort={port}\ndataPath={data}\n"
NO_ZK = "[zookeeper]\nzk.zkEnable=false\n"


def metaq_broker(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metaq", "broker", *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("metaq broker: error:")]
    assert len(errors) == 1, done.stderr
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


@pytest.fixture
def free_port() -> int:
    return any_free_port()


@pytest.fixture
def write_ini(tmp_path: Path, free_port: int):
    def write(extra_system: str = "", rest: str = NO_ZK, name: str = "bad.ini") -> Path:
        path = tmp_path / name
        path.write_text(GOOD_SYSTEM.format(port=free_port, data=tmp_path / "data") + extra_system + rest)
        return path

    return write


@pytest.mark.parametrize(
    "extra, rest, fragments",
    [
        ("frobnicate=1\n", NO_ZK, ["[system] frobnicate: unknown key"]),
        ("numPartitions=zero\n", NO_ZK, ["[system] numPartitions: expected an integer, got 'zero'"]),
        ("unflushThreshold=-1\n", NO_ZK, ["[system] unflushThreshold: must be >= 0"]),
        ("replicationMode=quorum\n", NO_ZK, ["[system] replicationMode: expected one of async, sync"]),
        ("deletePolicy=forever\n", NO_ZK, ["[system] deletePolicy"]),
        ("", NO_ZK + "[topic=orders]\nnumPartitions=0\n", ["[topic=orders] numPartitions: must be >= 1"]),
        ("", NO_ZK + "[topic=orders]\nmaxSegmentSize=big\n", ["[topic=orders] maxSegmentSize"]),
        ("", NO_ZK + "[topic=bad name]\n", ["[topic=bad name] topic"]),
        ("", NO_ZK + "[queue=orders]\n", ["[queue=orders]: unknown section"]),
        ("", "[zookeeper]\nzk.zkRoot=meta\n", ["[zookeeper] zk.zkRoot: must start with '/'"]),
        # kazoo refuses it in every call: the broker died with its ValueError's traceback.
        ("", "[zookeeper]\nzk.zkRoot=/meta/./x\n", ["[zookeeper] zk.zkRoot: must not have a '.' or '..' component"]),
        ("", "[zookeeper]\nzk.zkEnable=maybe\n", ["[zookeeper] zk.zkEnable: expected true or false"]),
        ("", "[zookeeper]\nzk.connect=x\n", ["[zookeeper] zk.connect: unknown key"]),
        ("replicationMode=sync\n", NO_ZK, ["replicationMode=sync needs ZooKeeper"]),
    ],
    ids=[
        "unknown-key", "not-an-int", "negative", "bad-choice", "bad-delete-policy", "topic-zero-partitions",
        "topic-bad-int", "bad-topic-name", "unknown-section", "zk-root", "zk-root-dot", "zk-bool", "zk-unknown-key",
        "sync-without-zk",
    ],
)
def test_bad_server_ini_is_one_clear_line(write_ini, extra: str, rest: str, fragments: list[str]) -> None:
    path = write_ini(extra, rest)
    done = metaq_broker("-c", str(path))
    assert_one_line_error(done, str(path), *fragments)


def test_missing_broker_id_and_non_ini_files(tmp_path: Path) -> None:
    no_id = tmp_path / "no-id.ini"
    no_id.write_text("[system]\nserverPort=1234\n")
    assert_one_line_error(metaq_broker("-c", str(no_id)), str(no_id), "[system] brokerId: required key is missing")

    not_ini = tmp_path / "not.ini"
    not_ini.write_text("brokerId=0\n")
    assert_one_line_error(metaq_broker("-c", str(not_ini)), str(not_ini), "comes before any section")

    binary = tmp_path / "binary.ini"
    binary.write_bytes(b"\xff\xfe\x00[system]")
    assert_one_line_error(metaq_broker("-c", str(binary)), str(binary), "not UTF-8")


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "server.ini"
    assert_one_line_error(metaq_broker("-c", str(missing)), str(missing), "cannot read", "No such file")


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    done = metaq_broker()
    assert done.returncode == 2 and "-c" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "props, fragments",
    [
        ("slaveGroup=g\n", ["slaveId: required key is missing"]),
        ("slaveId=\n", ["slaveId: required key is missing"]),
        ("slaveId=-1\n", ["slaveId: must be >= 0"]),
        ("slaveId=one\n", ["slaveId: expected an integer"]),
        ("slaveId=0\nslaveMaxDelayInMills=soon\n", ["slaveMaxDelayInMills: expected an integer"]),
        ("slaveId=0\nautoSyncMasterConfig=perhaps\n", ["autoSyncMasterConfig: expected true or false"]),
        ("slaveId=0\nmasterHost=x\n", ["masterHost: unknown key"]),
    ],
    ids=["missing-slave-id", "empty-slave-id", "negative-slave-id", "non-int-slave-id", "bad-delay", "bad-bool", "unknown-key"],
)
def test_bad_slave_properties(write_ini, tmp_path: Path, props: str, fragments: list[str]) -> None:
    ini = write_ini(name="server.ini")
    slave = tmp_path / "async_slave.properties"
    slave.write_text(props)
    assert_one_line_error(metaq_broker("-c", str(ini), "--slave", str(slave)), str(slave), *fragments)


def test_missing_slave_properties_file(write_ini, tmp_path: Path) -> None:
    missing = tmp_path / "none.properties"
    done = metaq_broker("-c", str(write_ini(name="server.ini")), "--slave", str(missing))
    assert_one_line_error(done, str(missing), "cannot read")


def test_unreachable_zookeeper_and_taken_port_are_one_line_too(write_ini, tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        zk_port = unused.getsockname()[1]
    path = write_ini(rest=f"[zookeeper]\nzk.zkConnect=127.0.0.1:{zk_port}\nzk.zkConnectionTimeoutMs=500\n")
    assert_one_line_error(metaq_broker("-c", str(path)), "cannot connect to ZooKeeper", f"127.0.0.1:{zk_port}")

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ini = tmp_path / "taken.ini"
        ini.write_text(GOOD_SYSTEM.format(port=port, data=tmp_path / "data2") + NO_ZK)
        assert_one_line_error(metaq_broker("-c", str(ini)), "cannot run", str(port))
