"""Issue 14: a hostile peer during a sync failover (security off, the default).

While a put stream runs against a sync pair, a rogue client loops over what used to
break the group: ``position`` reports and replica ``get``s for phantom slaves (joins,
uncommitted reads), replica fetches claiming a higher epoch (fencing), and UDP
heartbeats with made-up partitions. Then the master is killed with -9.

Checked: no forgery is accepted (every one refused, the sync set stays {B}), the master
never fences before the kill, B takes over, every acked put is on B at its offset
(0 lost), and the master's RSS stayed bounded under the heartbeat flood.
"""

from __future__ import annotations

import asyncio
import socket
import threading

from metaq.client.connection import BrokerConnection
from metaq.ha.heartbeat import encode

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



class RoguePeer:
    """Forges in a loop until stopped; counts what the master accepted."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.accepted: list[dict] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> "RoguePeer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(20)

    async def _run(self) -> None:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        n = 0
        while not self._stop.is_set():
            try:
                conn = await BrokerConnection.open(*self.address, timeout=1)
            except Exception:
                await asyncio.sleep(0.05)
                continue
            try:
                while not self._stop.is_set():
                    n += 1
                    phantom = 50 + n % 40
                    forged = [
                        {"op": "position", "topic": TOPIC, "partition": 0,
                         "replica": {"slave_id": phantom, "epoch": 1, "log_end": 10**9}},
                        {"op": "get", "topic": TOPIC, "partition": 0, "offset": 0,
                         "replica": {"slave_id": phantom, "epoch": 1, "log_end": 0}},
                        {"op": "get", "topic": TOPIC, "partition": 0, "offset": 0,
                         "replica": {"slave_id": SLAVE_B, "epoch": 10_000 + n, "log_end": 0}},
                    ]
                    for header in forged:
                        reply = await conn.request(header, timeout=5)
                        self.sent += 1
                        if reply.code == 200:
                            self.accepted.append(header)
                    junk = {f"junk{n}-{k}/0": k for k in range(200)}
                    udp.sendto(encode({"kind": "hb", "role": "slave", "broker_id": 0, "slave_id": phantom, "epoch": 1,
                                       "log_ends": junk, "sent_at": 0.0}), self.address)
                    await asyncio.sleep(0.002)
            except Exception:
                pass  # the master died: reconnect (to nothing) until stopped
            finally:
                conn.close()
        udp.close()


def test_forgeries_during_a_sync_failover_change_nothing(broker_factory, zk_client, zk_root) -> None:  # type: ignore[no-untyped-def]
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)
    epoch_before = group.epoch()
    rss_before = rss_mb(a.pid)
    rogue = RoguePeer(a.address).start()
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
