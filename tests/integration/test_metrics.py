"""Prometheus metrics over HTTP (`[system] metricsPort`) of a real sync pair."""

from __future__ import annotations

import re
import urllib.request

from metaq.tools.launcher import free_port

from .failover_support import GROUP, ZK_SETTINGS, Group, sync_system, wait_follows, wait_in_sync_set
from .replication_support import put, request, wait_caught_up


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        return reply.read().decode()


def value(text: str, series: str) -> float:
    """The sample of ``series`` (name plus labels, exactly as exposed)."""
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert match, f"{series} not in the scrape:\n{text}"
    return float(match.group(1))


def test_metrics_port_serves_the_documented_series(broker_factory, zk_root, zk_client):
    group = Group(zk_client, zk_root)
    master_port, slave_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    master = broker_factory(GROUP, {"fo": 2}, sync_system(metricsPort=master_port), name="A", zookeeper=ZK_SETTINGS)
    slave = broker_factory(GROUP, {"fo": 2}, sync_system(metricsPort=slave_port), {"slaveId": 1}, name="B", zookeeper=ZK_SETTINGS)
    wait_follows(slave, master, group)
    wait_in_sync_set(group, 1)
    put(master, "fo", 0, 40, size=100)
    put(master, "fo", 1, 10, size=100)
    wait_caught_up(master, slave, [("fo", 0), ("fo", 1)])
    refused = request(master, {"op": "put", "topic": "fo", "partition": 7}, b"x")
    assert refused.code == 400

    text = scrape(master_port)
    assert value(text, 'metaq_put_messages_total{topic="fo"}') == 50
    assert value(text, 'metaq_put_bytes_total{topic="fo"}') == 50 * 120
    assert value(text, 'metaq_request_seconds_count{op="put"}') >= 2
    assert 'metaq_request_seconds_bucket{le="0.005",op="put"}' in text
    assert value(text, "metaq_fsync_seconds_count") >= 1
    assert value(text, 'metaq_put_rejected_total{code="400"}') == 1
    assert value(text, 'metaq_role{role="master"}') == 1 and value(text, 'metaq_role{role="slave"}') == 0
    assert value(text, "metaq_epoch") == group.epoch()
    assert value(text, "metaq_sync_set_size") == 1
    assert value(text, "metaq_under_replicated_partitions") == 0
    assert value(text, 'metaq_replication_lag_bytes{partition="0",slave="1",topic="fo"}') == 0
    assert 'metaq_replication_lag_messages{partition="1",slave="1",topic="fo"}' in text
    assert 'metaq_replication_lag_seconds{partition="0",slave="1",topic="fo"}' in text
    assert value(text, "metaq_connections") >= 1 and value(text, "metaq_connections_opened_total") >= 1
    assert value(text, 'metaq_zookeeper_state{state="CONNECTED"}') == 1
    assert 'metaq_get_requests_total{topic="fo"}' in text

    slave_text = scrape(slave_port)
    assert value(slave_text, 'metaq_role{role="slave"}') == 1
    assert value(slave_text, "metaq_epoch") == group.epoch()
    assert f"metrics on http://127.0.0.1:{master_port}/metrics" in master.log_text()
