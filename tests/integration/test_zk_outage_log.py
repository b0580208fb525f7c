"""A ZooKeeper outage in a broker's log: one line when it starts, one when it ends, no kazoo flood."""

from __future__ import annotations

import time

from metaq.tools.launcher import BrokerFactory, wait_until
from metaq.zk.embedded import EmbeddedZooKeeper


def test_an_outage_is_two_lines(tmp_path):
    server = EmbeddedZooKeeper(data_dir=tmp_path / "zk", tick_ms=200).start()
    factory = BrokerFactory(tmp_path / "brokers", server.connect_string, "/meta")
    try:
        # A session that outlives the outage: the broker keeps its nodes and just reconnects.
        broker = factory(0, {"t": 1}, zookeeper={"zk.zkSessionTimeoutMs": 15000})
        server.kill()
        time.sleep(3)  # kazoo retries many times a second meanwhile
        server.start()
        wait_until(lambda: "ZooKeeper reachable again" in broker.log_text(), 20, message="the end-of-outage line")
        lines = broker.log_text().splitlines()
        assert sum("lost its ZooKeeper connection" in line for line in lines) == 1, lines
        assert sum("ZooKeeper reachable again after" in line for line in lines) == 1, lines
        assert "(the same session)" in next(line for line in lines if "reachable again" in line)
        assert not [line for line in lines if " kazoo" in line], "kazoo's per-attempt warnings are muted"
        assert broker.alive
    finally:
        factory.stop_all()
        server.stop()
