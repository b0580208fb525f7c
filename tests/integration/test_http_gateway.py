"""The `metaq http` gateway as a real process, against real ZooKeeper and a master/slave pair."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from metaq.http.process import GatewayProcess
from tests.harness import REPO_ROOT, wait_until

TOPIC = "web"
PARTITIONS = ("0-0", "0-1")


def call(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def post_json(url: str, payload: Any) -> tuple[int, Any]:
    status, _, body = call("POST", url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    return status, json.loads(body)


def get_json(url: str) -> tuple[int, Any]:
    status, _, body = call("GET", url)
    return status, json.loads(body) if body else None


@pytest.fixture
def cluster(broker_factory, zk, zk_root, tmp_path):
    """A master and a slave of broker group 0 (topic "web", 2 partitions) and a gateway."""
    system = {"unflushThreshold": 0}
    master = broker_factory(0, {TOPIC: 2}, system=system)
    slave = broker_factory(0, {TOPIC: 2}, system=system, slave_props={"slaveId": 0})
    gateway = GatewayProcess(zk.connect_string, zk_root, tmp_path / "gateway.log").start()
    try:
        wait_until(lambda: get_json(f"{gateway.url}/topics/{TOPIC}")[1]["partitions"][0]["slaves"], 30,
                   message="the slave registered")
        yield gateway, master, slave
    finally:
        gateway.stop()
    assert "Traceback" not in gateway.log_path.read_text()


def messages_url(gateway: GatewayProcess, partition: str, **query: Any) -> str:
    params = "&".join(f"{k}={v}" for k, v in query.items())
    return f"{gateway.url}/topics/{TOPIC}/partitions/{partition}/messages?{params}"


def log_ends(gateway: GatewayProcess) -> dict[str, int]:
    return {p: get_json(f"{gateway.url}/topics/{TOPIC}/partitions/{p}/offsets")[1]["max_offset"] for p in PARTITIONS}


def test_produce_and_fetch_round_trip_from_master_and_slave(cluster) -> None:
    gateway, _, _ = cluster
    status, listing = get_json(f"{gateway.url}/topics")
    assert status == 200 and listing["topics"] == [TOPIC]
    status, described = get_json(f"{gateway.url}/topics/{TOPIC}")
    assert [p["partition"] for p in described["partitions"]] == list(PARTITIONS)
    assert all(p["writable"] and p["master"].startswith("meta://") for p in described["partitions"])

    binary = bytes(range(256))
    status, reply = post_json(f"{gateway.url}/topics/{TOPIC}/messages", {"messages": [
        {"data": "héllo"}, {"data_base64": base64.b64encode(binary).decode(), "attribute": "bin"}, {"data": "third"},
    ]})
    assert status == 200, reply
    results = reply["results"]
    assert [r["success"] for r in results] == [True, True, True]
    assert all(r["partition"] in PARTITIONS and r["offset"] >= 0 and r["msg_id"] > 0 for r in results)
    # A single message object works too.
    status, single = post_json(f"{gateway.url}/topics/{TOPIC}/messages", {"data": "alone", "attribute": "a"})
    assert status == 200 and single["results"][0]["success"]
    sent = {"héllo".encode(): None, binary: "bin", b"third": None, b"alone": "a"}
    stored = results + single["results"]

    def read_all(read_from: str, encoding: str = "base64") -> dict[bytes, dict]:
        got = {}
        for result in stored:
            status, page = get_json(messages_url(gateway, result["partition"], offset=result["offset"],
                                                 read_from=read_from, encoding=encoding, max_bytes=64))
            assert status == 200, page
            first = page["messages"][0]
            data = first["data"].encode() if "data" in first else base64.b64decode(first["data_base64"])
            assert first["offset"] == result["offset"] and first["msg_id"] == result["msg_id"]
            got[data] = {**first, "replica": page["replica"]}
        return got

    from_master = read_all("master")
    assert {d: m["attribute"] for d, m in from_master.items()} == sent
    assert {m["replica"] for m in from_master.values()} == {"master"}
    # The slave has the same messages at the same offsets (once it replicated them).
    wait_until(lambda: log_ends(gateway) == {p: get_json(f"{gateway.url}/topics/{TOPIC}/partitions/{p}/offsets?read_from=slave")[1]["max_offset"] for p in PARTITIONS},
               20, message="the slave caught up")
    from_slave = read_all("slave", encoding="utf-8")
    assert {m["replica"] for m in from_slave.values()} == {"slave0"}
    assert {d: m["attribute"] for d, m in from_slave.items()} == sent
    assert "data" in from_slave["héllo".encode()] and "data_base64" in from_slave[binary], "utf-8 where it is text"


def test_raw_bytes_for_a_large_message(cluster) -> None:
    gateway, _, _ = cluster
    big = bytes(range(256)) * 3000  # 768000 bytes
    status, _, body = call("POST", f"{gateway.url}/topics/{TOPIC}/messages?attribute=big%20one", big,
                           {"Content-Type": "application/octet-stream"})
    assert status == 200
    (result,) = json.loads(body)["results"]
    # max_bytes smaller than the message: the gateway fetches the whole first message anyway.
    status, headers, data = call("GET", messages_url(gateway, result["partition"], offset=result["offset"], max_bytes=1000),
                                 headers={"Accept": "application/octet-stream"})
    assert status == 200 and data == big
    assert headers["X-Metaq-Offset"] == str(result["offset"]) and headers["X-Metaq-Msg-Id"] == str(result["msg_id"])
    assert headers["X-Metaq-Attribute"] == "big%20one"
    next_offset = int(headers["X-Metaq-Next-Offset"])
    assert next_offset == result["offset"] + 20 + 4 + len("big one") + len(big)
    status, headers, data = call("GET", messages_url(gateway, result["partition"], offset=next_offset),
                                 headers={"Accept": "application/octet-stream"})
    assert status == 204 and data == b"" and headers["X-Metaq-Next-Offset"] == str(next_offset)


def test_bad_input_gets_4xx_with_one_line_and_stores_nothing(cluster) -> None:
    gateway, _, _ = cluster
    status, reply = post_json(f"{gateway.url}/topics/{TOPIC}/messages", {"data": "seed"})
    assert status == 200
    before = log_ends(gateway)
    produce = f"{gateway.url}/topics/{TOPIC}/messages"
    json_type = {"Content-Type": "application/json"}
    cases = [
        ("unknown topic", call("POST", f"{gateway.url}/topics/nope/messages", b'{"data": "x"}', json_type), 404, "unknown topic"),
        ("malformed JSON", call("POST", produce, b'{"messages": [', json_type), 400, "malformed JSON"),
        ("no data field", call("POST", produce, b'{"messages": [{"text": "x"}]}', json_type), 400, "unknown field"),
        ("bad base64", call("POST", produce, b'{"messages": [{"data": "ok"}, {"data_base64": "@@@"}]}', json_type), 400, "base64"),
        # JSON's \ud800 escape is a lone surrogate: no UTF-8 bytes (this was a 500).
        ("lone surrogate", call("POST", produce, b'{"messages": [{"data": "ok"}, {"data": "\\ud800"}]}', json_type), 400,
         "not valid Unicode text"),
        ("lone surrogate attribute", call("POST", produce, b'{"data": "ok", "attribute": "\\udfff"}', json_type), 400,
         '"attribute" is not valid Unicode text'),
        ("oversized", call("POST", produce, json.dumps({"messages": [{"data": "ok"}, {"data": "x" * 1_100_000}]}).encode(), json_type),
         413, "exceeds the maximum message size"),
        ("oversized raw", call("POST", produce, b"x" * 1_100_000, {"Content-Type": "application/octet-stream"}), 413, "maximum message size"),
        ("wrong content type", call("POST", produce, b"x", {"Content-Type": "text/plain"}), 415, "Content-Type"),
        ("negative offset", call("GET", messages_url(gateway, "0-0", offset=-1)), 400, "offset must be between"),
        ("offset not a number", call("GET", messages_url(gateway, "0-0", offset="abc")), 400, "offset must be an integer"),
        ("offset inside a message", call("GET", messages_url(gateway, reply["results"][0]["partition"], offset=reply["results"][0]["offset"] + 3)),
         400, "not the start of a message"),
        ("offset past the end", call("GET", messages_url(gateway, "0-0", offset=10**9)), 404, "beyond the log end"),
        ("bad partition", call("GET", messages_url(gateway, "zero", offset=0)), 400, "not a partition name"),
        ("unknown partition", call("GET", messages_url(gateway, "0-7", offset=0)), 404, "has no partition 0-7"),
        ("bad read_from", call("GET", messages_url(gateway, "0-0", offset=0, read_from="any")), 400, "read_from must be one of"),
        ("unknown route", call("GET", f"{gateway.url}/nothing"), 404, "Not Found"),
    ]
    for name, (status, _, body), expected, reason in cases:
        error = json.loads(body)["error"]
        assert status == expected, (name, status, error)
        assert reason in error and "\n" not in error, (name, error)
    assert log_ends(gateway) == before, "nothing was stored"


def test_long_poll_returns_when_data_arrives(cluster) -> None:
    gateway, _, _ = cluster
    status, reply = post_json(f"{gateway.url}/topics/{TOPIC}/messages", {"data": "first"})
    partition, end = reply["results"][0]["partition"], log_ends(gateway)[reply["results"][0]["partition"]]
    # Nothing there and nothing comes: the gateway holds the request wait_ms, then answers empty.
    started = time.monotonic()
    status, page = get_json(messages_url(gateway, partition, offset=end, wait_ms=500))
    assert status == 200 and page["messages"] == [] and page["next_offset"] == end
    assert 0.4 <= time.monotonic() - started < 5
    # A message arriving during the wait ends it at once.
    outcome: dict[str, Any] = {}

    def poll() -> None:
        t0 = time.monotonic()
        outcome["reply"] = get_json(messages_url(gateway, partition, offset=end, wait_ms=20000, encoding="utf-8"))
        outcome["elapsed"] = time.monotonic() - t0

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(1.0)
    assert poller.is_alive(), "the fetch waits for data"
    # Produce into the polled partition: send until one lands there (round robin over two).
    for _ in range(4):
        status, produced = post_json(f"{gateway.url}/topics/{TOPIC}/messages", {"data": "wake up"})
        if produced["results"][0]["partition"] == partition:
            break
    poller.join(15)
    status, page = outcome["reply"]
    assert status == 200 and [m["data"] for m in page["messages"]] == ["wake up"]
    assert outcome["elapsed"] < 10, "returned on arrival, not at the end of wait_ms"


def test_cli_errors_are_one_line(zk) -> None:
    def metaq(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "metaq", "http", *args], capture_output=True, text=True,
                              cwd=REPO_ROOT, timeout=60)

    assert "--zk" in metaq("--help").stdout
    # A number that means nothing for its option is a usage error naming it (never a default in
    # disguise; every numeric option: tests/unit/test_cli_numbers.py).
    for option, value, why in (("--port", "70000", "must be <= 65535, got 70000"), ("--max-message-size", "0", "must be >= 1, got 0")):
        bad = metaq("--zk", zk.connect_string, option, value)
        assert (bad.returncode, bad.stderr.strip().splitlines()[-1]) == (2, f"metaq http: error: argument {option}: {why}"), bad.stderr
        assert "Traceback" not in bad.stderr
    no_zk = metaq("--zk", "127.0.0.1:1", "--zk-connect-timeout", "1")
    assert no_zk.returncode == 1 and "cannot connect to ZooKeeper" in no_zk.stderr and "Traceback" not in no_zk.stderr


def test_gateway_produces_and_fetches_across_a_master_kill(broker_factory, zk, zk_root, zk_client, tmp_path) -> None:
    from tests.integration.failover_support import TOPIC as FO_TOPIC
    from tests.integration.failover_support import Group, make_pair, sync_system, wait_leads

    group = Group(zk_client, zk_root)
    master, slave = make_pair(broker_factory, sync_system(), group)
    gateway = GatewayProcess(zk.connect_string, zk_root, tmp_path / "gateway.log").start()
    try:
        produce = f"{gateway.url}/topics/{FO_TOPIC}/messages"
        status, before = post_json(produce, {"data": "before"})
        assert status == 200, before
        epoch = group.epoch()
        master.kill()
        # Sent while the master is gone: the gateway's producer waits for the new one and retries.
        status, after = post_json(produce, {"data": "after"})
        assert status == 200, after
        wait_leads(slave, group, epoch)
        offset = before["results"][0]["offset"]
        status, page = get_json(f"{gateway.url}/topics/{FO_TOPIC}/partitions/0-0/messages?offset={offset}&encoding=utf-8")
        assert status == 200, page
        assert page["broker"] == f"{slave.host}:{slave.port}"
        assert [m["data"] for m in page["messages"]] == ["before", "after"]
    finally:
        gateway.stop()
    assert "Traceback" not in gateway.log_path.read_text()


def test_fetch_sees_only_committed_messages(broker_factory, zk, zk_root, zk_client, tmp_path) -> None:
    """Sync mode: a put waiting for its slave is in the master's log but not committed, and
    the gateway does not show it; once the slave has it, it does."""
    from tests.integration.failover_support import TOPIC as FO_TOPIC
    from tests.integration.failover_support import Group, make_pair, sync_system

    group = Group(zk_client, zk_root)
    _, slave = make_pair(broker_factory, sync_system(onSyncSlaveLoss="reject", syncSlaveTimeoutMs=20000), group)
    gateway = GatewayProcess(zk.connect_string, zk_root, tmp_path / "gateway.log").start()
    poller = None
    try:
        produce = f"{gateway.url}/topics/{FO_TOPIC}/messages"
        assert post_json(produce, {"data": "acked"})[0] == 200
        end = get_json(f"{gateway.url}/topics/{FO_TOPIC}/partitions/0-0/offsets")[1]["max_offset"]
        slave.pause()
        outcome: dict[str, Any] = {}
        poller = threading.Thread(target=lambda: outcome.update(reply=post_json(produce, {"data": "pending"})))
        poller.start()
        time.sleep(1.0)
        assert poller.is_alive(), "the put waits for the stopped slave"
        status, page = get_json(f"{gateway.url}/topics/{FO_TOPIC}/partitions/0-0/messages?offset={end}&wait_ms=300")
        assert status == 200 and page["messages"] == [] and page["committed"] == end, page
        slave.resume()
        poller.join(20)
        assert outcome["reply"][0] == 200, outcome
        status, page = get_json(f"{gateway.url}/topics/{FO_TOPIC}/partitions/0-0/messages?offset={end}&encoding=utf-8")
        # At least once: if the paused slave's ZooKeeper session lapsed under load, the put's
        # outcome was unknown and the client resent it; the visibility rule is what is tested.
        data = [m["data"] for m in page["messages"]]
        assert data and set(data) == {"pending"}, data
    finally:
        slave.resume()
        if poller is not None:
            poller.join(20)
        gateway.stop()


def test_fetch_from_a_time_on_master_and_slave(cluster) -> None:
    from metaq.store.msgid import msg_id_timestamp_ms

    gateway, _, _ = cluster
    url = f"{gateway.url}/topics/{TOPIC}/messages"
    early = [post_json(url, {"data": f"early-{i}"})[1]["results"][0] for i in range(6)]
    time.sleep(0.05)
    late = [post_json(url, {"data": f"late-{i}"})[1]["results"][0] for i in range(6)]
    cut = msg_id_timestamp_ms(late[0]["msg_id"])
    assert max(msg_id_timestamp_ms(r["msg_id"]) for r in early) < cut
    partition = late[0]["partition"]
    late_here = [r for r in late if r["partition"] == partition]
    wait_until(lambda: log_ends(gateway) == {p: get_json(f"{gateway.url}/topics/{TOPIC}/partitions/{p}/offsets?read_from=slave")[1]["max_offset"] for p in PARTITIONS},
               20, message="the slave caught up")
    for read_from in ("master", "slave"):
        status, page = get_json(messages_url(gateway, partition, time=cut, encoding="utf-8", read_from=read_from))
        assert status == 200, page
        assert [m["data"] for m in page["messages"]] == [f"late-{late.index(r)}" for r in late_here]
        assert page["offset"] == late_here[0]["offset"]
        status, answer = get_json(f"{gateway.url}/topics/{TOPIC}/partitions/{partition}/offsets?time={cut}&read_from={read_from}")
        assert status == 200 and answer["offset"] == late_here[0]["offset"] and answer["latest"] is False, answer
        status, answer = get_json(f"{gateway.url}/topics/{TOPIC}/partitions/{partition}/offsets?time={cut + 10**6}&read_from={read_from}")
        assert answer["latest"] is True and answer["offset"] == answer["max_offset"], answer
    # Past every message: an empty page at the committed end.
    status, page = get_json(messages_url(gateway, partition, time=cut + 10**6))
    assert status == 200 and page["messages"] == [] and page["next_offset"] == page["committed"], page
    for query, expected in (({"time": "soon"}, "time must be an integer"), ({"time": -1}, "time must be between"),
                            ({"time": 1, "offset": 0}, "exactly one of"), ({}, "exactly one of")):
        status, error = get_json(messages_url(gateway, partition, **query))
        assert status == 400 and expected in error["error"], (query, error)
