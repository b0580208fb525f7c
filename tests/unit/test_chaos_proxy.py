"""The Toxiproxy-API fault proxy (chaos.proxy), driven by toxiproxy-python and raw HTTP.

Timing assertions are loose on purpose (lower bounds at 80 %, upper bounds generous):
the machine is shared with other test runs.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
import urllib.error
import urllib.request

import pytest
from toxiproxy.exceptions import NotFound, ProxyExists, InvalidToxic

from chaos.proxy import ProxyThread
from chaos.toxiproxy_client import client_for


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while True:
                data = self.request.recv(65536)
                if not data:
                    return
                self.request.sendall(data)
        except OSError:
            return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture(scope="module")
def echo():
    server = _Server(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def proxy_server():
    with ProxyThread(seed=7) as server:
        yield server


@pytest.fixture
def toxi(proxy_server):
    client = client_for(proxy_server.url)
    client.destroy_all()
    yield client
    client.destroy_all()


def http(server: ProxyThread, method: str, path: str, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as err:
        raw = err.read()
        return err.code, (json.loads(raw) if raw else None)


def addr(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


def connect(proxy) -> socket.socket:
    sock = socket.create_connection(addr(proxy.listen), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def roundtrip(sock: socket.socket, payload: bytes) -> float:
    started = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - started


# --- API -----------------------------------------------------------------------------


def test_create_list_show_delete_via_client_and_raw_json(toxi, proxy_server, echo):
    proxy = toxi.create(upstream=echo, name="p1")
    assert proxy.enabled is True
    host, port = addr(proxy.listen)
    assert host == "127.0.0.1" and port > 0  # ":0" became the bound port
    assert set(toxi.proxies()) == {"p1"}

    status, body = http(proxy_server, "GET", "/proxies")
    assert status == 200
    assert body == {"p1": {"name": "p1", "listen": proxy.listen, "upstream": echo, "enabled": True, "toxics": []}}
    status, shown = http(proxy_server, "GET", "/proxies/p1")
    assert status == 200 and shown == body["p1"]

    with pytest.raises(ProxyExists):
        toxi.create(upstream=echo, name="p1")
    status, err = http(proxy_server, "POST", "/proxies", {"name": "p1", "upstream": echo})
    assert status == 409 and err["status"] == 409 and err["error"]
    status, err = http(proxy_server, "GET", "/proxies/nope")
    assert status == 404 and err["status"] == 404
    with pytest.raises(NotFound):
        proxy.destroy_toxic("nope")

    assert proxy.destroy() is True
    assert toxi.proxies() == {}
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=1).close()


def test_version_and_bad_requests(toxi, proxy_server, echo):
    assert toxi.version()
    status, body = http(proxy_server, "GET", "/version")
    assert status == 200 and "version" in body
    assert http(proxy_server, "POST", "/proxies", {"name": "x"})[0] == 400  # no upstream
    assert http(proxy_server, "POST", "/proxies", {"name": "x", "upstream": "nocolon"})[0] == 400
    assert http(proxy_server, "GET", "/nothing-here")[0] == 404
    proxy = toxi.create(upstream=echo, name="p2")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="no_such_toxic")
    assert http(proxy_server, "POST", "/proxies/p2/toxics", {"type": "latency", "stream": "sideways"})[0] == 400
    assert http(proxy_server, "POST", "/proxies/p2/toxics", {"type": "latency", "toxicity": 2})[0] == 400
    assert http(proxy_server, "POST", "/proxies/p2/toxics", {"type": "latency", "attributes": []})[0] == 400


def test_enabled_that_is_not_a_boolean_is_a_400_and_changes_nothing(toxi, proxy_server, echo):
    # "no" is truthy: it used to create an enabled proxy, and {"enabled": 1} was taken as is.
    status, body = http(proxy_server, "POST", "/proxies", {"name": "pe", "upstream": echo, "enabled": "no"})
    assert status == 400 and "enabled" in body["error"] and "pe" not in toxi.proxies()
    status, body = http(proxy_server, "POST", "/proxies", {"name": "pe", "upstream": echo, "enabled": False})
    assert status == 201 and body["enabled"] is False
    status, body = http(proxy_server, "POST", "/proxies/pe", {"enabled": 1})
    assert status == 400 and "enabled" in body["error"]
    assert http(proxy_server, "GET", "/proxies/pe")[1]["enabled"] is False


def test_toxic_json_defaults_update_delete(toxi, proxy_server, echo):
    proxy = toxi.create(upstream=echo, name="p3")
    status, toxic = http(proxy_server, "POST", "/proxies/p3/toxics", {"type": "latency", "attributes": {"latency": 5}})
    assert status == 200
    assert toxic == {"name": "latency_downstream", "type": "latency", "stream": "downstream", "toxicity": 1.0,
                     "attributes": {"latency": 5, "jitter": 0}}
    assert http(proxy_server, "POST", "/proxies/p3/toxics", {"type": "latency"})[0] == 409
    proxy.add_toxic(type="bandwidth", stream="upstream", name="bw", attributes={"rate": 100})
    assert set(proxy.toxics()) == {"latency_downstream", "bw"}
    assert proxy.toxics()["bw"].stream == "upstream"
    status, listed = http(proxy_server, "GET", "/proxies/p3/toxics")
    assert status == 200 and [t["name"] for t in listed] == ["latency_downstream", "bw"]

    status, updated = http(proxy_server, "POST", "/proxies/p3/toxics/bw", {"attributes": {"rate": 7}, "toxicity": 0.5})
    assert status == 200 and updated["attributes"] == {"rate": 7} and updated["toxicity"] == 0.5
    assert http(proxy_server, "GET", "/proxies/p3/toxics/bw")[1] == updated
    assert proxy.destroy_toxic("bw") is True
    assert http(proxy_server, "GET", "/proxies/p3/toxics/bw")[0] == 404
    assert http(proxy_server, "GET", "/proxies/p3")[1]["toxics"][0]["name"] == "latency_downstream"


def test_populate_creates_and_replaces(toxi, proxy_server, echo):
    status, body = http(proxy_server, "POST", "/populate", [
        {"name": "a", "upstream": echo, "listen": "127.0.0.1:0"},
        {"name": "b", "upstream": echo},
    ])
    assert status == 201 and [p["name"] for p in body["proxies"]] == ["a", "b"]
    assert set(toxi.proxies()) == {"a", "b"}
    with connect(toxi.get_proxy("b")) as sock:
        roundtrip(sock, b"populated")


# --- data path -----------------------------------------------------------------------


def test_bytes_pass_both_ways(toxi, echo):
    proxy = toxi.create(upstream=echo, name="pass")
    payload = bytes(range(256)) * 800  # 200 KiB
    with connect(proxy) as sock:
        threading.Thread(target=sock.sendall, args=(payload,), daemon=True).start()
        assert recv_exactly(sock, len(payload)) == payload
        roundtrip(sock, b"again")


def test_disable_cuts_connections_and_refuses_new_ones_then_enable(toxi, echo):
    proxy = toxi.create(upstream=echo, name="dis")
    sock = connect(proxy)
    roundtrip(sock, b"hi")
    proxy.disable()
    assert toxi.get_proxy("dis").enabled is False
    try:
        sock.settimeout(3)
        assert sock.recv(10) == b""  # closed by the proxy
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    with pytest.raises(OSError):
        socket.create_connection(addr(proxy.listen), timeout=1).close()
    proxy.enable()
    with connect(proxy) as again:  # same address as before
        roundtrip(again, b"back")
    with proxy.down():
        with pytest.raises(OSError):
            socket.create_connection(addr(proxy.listen), timeout=1).close()
    with connect(proxy) as again:
        roundtrip(again, b"up")


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_latency_delays_each_direction(toxi, echo, stream):
    proxy = toxi.create(upstream=echo, name=f"lat_{stream}")
    with connect(proxy) as sock:
        base = roundtrip(sock, b"x")
        proxy.add_toxic(type="latency", stream=stream, attributes={"latency": 300, "jitter": 20})
        delayed = roundtrip(sock, b"y")
        assert delayed >= 0.8 * 0.28
        assert delayed < 5
    assert base < delayed


def test_latency_is_a_delay_not_a_throughput_cap(toxi, echo):
    proxy = toxi.create(upstream=echo, name="lat_pipe")
    proxy.add_toxic(type="latency", attributes={"latency": 200})
    with connect(proxy) as sock:
        started = time.monotonic()
        for i in range(10):
            sock.sendall(b"%d;" % i)
            time.sleep(0.02)
        expected = b"".join(b"%d;" % i for i in range(10))
        assert recv_exactly(sock, len(expected)) == expected
        elapsed = time.monotonic() - started
    assert 0.8 * 0.4 <= elapsed < 1.5  # not 10 x 200 ms


def test_toxicity_zero_never_applies(toxi, echo):
    proxy = toxi.create(upstream=echo, name="tox0")
    proxy.add_toxic(type="latency", toxicity=0.0, attributes={"latency": 2000})
    proxy.add_toxic(type="reset_peer", stream="upstream", toxicity=0.0, attributes={"timeout": 0})
    for _ in range(3):
        with connect(proxy) as sock:
            assert roundtrip(sock, b"fast") < 1.5


def test_timeout_zero_holds_data_until_removed(toxi, echo):
    proxy = toxi.create(upstream=echo, name="hold")
    with connect(proxy) as sock:
        roundtrip(sock, b"before")
        proxy.add_toxic(type="timeout", attributes={"timeout": 0})
        sock.sendall(b"held")
        sock.settimeout(0.5)
        with pytest.raises(socket.timeout):
            sock.recv(10)
        proxy.destroy_toxic("timeout_downstream")
        sock.settimeout(5)
        assert recv_exactly(sock, 4) == b"held"


def test_timeout_closes_the_connection_after_the_timeout(toxi, echo):
    proxy = toxi.create(upstream=echo, name="tmo")
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 300})
    with connect(proxy) as sock:
        started = time.monotonic()
        sock.sendall(b"lost")
        try:
            data = sock.recv(10)
        except ConnectionResetError:
            data = b""
        assert data == b""
        assert time.monotonic() - started >= 0.8 * 0.3


def test_reset_peer_resets(toxi, echo):
    proxy = toxi.create(upstream=echo, name="rst")
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 100})
    with connect(proxy) as sock:
        sock.sendall(b"hello")
        with pytest.raises(ConnectionResetError):
            for _ in range(10):
                if not sock.recv(10):
                    break
                time.sleep(0.05)
            sock.sendall(b"more")
            sock.recv(10)


def test_limit_data_closes_after_n_bytes(toxi, echo):
    proxy = toxi.create(upstream=echo, name="lim")
    proxy.add_toxic(type="limit_data", attributes={"bytes": 1000})
    with connect(proxy) as sock:
        sock.sendall(b"a" * 600)
        assert recv_exactly(sock, 600) == b"a" * 600
        sock.sendall(b"b" * 600)
        rest = recv_exactly(sock, 600)
        assert rest == b"b" * 400  # exactly 1000 bytes, then the close


def test_slicer_splits_data(toxi, echo):
    proxy = toxi.create(upstream=echo, name="slice")
    proxy.add_toxic(type="slicer", attributes={"average_size": 50, "size_variation": 10, "delay": 20000})
    with connect(proxy) as sock:
        sock.sendall(b"z" * 500)
        sizes = []
        got = 0
        while got < 500:
            chunk = sock.recv(4096)
            assert chunk
            sizes.append(len(chunk))
            got += len(chunk)
    assert len(sizes) >= 4
    assert max(sizes) < 500


def test_bandwidth_limits_rate(toxi, echo):
    proxy = toxi.create(upstream=echo, name="bw")
    proxy.add_toxic(type="bandwidth", attributes={"rate": 100})  # 100 KB/s
    payload = b"q" * 100_000
    with connect(proxy) as sock:
        started = time.monotonic()
        threading.Thread(target=sock.sendall, args=(payload,), daemon=True).start()
        assert recv_exactly(sock, len(payload)) == payload
        assert time.monotonic() - started >= 0.8 * 1.0


def test_reset_enables_all_and_removes_all_toxics(toxi, proxy_server, echo):
    proxy = toxi.create(upstream=echo, name="rs")
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 1000})
    proxy.disable()
    assert toxi.reset() is True
    shown = http(proxy_server, "GET", "/proxies/rs")[1]
    assert shown["enabled"] is True and shown["toxics"] == []
    with connect(proxy) as sock:
        assert roundtrip(sock, b"clean") < 1.5
    assert http(proxy_server, "POST", "/reset")[0] == 204


def test_upstream_change_via_post(toxi, proxy_server, echo):
    proxy = toxi.create(upstream="127.0.0.1:1", name="mv")
    status, body = http(proxy_server, "POST", "/proxies/mv", {"upstream": echo})
    assert status == 200 and body["upstream"] == echo and body["enabled"] is True
    with connect(proxy) as sock:
        roundtrip(sock, b"moved")


def test_fault_proxy_as_a_separate_process(echo, monkeypatch):
    """``python -m chaos proxy`` in its own process, found through chaos.toxiproxy_client."""
    from chaos.toxiproxy_client import fault_proxy

    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    with fault_proxy(mode="process", seed=1) as fp:
        assert fp.kind == "chaos-process"
        client = fp.client
        proxy = client.create(upstream=echo, name="proc")
        with connect(proxy) as sock:
            roundtrip(sock, b"via a process")
        assert client.reset() is True


def test_toxiproxy_url_is_used_when_set(proxy_server, monkeypatch):
    from chaos.toxiproxy_client import fault_proxy

    monkeypatch.setenv("TOXIPROXY_URL", proxy_server.url)
    with fault_proxy() as fp:
        assert fp.kind == "external" and fp.url == proxy_server.url
        assert fp.client.version()


def test_forced_modes_ignore_toxiproxy_url_and_an_unknown_mode_is_refused(proxy_server, monkeypatch):
    from chaos.toxiproxy_client import fault_proxy

    monkeypatch.setenv("TOXIPROXY_URL", proxy_server.url)
    with fault_proxy(mode="thread") as fp:
        assert fp.kind == "chaos-thread" and fp.url != proxy_server.url and fp.client.version()
    # "Thread" (a typo) used to start a thread proxy silently, as any unknown mode did.
    with pytest.raises(ValueError, match="mode must be one of auto, thread, process"):
        fault_proxy(mode="Thread")
