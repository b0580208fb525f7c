"""``metaq drill`` against a topic served by two broker groups.

The drill's load goes round-robin over every group serving the topic; loss must be
counted only over the drilled group's partitions, or messages stored in the other
group look lost.
"""

from __future__ import annotations

import asyncio

from metaq.process import stop_pid
from metaq.tools.drill import Drill

from .failover_support import GROUP, TOPIC, ZK_SETTINGS, Group, make_pair, sync_system


def test_drill_counts_loss_only_in_the_drilled_group(broker_factory, zk, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    make_pair(broker_factory, sync_system(), group)
    broker_factory(GROUP + 1, {TOPIC: 1}, sync_system(), name="other", zookeeper=ZK_SETTINGS)
    drill = Drill(zk.connect_string, GROUP, "kill", zk_root=zk_root, topic=TOPIC, rate=100, settle_s=1.0, rejoin_timeout_s=30)
    report = asyncio.run(drill.run())
    try:
        assert report.new_master is not None and report.new_master != report.old_master, report
        assert report.lost == 0, report
        assert report.acked_other_groups > 0, "the load never reached the other group: the test proves nothing"
        assert report.acked_total > 0
        assert report.ok, report
    finally:
        if report.restarted_pid:
            stop_pid(report.restarted_pid)
