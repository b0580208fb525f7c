"""A hostile peer during a sync failover (security off, the default).

While a put stream runs against a sync pair, a rogue client loops over what used to
break the group: ``position`` reports and replica ``get``s for phantom slaves (joins,
uncommitted reads), replica fetches claiming a higher epoch (fencing), and UDP
heartbeats with made-up partitions. Then the master is killed with -9.

Checked: no forgery is accepted (every one refused, the sync set stays {B}), the master
never fences before the kill, B takes over, every acked put is on B at its offset
(0 lost), and the master's RSS stayed bounded under the heartbeat flood.
"""

from __future__ import annotations

from chaos.rogue import RoguePeer

from .failover_support import (
    SLAVE_B,
    TOPIC,
    Group,
    PutStream,
    fetch_all,
    first_ack_after,
    make_pair,
    missing_acks,
    sync_system,
    wait_leads,
)
from .trust_support import rss_mb


def test_forgeries_during_a_sync_failover_change_nothing(broker_factory, zk_client, zk_root) -> None:  # type: ignore[no-untyped-def]
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)
    epoch_before = group.epoch()
    rss_before = rss_mb(a.pid)
    rogue = RoguePeer(a.address, topic=TOPIC, impersonate=SLAVE_B).start()
    stream = PutStream(a.address, tag="h").start()
    stream.wait_acked(400, timeout=60)
    assert group.sync_set() == {SLAVE_B} and group.epoch() == epoch_before
    assert not stream.refused, stream.refused[:3]  # never fenced, never short of its slave
    grown = rss_mb(a.pid) - rss_before
    a.kill()
    stream.stop()
    rogue.stop()
    assert rogue.sent > 100 and not rogue.accepted, rogue.accepted[:3]
    assert grown < 40, f"the master's RSS grew by {grown:.0f} MB under forged traffic"

    first_ack_after(b, b"after-the-kill")
    assert wait_leads(b, group, epoch_before) > epoch_before
    assert not missing_acks(stream.acked, fetch_all(b)), "an acked put was lost"
