"""server.ini and async_slave.properties: MetaQ's keys, clear errors naming file and key."""

from __future__ import annotations

import re
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
        (b"[system]\nbrokerId=0\nreplicationStream=true\n", r"\[system\] replicationStream: needs replicationMode=sync"),
        (b"[system]\nbrokerId=0\nreplicationMode=sync\nreplicationStream=yes please\n", r"replicationStream: expected true or false"),
        (b"[system]\nbrokerId=0\n[topic=t]\nnumPartitions=0\n", r"\[topic=t\] numPartitions: must be >= 1"),
        (b"[system]\nbrokerId=0\n[topic=t]\nflushy=1\n", r"\[topic=t\] flushy: unknown key"),
        (b"[system]\nbrokerId=0\n[topics=t]\n", r"\[topics=t\]: unknown section"),
        (b"[system]\nbrokerId=0\n[topic=a b]\n", r"topic name 'a b'"),
        (b"[system]\nbrokerId=0\ndeletePolicy=forever\n", r"deletePolicy: expected 'delete,N"),
        (b"[system]\nbrokerId=0\ndeleteWhen=daily\n", r"deleteWhen: expected a 6-field Quartz"),
        (b"[system]\nbrokerId=0\n[topic=t]\ndeletePolicy=delete,5,true\n", r"\[topic=t\] deletePolicy: expected 'delete,N"),
        (b"[system]\nbrokerId=0\ndeleteWhen=0 0 25 * * ?\n", r"deleteWhen: .*'0 0 25 \* \* \?'"),
        (b"[system]\nbrokerId=0\n[topic=t]\ndeleteWhen=0 0 6 L * ?\n", r"topic=t.*deleteWhen|deleteWhen.*L"),
        (b"[system]\nbrokerId=0\n[zookeeper]\nzk.zkRoot=meta\n", r"zk.zkRoot: must start with '/'"),
        (b"[system]\nbrokerId=0\n[zookeeper]\nzk.zkRoot=/a/../b\n", r"zk.zkRoot: must not have a '.' or '..'"),
        (b"[zookeeper]\nzk.zkConnect=x\n", r"missing section \[system\]"),
        (b"brokerId=0\n", r"line 1: .brokerId=0. comes before any section"),
        (b"[system]\nbrokerId=0\n[system]\n", r"not a valid INI file"),
        (b"\xff\xfe", r"not UTF-8"),
        (b"[system]\nbrokerId=0\nloginTimeoutMs=10\n", r"loginTimeoutMs: must be >= 100"),
        (b"[system]\nbrokerId=0\nmaxConnectionsPerAddress=0\n", r"maxConnectionsPerAddress: must be >= 1"),
        (b"[system]\nbrokerId=0\nmaxBufferedRequestBytes=1048576\n",
         r"maxBufferedRequestBytes: must be >= the largest request body, 16842752 bytes"),
        (b"[system]\nbrokerId=0\nmaxMessageSize=8388608\nmaxBufferedRequestBytes=33554432\n",
         r"maxBufferedRequestBytes: must be >= the largest request body, 67108864 bytes"),
    ],
)
def test_errors_name_file_section_and_key(text, message):
    with pytest.raises(ConfigError, match=r"^my\.ini: .*" + message):
        parse_server_ini(text, "my.ini")


def test_replication_stream_is_off_by_default_and_a_sync_master_may_turn_it_on():
    assert parse_server_ini(b"[system]\nbrokerId=0\n").replication_stream is False
    config = parse_server_ini(b"[system]\nbrokerId=0\nreplicationMode=sync\nreplicationStream=true\n")
    assert config.replication_stream is True


def test_connection_limit_keys():
    config = parse_server_ini(b"[system]\nbrokerId=0\n")
    assert (config.max_buffered_request_bytes, config.login_timeout_ms, config.max_connections_per_address) == (
        64 * 1024 * 1024, 10_000, 256)
    config = parse_server_ini(
        b"[system]\nbrokerId=0\nmaxMessageSize=1024\nmaxBufferedRequestBytes=1048576\nloginTimeoutMs=500\n"
        b"maxConnectionsPerAddress=3\n"
    )
    assert (config.max_buffered_request_bytes, config.login_timeout_ms, config.max_connections_per_address) == (
        1048576, 500, 3)
    assert config.max_request_body == 16 * 1024 + 64 * 1024


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


# --- operator fixes (trailing comments, port range, one-line errors, shared topic settings) ---


def test_metaq_style_trailing_comments_are_accepted():
    config = parse_server_ini(
        b"[system]\nbrokerId=0 ; the master's id\nserverPort=8123   # its port\ndeleteWhen=0 0 6,18 * * ?\n"
        b"[topic=a]\nnumPartitions=3 ; three\n",
        "c.ini",
    )
    assert config.broker_id == 0 and config.server_port == 8123
    assert config.topics["a"].num_partitions == 3 and config.topics["a"].delete_when == "0 0 6,18 * * ?"


def test_slave_properties_take_the_same_trailing_comments_as_server_ini():
    # docs/operations.md: "a ; or # after whitespace ends the value ..., in async_slave.properties too".
    config = parse_slave_properties(
        "; a comment line\nslaveId=1 ; this slave's id\nslaveMaxDelayInMills=250   # ms\nslaveGroup=g ! java style\n"
    )
    assert (config.slave_id, config.slave_max_delay_ms, config.slave_group) == (1, 250, "g")


@pytest.mark.parametrize("port", ["99999", "65536", "-1"])
def test_server_port_outside_the_tcp_range_is_refused(port):
    with pytest.raises(ConfigError, match=r"c.ini: \[system\] serverPort: must be"):
        parse_server_ini(f"[system]\nbrokerId=0\nserverPort={port}\n".encode(), "c.ini")


def test_missing_system_header_is_one_line():
    with pytest.raises(ConfigError) as info:
        parse_server_ini(b"brokerId=0\nserverPort=8123\n", "c.ini")
    assert "\n" not in str(info.value)
    assert str(info.value) == "c.ini: line 1: 'brokerId=0' comes before any section (the file starts with [system])"


def test_logging_and_metrics_keys():
    config = parse_server_ini(
        b"[system]\nbrokerId=0\nmetricsPort=9404\nlogFile=broker.log\nlogFormat=json\nlogLevel=DEBUG\n", "c.ini"
    )
    assert config.metrics_port == 9404 and config.log_file == "broker.log"
    assert config.log_format == "json" and config.log_level == "DEBUG"
    assert parse_server_ini(b"[system]\nbrokerId=0\n", "c.ini").metrics_port is None
    with pytest.raises(ConfigError, match="logFormat: expected one of text, json"):
        parse_server_ini(b"[system]\nbrokerId=0\nlogFormat=xml\n", "c.ini")


def test_metrics_port_access_rules():
    base = b"[system]\nbrokerId=0\nmetricsPort=9404\n"
    assert parse_server_ini(base, "c.ini").metrics_host == "127.0.0.1"  # loopback unless opened
    secured = base + b"securityEnabled=true\ntlsCertFile=c.pem\ntlsKeyFile=k.pem\n"
    for host in (b"0.0.0.0", b"10.1.2.3", b"metrics.example"):
        # Security on and reachable from other hosts: a login alone, or TLS alone, is not enough.
        for extra in (b"", b"metricsPasswordFile=m.pw\n", b"metricsTls=true\n"):
            with pytest.raises(ConfigError, match="metricsHost: .* needs metricsPasswordFile .* and metricsTls=true"):
                parse_server_ini(secured + b"metricsHost=" + host + b"\n" + extra, "conf/c.ini")
    config = parse_server_ini(secured + b"metricsHost=0.0.0.0\nmetricsPasswordFile=m.pw\nmetricsTls=true\nmetricsUser=prom\n", "conf/c.ini")
    assert (config.metrics_password_file, config.metrics_tls, config.metrics_user) == ("conf/m.pw", True, "prom")
    for host in (b"127.0.0.1", b"::1", b"localhost"):
        assert parse_server_ini(secured + b"metricsHost=" + host + b"\n", "c.ini").metrics_password_file is None
    assert parse_server_ini(base + b"metricsHost=0.0.0.0\n", "c.ini").metrics_host == "0.0.0.0"  # security off: the operator's call
    with pytest.raises(ConfigError, match="metricsTls: needs TLS on"):
        parse_server_ini(base + b"metricsTls=true\n", "c.ini")


def test_shared_topic_settings_round_trip():
    from metaq.config import topic_from_settings, topic_settings

    config = parse_server_ini(b"[system]\nbrokerId=0\ndataPath=/d\n[topic=a]\nnumPartitions=3\nacceptPublish=false\n", "c.ini")
    settings = topic_settings(config.topics["a"])
    assert settings["numPartitions"] == "3" and settings["acceptPublish"] == "false" and "dataPath" not in settings
    again = topic_from_settings(config.topic_defaults, "a", settings, "zk")
    assert again == config.topics["a"]
    with pytest.raises(ConfigError, match="numPartitions: must be >= 1"):
        topic_from_settings(config.topic_defaults, "a", {"numPartitions": 0}, "zk")
    with pytest.raises(ConfigError, match="dataPath: not a shared topic key"):
        topic_from_settings(config.topic_defaults, "a", {"dataPath": "/x"}, "zk")


def test_every_shipped_and_documented_config_loads_and_keeps_data_outside_the_checkout():
    import re as _re

    for path in sorted(REPO.glob("conf/**/*.ini")):
        config = load_server_ini(path)
        for data_path in {config.data_path} | {t.data_path for t in config.topics.values()}:
            assert not Path(data_path).resolve().is_relative_to(REPO), f"{path} writes data into the checkout: {data_path}"
    blocks = 0
    for doc in sorted(REPO.glob("docs/*.md")) + [REPO / "README.md"]:
        for lang, body in _re.findall(r"```(ini|properties)\n(.*?)```", doc.read_text(), _re.S):
            if lang == "ini" and "brokerId" in body:  # complete files, not fragments
                parse_server_ini(body.encode(), f"{doc.name} example")
                blocks += 1
            elif lang == "properties" and "slaveId" in body:
                parse_slave_properties(body, f"{doc.name} example")
                blocks += 1
    assert blocks >= 2


def test_zookeeper_tls_keys(tmp_path):
    for name in ("ca.pem", "c.pem", "k.pem"):
        (tmp_path / name).write_text("x")
    ini = tmp_path / "server.ini"
    ini.write_bytes(b"[system]\nbrokerId=0\n[zookeeper]\nzk.zkTlsCaFile=ca.pem\nzk.zkTlsCertFile=c.pem\n"
                    b"zk.zkTlsKeyFile=k.pem\nzk.zkTlsVerifyHostname=false\n")
    tls = load_server_ini(ini).zk.tls
    # Relative paths are beside the file, like dataPath.
    assert (tls.ca_file, tls.cert_file, tls.key_file, tls.verify_hostname) == (
        str(tmp_path / "ca.pem"), str(tmp_path / "c.pem"), str(tmp_path / "k.pem"), False)
    assert parse_server_ini(b"[system]\nbrokerId=0\n").zk.tls is None  # plaintext unless a CA is given
    with pytest.raises(ConfigError, match=r"zk.zkTlsCaFile: required when zk.zkTlsCertFile"):
        parse_server_ini(b"[system]\nbrokerId=0\n[zookeeper]\nzk.zkTlsCertFile=/c.pem\nzk.zkTlsKeyFile=/k.pem\n", "my.ini")
    with pytest.raises(ConfigError, match=r"^my\.ini: \[zookeeper\] ZooKeeper TLS: CA file /nope.pem does not exist"):
        parse_server_ini(b"[system]\nbrokerId=0\n[zookeeper]\nzk.zkTlsCaFile=/nope.pem\n", "my.ini")
    (tmp_path / "only.ini").write_bytes(b"[system]\nbrokerId=0\n[zookeeper]\nzk.zkTlsCaFile=ca.pem\nzk.zkTlsCertFile=c.pem\n")
    with pytest.raises(ConfigError, match=r"give both or neither"):
        load_server_ini(tmp_path / "only.ini")


@pytest.mark.parametrize(
    "name, message",
    [
        ("a" * 201, "is 201 characters long; at most 200"),
        ("", "topic name is empty"),
        ("a b", "may only use letters, digits"),
        ("..", "topic name '..' is not allowed"),
        (".", "topic name '.' is not allowed"),
    ],
)
def test_a_bad_topic_name_is_refused_saying_what_is_wrong_with_it(name: str, message: str) -> None:
    from metaq.config import check_topic_name

    with pytest.raises(ValueError, match=re.escape(message)):
        check_topic_name(name)
    assert check_topic_name("a" * 200) == "a" * 200


@pytest.mark.parametrize("policy", ["delete,168", "delete,30m", "delete, 5 s", "archive,7", "archive,2h,true",
                                    "archive,1,false", "delete,5,true", "delete,5,false", "delete", "purge,5", "delete,-1"])
def test_a_delete_policy_passes_the_files_check_exactly_when_retention_can_run_it(policy):
    """The file's check (and `metaq topics alter --set`, which uses it) and retention's parse agree:
    delete,5,true passed the check and then failed in every broker's retention scheduler."""
    from metaq.store.retention import parse_delete_policy

    try:
        parse_delete_policy(policy)
        runs = True
    except ValueError:
        runs = False
    try:
        parse_server_ini(f"[system]\nbrokerId=0\ndeletePolicy={policy}\n".encode())
        accepted = True
    except ConfigError:
        accepted = False
    assert accepted == runs, (policy, accepted, runs)
