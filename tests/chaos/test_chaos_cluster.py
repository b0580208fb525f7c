"""The chaos topology's own plumbing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from chaos.cluster import ChaosCluster

pytestmark = pytest.mark.chaos


def test_regression_zk_node_restarted_from_worker_thread_survives(tmp_path: Path) -> None:
    """The first 30-minute run failed its final settle with a ZooKeeper node "down": the
    fault schedule restarted killed ZK nodes from an asyncio.to_thread worker, and an
    EmbeddedZooKeeper JVM gets SIGKILL (PR_SET_PDEATHSIG) when the *thread* that forked it
    exits, i.e. when asyncio.run() shut its executor down. ZK nodes must be started from
    the cluster's long-lived spawner thread, whatever thread asks."""
    cluster = ChaosCluster(tmp_path, zk_nodes=1)
    zk = cluster.zks[0]
    try:
        worker = threading.Thread(target=cluster.restart_zk, args=(0,))
        worker.start()
        worker.join()  # the asking thread is gone ...
        zk.wait_until_serving(30)
        time.sleep(1.0)
        assert zk.alive, "ZooKeeper died with the thread that asked for its restart"  # ... the JVM is not
    finally:
        zk.stop()
        cluster._spawner.shutdown()
