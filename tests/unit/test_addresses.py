"""Broker urls and host:port pairs (metaq/addresses.py)."""

import pytest

from metaq.addresses import broker_url, parse_broker_url, parse_host_port


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
