"""Broker urls and host:port pairs (metaq/addresses.py)."""

import pytest

from metaq.addresses import broker_url, check_zk_connect, parse_broker_url, parse_host_port


@pytest.mark.parametrize(
    "host, port, url",
    [("127.0.0.1", 8123, "meta://127.0.0.1:8123"), ("::1", 8123, "meta://[::1]:8123"), ("broker.local", 1, "meta://broker.local:1")],
)
def test_broker_url_round_trip(host: str, port: int, url: str) -> None:
    assert broker_url(host, port) == url
    assert parse_broker_url(url) == (host, port)


def test_parse_broker_url_ignores_slave_id_suffix() -> None:
    assert parse_broker_url("meta://10.0.0.1:8123?slaveId=2") == ("10.0.0.1", 8123)
    assert parse_broker_url("meta://[fe80::1]:9000?slaveId=0") == ("fe80::1", 9000)


@pytest.mark.parametrize(
    "bad", ["", "10.0.0.1:8123", "http://h:1", "meta://h", "meta://h:x", "meta://:1", "meta://::1:5", "meta://[::1]", "meta://h:0", "meta://h:70000"]
)
def test_parse_broker_url_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_broker_url(bad)


@pytest.mark.parametrize("text, expected", [("localhost:8123", ("localhost", 8123)), ("[::1]:9000", ("::1", 9000))])
def test_parse_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected


@pytest.mark.parametrize("bad", ["localhost", "host:0", ":80", "host:x"])
def test_parse_host_port_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError, match="expected host:port"):
        parse_host_port(bad)


@pytest.mark.parametrize("text", ["127.0.0.1:2181", " a:1,b:2/chroot ", "[::1]:2181", "localhost"])
def test_check_zk_connect_accepts_what_kazoo_reads(text: str) -> None:
    assert check_zk_connect(text) == text.strip()


@pytest.mark.parametrize("bad", ["", " ", "bad:::", "a:99999", "a:1,,b:2", "a:x"])
def test_check_zk_connect_names_a_bad_string(bad: str) -> None:
    with pytest.raises(ValueError, match=r"expected HOST:PORT\[,HOST:PORT...\], got "):
        check_zk_connect(bad)


def test_the_client_and_the_broker_config_check_their_connect_string() -> None:
    from metaq.client import MetaClientConfig
    from metaq.config import ConfigError, parse_server_ini

    with pytest.raises(ValueError, match=r"^zk_connect: expected HOST:PORT"):
        MetaClientConfig(zk_connect="bad:::")
    with pytest.raises(ConfigError, match=r"\[zookeeper\] zk.zkConnect: expected HOST:PORT"):
        parse_server_ini(b"[system]\nbrokerId=0\n[zookeeper]\nzk.zkConnect=h:1,\n")
