"""A sync master back from a ZooKeeper blip with its session keeps its slave eligible.

Regression for campaign seed 4005 (a failover check that failed): the master's ZooKeeper
link dropped for an instant; kazoo reconnected with the same session, so the master went
FENCED and back to LEADING in the same epoch. Leading again started the sync set anew:
it published ``[]`` and acked alone. ZooKeeper then lost the master for 5 s: its session
expired, but its caught-up slave was "not in the last sync set []" and could not take
over, so the group had no master until the old one came back. A cut that never heals
would have left it without a master for good.

Here with the fault proxy on the master's ZooKeeper link: a blip, then a cut that never
heals. The slave must take over within the bound, with every acked message.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chaos.cluster import ChaosCluster
from metaq.tools.launcher import wait_until

from .test_chaos_zk_reconnect import put, reads_back

pytestmark = pytest.mark.chaos

#: The cluster's ZooKeeper session is 1.5 s; the slave is elected once it has expired.
TAKEOVER_BOUND_S = 8.0


def test_a_master_back_from_a_zookeeper_blip_keeps_its_sync_set_and_a_lasting_cut_fails_over(tmp_path: Path) -> None:
    with ChaosCluster(tmp_path, zk_nodes=1, mode="sync") as cluster:
        master = cluster.master_of(0)
        assert master is not None
        (slave,) = cluster.slaves_of(0)
        address = cluster.client_address(master.url)
        wait_until(lambda: cluster.view(0).sync_set, 20, 0.1, "the slave in the sync set")
        members, epoch = cluster.view(0).sync_set, cluster.view(0).epoch

        acked: list[tuple[int, bytes]] = []

        def put_acked(payload: bytes, timeout: float) -> None:
            def attempt() -> bool:
                reply = put(address, cluster.topic, payload)
                if isinstance(reply, Exception) or not reply.ok:
                    return False
                acked.append((int(reply["offset"]), payload))
                return True

            wait_until(attempt, timeout, 0.1, f"{payload!r} acked")

        for n in range(5):
            put_acked(f"before-{n}".encode(), 10)

        # The blip: the link drops and comes back within the session.
        cluster.cut_zk(master)
        time.sleep(0.3)
        cluster.heal_zk(master)
        wait_until(lambda: "fenced --reconnected_same_epoch--> leading" in master.process.log_text(), 15, 0.1,
                   "the master back from fenced in the same epoch")
        view = cluster.view(0)
        assert view.epoch == epoch and view.master == master.url
        assert view.sync_set == members, f"the sync set after the blip is {view.sync_set}, was {members}"
        after_blip = master.process.log_text().split("fenced --reconnected_same_epoch--> leading", 1)[1]
        assert "acking with the master alone" not in after_blip, "the master acked alone after coming back"
        for n in range(5):
            put_acked(f"after-blip-{n}".encode(), 10)

        # A cut that never heals: the session expires, the slave takes over.
        cut_at = time.monotonic()
        cluster.cut_zk(master)
        wait_until(lambda: cluster.view(0).master == slave.url, TAKEOVER_BOUND_S, 0.1,
                   "the slave to take over from the master ZooKeeper lost")
        new_address = cluster.client_address(slave.url)
        wait_until(lambda: (r := put(new_address, cluster.topic, b"on-the-new-master")) and not isinstance(r, Exception)
                   and r.ok, max(1.0, TAKEOVER_BOUND_S - (time.monotonic() - cut_at)) + 2, 0.1,
                   "the first write on the new master")
        unread = [(o, p) for o, p in acked if not reads_back(new_address, cluster.topic, o, p)]
        assert not unread, f"acked messages not readable on the new master: {unread}"
