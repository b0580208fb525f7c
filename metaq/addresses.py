"""Broker addresses: ``meta://host:port`` urls and ``host:port`` pairs (IPv6 in brackets),
and ZooKeeper connect strings (such pairs, comma-separated).

Used by the config, the registry, clients and tools alike.
"""

from __future__ import annotations

URL_SCHEME = "meta://"


def broker_url(host: str, port: int) -> str:
    # IPv6 literals need brackets, or the port would be ambiguous.
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{URL_SCHEME}{host}:{port}"


def parse_broker_url(url: str) -> tuple[str, int]:
    """``meta://host:port`` -> ``(host, port)``; IPv6 comes back without brackets.

    Readers in MetaQ append ``?slaveId=N`` to slave urls, so any query suffix is ignored.
    """
    text = url.strip()
    if not text.startswith(URL_SCHEME):
        raise ValueError(f"not a broker url (expected meta://host:port): {url!r}")
    address = text[len(URL_SCHEME) :].split("?", 1)[0].rstrip("/")
    if address.startswith("["):
        host, bracket, rest = address[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ValueError(f"bad IPv6 broker url: {url!r}")
        port_text = rest[1:]
    else:
        host, colon, port_text = address.rpartition(":")
        if not colon or ":" in host:
            raise ValueError(f"broker url needs host:port (IPv6 in brackets): {url!r}")
    if not host:
        raise ValueError(f"broker url has no host: {url!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"broker url has a bad port: {url!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"broker url port out of range: {url!r}")
    return host, port


def parse_host_port(text: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:port``) -> ``(host, port)``, checked like a broker url."""
    try:
        return parse_broker_url(URL_SCHEME + text.strip())
    except ValueError:
        raise ValueError(f"expected host:port, got {text!r}") from None


def check_zk_connect(text: str) -> str:
    """A ZooKeeper connect string ``host[:port][,host[:port]...][/chroot]``, stripped; ValueError naming it.

    Checked with kazoo's own parser, the one every ZooKeeper client here hands it to, so a
    string accepted here never fails later inside a client, a broker or a tool.
    """
    from kazoo.hosts import collect_hosts

    value = text.strip()
    try:
        hosts, _chroot = collect_hosts(value)
    except ValueError as exc:
        raise ValueError(f"expected HOST:PORT[,HOST:PORT...], got {text!r} ({exc})") from None
    if not value or not all(host for host, _port in hosts):
        raise ValueError(f"expected HOST:PORT[,HOST:PORT...], got {text!r}")
    return value
