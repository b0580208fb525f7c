"""``python -m chaos run --rogue``: hostile peers for the whole run, and the brokers' memory.

* one ``RoguePeer`` per broker (through its client proxy, as any client would reach it;
  heartbeats straight to its UDP port, which is not proxied), logged in as the workload's
  user when the cluster is secure: an authenticated client is still no broker;
* with ``secure``, one ``RogueZk`` writing every group's nodes without its credentials
  (without security ZooKeeper is open by design, so it is not run there);
* every broker process's RSS sampled each second.

The run fails if any forgery was accepted, or if a broker process grew by more than
``RSS_GROWTH_LIMIT_MB`` over its life (measured from ``WARM_UP_S`` after it was first
seen, so that loading its log after a restart does not count).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .cluster import ChaosCluster
from .rogue import RoguePeer, RogueZk

#: The same bound the hostile-peer integration test holds a master to.
RSS_GROWTH_LIMIT_MB = 40.0
WARM_UP_S = 3.0
#: Pause between forgery rounds per broker: ~150 forged requests/s each, enough to matter,
#: not so many that the shared test machine's CPU decides the liveness results.
ROUND_PAUSE_S = 0.02
#: The slave a RoguePeer pretends to be when it claims an epoch (``g{n}-b`` has slaveId=1).
IMPERSONATED_SLAVE = 1


@dataclass
class RssTrack:
    broker: str
    first_seen: float
    baseline_mb: float | None = None
    max_mb: float = 0.0
    samples: list[float] = field(default_factory=list)

    def add(self, now: float, rss: float) -> None:
        self.max_mb = max(self.max_mb, rss)
        if self.baseline_mb is None and now - self.first_seen >= WARM_UP_S:
            self.baseline_mb = rss

    @property
    def growth_mb(self) -> float:
        return 0.0 if self.baseline_mb is None else max(0.0, self.max_mb - self.baseline_mb)


def rss_of(pid: int) -> float | None:
    from tests.integration.trust_support import rss_mb

    try:
        return rss_mb(pid)
    except (OSError, AssertionError):
        return None  # gone, or a zombie between kill and restart


class HostileLoad:
    def __init__(self, cluster: ChaosCluster) -> None:
        self.cluster = cluster
        self.peers: dict[str, RoguePeer] = {}
        self.zk: RogueZk | None = None
        self.rss: dict[int, RssTrack] = {}
        self._halt = threading.Event()
        self._sampler = threading.Thread(target=self._sample_loop, daemon=True, name="chaos-rss")

    def start(self) -> None:
        cluster = self.cluster
        for b in cluster.brokers:
            self.peers[b.name] = RoguePeer(
                cluster.client_address(b.url), topic=cluster.topic, impersonate=IMPERSONATED_SLAVE,
                broker_id=b.group, heartbeat_address=b.process.address, credentials=cluster.credentials,
                epoch=lambda group=b.group: cluster.view(group).epoch, pause_s=ROUND_PAUSE_S,
            )
            self.peers[b.name].start()
        if cluster.secure:
            self.zk = RogueZk(cluster.zk_connect, cluster.zk_root, cluster.num_groups)
            self.zk.start()
        self._sampler.start()

    def stop(self) -> None:
        for peer in self.peers.values():
            peer.stop()
        if self.zk is not None:
            self.zk.stop()
        self._halt.set()
        self._sampler.join(5)

    def _sample_loop(self) -> None:
        while not self._halt.is_set():
            now = time.monotonic()
            for b in self.cluster.brokers:
                pid = b.process.pid if b.process.alive else None
                if pid is None:
                    continue
                rss = rss_of(pid)
                if rss is not None:
                    self.rss.setdefault(pid, RssTrack(b.name, now)).add(now, rss)
            self._halt.wait(1.0)

    def summary(self) -> dict[str, Any]:
        return {
            "peers": {name: peer.summary() for name, peer in self.peers.items()},
            "zookeeper": self.zk.summary() if self.zk is not None else "not run (security off: ZooKeeper is open)",
            "rss_mb": [{"broker": t.broker, "pid": pid, "baseline": round(t.baseline_mb or 0, 1),
                        "max": round(t.max_mb, 1), "growth": round(t.growth_mb, 1)} for pid, t in self.rss.items()],
            "rss_growth_limit_mb": RSS_GROWTH_LIMIT_MB,
        }

    def problems(self) -> list[str]:
        found = [f"{name}: {len(peer.accepted)} forgeries accepted, e.g. {peer.accepted[:2]}"
                 for name, peer in self.peers.items() if peer.accepted]
        if self.zk is not None and self.zk.accepted:
            found.append(f"ZooKeeper: {len(self.zk.accepted)} writes without credentials accepted, e.g. {self.zk.accepted[:2]}")
        found += [f"{t.broker} (pid {pid}): RSS grew by {t.growth_mb:.0f} MB (limit {RSS_GROWTH_LIMIT_MB:.0f})"
                  for pid, t in self.rss.items() if t.growth_mb > RSS_GROWTH_LIMIT_MB]
        return found

    def report_lines(self) -> list[str]:
        s = self.summary()
        sent = sum(p["sent"] for p in s["peers"].values())
        accepted = sum(p["accepted"] for p in s["peers"].values())
        zk = s["zookeeper"]
        zk_line = (f"{zk['sent']} writes without credentials, {zk['refused']} refused (NoAuth), {zk['accepted']} accepted"
                   if isinstance(zk, dict) else zk)
        growth = max((r["growth"] for r in s["rss_mb"]), default=0.0)
        peak = max((r["max"] for r in s["rss_mb"]), default=0.0)
        return [
            f"rogue peers: {sent} forged requests to {len(s['peers'])} brokers, {accepted} accepted",
            f"rogue ZooKeeper client: {zk_line}",
            f"broker RSS: peak {peak:.0f} MB, largest growth of one process {growth:.1f} MB "
            f"(limit {RSS_GROWTH_LIMIT_MB:.0f} MB, over {len(s['rss_mb'])} processes)",
        ]
