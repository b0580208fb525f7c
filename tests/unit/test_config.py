"""server.ini and async_slave.properties: MetaQ's keys, clear errors naming file and key."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from metaq.config import ConfigError, load_server_ini, load_slave_properties, parse_server_ini, parse_slave_properties

REPO = Path(__file__).resolve().parents[2]

GOOD = b"""
[system]
brokerId=3
serverPort=9000
numPartitions=2
unflushThreshold=0
dataPath=/tmp/x
replicationMode=sync
minSyncSlaves=1
[zookeeper]
zk.zkConnect=127.0.0.1:2181
zk.zkRoot=/other
[topic=a]
[topic=b]
numPartitions=5
unflushInterval=200
acceptPublish=false
"""


def test_defaults_and_overrides():
    config = parse_server_ini(GOOD, "/etc/metaq/server.ini")
    assert config.broker_id == 3 and config.server_port == 9000
    assert config.replication_mode == "sync" and config.on_sync_slave_loss == "reject"
    assert config.sync_slave_timeout_ms == 2000 and config.auto_failover is True
    assert config.zk.root == "/other" and config.zk.session_timeout_ms == 30000
    a, b = config.topics["a"], config.topics["b"]
    assert (a.num_partitions, a.unflush_threshold, a.data_path) == (2, 0, "/tmp/x")
    assert (b.num_partitions, b.unflush_interval_ms, b.accept_publish) == (5, 200, False)
    assert config.checksum == zlib.crc32(GOOD) and config.raw == GOOD


def test_relative_data_path_is_relative_to_the_file(tmp_path):
    ini = tmp_path / "conf" / "server.ini"
    ini.parent.mkdir()
    ini.write_bytes(b"[system]\nbrokerId=0\ndataPath=../data\n[topic=t]\n")
    assert load_server_ini(ini).topics["t"].data_path == str(ini.parent / "../data")


@pytest.mark.parametrize(
    "text, message",
    [
        (b"[system]\nserverPort=1\n", r"\[system\] brokerId: required key is missing"),
        (b"[system]\nbrokerId=x\n", r"\[system\] brokerId: expected an integer, got 'x'"),
        (b"[system]\nbrokerId=0\nbrokerid=1\n", r"\[system\] brokerid: unknown key"),
        (b"[system]\nbrokerId=0\nreplicationMode=semi\n", r"replicationMode: expected one of async, sync"),
        (b"[system]\nbrokerId=0\n[topic=t]\nnumPartitions=0\n", r"\[topic=t\] numPartitions: must be >= 1"),
        (b"[system]\nbrokerId=0\n[topic=t]\nflushy=1\n", r"\[topic=t\] flushy: unknown key"),
        (b"[system]\nbrokerId=0\n[topics=t]\n", r"\[topics=t\]: unknown section"),
        (b"[system]\nbrokerId=0\n[topic=a b]\n", r"topic name 'a b'"),
        (b"[system]\nbrokerId=0\ndeletePolicy=forever\n", r"deletePolicy: expected 'delete,N"),
        (b"[system]\nbrokerId=0\ndeleteWhen=daily\n", r"deleteWhen: expected a 6-field Quartz"),
        (b"[system]\nbrokerId=0\n[zookeeper]\nzk.zkRoot=meta\n", r"zk.zkRoot: must start with '/'"),
        (b"[zookeeper]\nzk.zkConnect=x\n", r"missing section \[system\]"),
        (b"brokerId=0\n", r"not a valid INI file"),
        (b"[system]\nbrokerId=0\n[system]\n", r"not a valid INI file"),
        (b"\xff\xfe", r"not UTF-8"),
    ],
)
def test_errors_name_file_section_and_key(text, message):
    with pytest.raises(ConfigError, match=r"^my\.ini: .*" + message):
        parse_server_ini(text, "my.ini")


def test_missing_file():
    with pytest.raises(ConfigError, match="nope.ini: cannot read"):
        load_server_ini("nope.ini")


def test_shipped_configs_load():
    for ini in (REPO / "conf").rglob("*.ini"):
        load_server_ini(ini)
    example = load_slave_properties(REPO / "async_slave.properties.example")
    assert example.slave_id == 0 and example.slave_max_delay_ms == 500


def test_slave_properties():
    config = parse_slave_properties("# comment\nslaveId = 2\n")
    assert config.slave_group == "meta-slave-group_2" and config.auto_sync_master_config is True
    assert parse_slave_properties("slaveId=1\nautoSyncMasterConfig=false\nslaveGroup=g\n").slave_group == "g"
    with pytest.raises(ConfigError, match="s.properties: slaveId: required"):
        parse_slave_properties("slaveGroup=x\n", "s.properties")
    with pytest.raises(ConfigError, match="slaveId: must be >= 0"):
        parse_slave_properties("slaveId=-1\n")
    with pytest.raises(ConfigError, match="slaveid: unknown key"):
        parse_slave_properties("slaveid=1\n")
    with pytest.raises(ConfigError, match="autoSyncMasterConfig: expected true or false"):
        parse_slave_properties("slaveId=1\nautoSyncMasterConfig=maybe\n")
