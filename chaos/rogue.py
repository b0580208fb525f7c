"""A hostile peer: forges what used to break a group, in a loop, and counts what got through.

Used by ``python -m chaos run --rogue`` (against every broker, for the whole run) and by
tests/integration/test_trust_hostile_peer.py (against one master during a failover).

* ``RoguePeer`` (one broker, over TCP, and UDP heartbeats): ``position`` reports and
  replica ``get``s as phantom slaves (joins, uncommitted reads), replica fetches as a
  real slave claiming an ever higher epoch (what used to fence a master), and UDP
  heartbeats with made-up partitions (what used to grow a master's memory without end).
  Optionally logged in as a client (``credentials``): an authenticated user is not a broker
  and may replicate no more than an anonymous peer.
* ``RogueZk``: a ZooKeeper client without the groups' credentials writing their nodes:
  a sync set naming a phantom, a bumped epoch, a deleted master node, a phantom slave.
  Only meaningful against brokers with security on: without it ZooKeeper is open by
  design (docs/security.md) and these writes succeed.

Every forgery a broker (or ZooKeeper) accepts is kept in ``accepted``; a run is clean
only if that stays empty.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from metaq.client.connection import Credentials
from metaq.ha.heartbeat import encode
from metaq.zk.paths import ZkPaths

#: Phantom slave ids cycle through this range (never a real member's id).
PHANTOMS = range(50, 90)


class _Looper:
    """A daemon thread running ``_run`` until ``stop()``; ``sent`` and ``accepted`` counted."""

    def __init__(self, name: str) -> None:
        self.accepted: list[Any] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name=name)

    def start(self) -> "_Looper":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(20)

    def summary(self) -> dict[str, Any]:
        return {"sent": self.sent, "accepted": len(self.accepted), "first_accepted": self.accepted[:3]}

    def _main(self) -> None:
        raise NotImplementedError


class RoguePeer(_Looper):
    """Forges against one broker until stopped; counts what it accepted."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        topic: str,
        impersonate: int,
        broker_id: int = 0,
        heartbeat_address: tuple[str, int] | None = None,
        credentials: Credentials | None = None,
        epoch: Callable[[], int] = lambda: 1,
        pause_s: float = 0.002,
    ) -> None:
        super().__init__(f"rogue-peer-{address[1]}")
        self.address = address
        self.topic = topic
        self.impersonate = impersonate  # a real slave's id: its epoch claims are the forgery
        self.broker_id = broker_id
        self.heartbeat_address = heartbeat_address or address
        self.credentials = credentials or Credentials()
        self.epoch = epoch
        self.pause_s = pause_s

    def _main(self) -> None:
        asyncio.run(self._run())

    def forgeries(self, n: int, epoch: int) -> list[dict[str, Any]]:
        phantom = PHANTOMS[n % len(PHANTOMS)]
        return [
            {"op": "position", "topic": self.topic, "partition": 0,
             "replica": {"slave_id": phantom, "epoch": epoch, "log_end": 10**9}},
            {"op": "get", "topic": self.topic, "partition": 0, "offset": 0,
             "replica": {"slave_id": phantom, "epoch": epoch, "log_end": 0}},
            {"op": "get", "topic": self.topic, "partition": 0, "offset": 0,
             "replica": {"slave_id": self.impersonate, "epoch": 10_000 + n, "log_end": 0}},
        ]

    def junk_heartbeat(self, n: int) -> bytes:
        junk = {f"junk{n}-{k}/0": k for k in range(200)}
        return encode({"kind": "hb", "role": "slave", "broker_id": self.broker_id, "slave_id": PHANTOMS[n % len(PHANTOMS)],
                       "epoch": 1, "log_ends": junk, "sent_at": 0.0})

    async def _run(self) -> None:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        n = 0
        try:
            while not self._stop.is_set():
                try:
                    conn = await self.credentials.open(*self.address, timeout=1)
                except Exception:
                    await asyncio.sleep(0.05)  # down, paused or refusing: try again
                    continue
                try:
                    epoch = self.epoch()
                    while not self._stop.is_set():
                        n += 1
                        for header in self.forgeries(n, epoch):
                            reply = await conn.request(header, timeout=5)
                            self.sent += 1
                            if reply.code == 200:
                                self.accepted.append(header)
                        udp.sendto(self.junk_heartbeat(n), self.heartbeat_address)
                        await asyncio.sleep(self.pause_s)
                except Exception:
                    pass  # the broker died or the link was cut: reconnect until stopped
                finally:
                    conn.close()
        finally:
            udp.close()


class RogueZk(_Looper):
    """Writes the groups' ZooKeeper nodes without their credentials until stopped."""

    def __init__(self, zk_connect: str, zk_root: str, groups: int, pause_s: float = 0.05) -> None:
        super().__init__("rogue-zk")
        self.zk_connect = zk_connect
        self.paths = ZkPaths(zk_root)
        self.groups = groups
        self.pause_s = pause_s
        self.refused = 0

    def forgeries(self, group: int, n: int) -> list[tuple[str, Callable[[KazooClient], Any]]]:
        paths, phantom = self.paths, PHANTOMS[n % len(PHANTOMS)]
        sync_set = f'{{"slaves": [{phantom}], "epoch": 1, "min": 1}}'.encode()
        return [
            (f"set {paths.sync_set(group)}", lambda zk: zk.set(paths.sync_set(group), sync_set)),
            (f"set {paths.epoch(group)}", lambda zk: zk.set(paths.epoch(group), b"99")),
            (f"delete {paths.master(group)}", lambda zk: zk.delete(paths.master(group))),
            (f"create {paths.slave(group, phantom)}",
             lambda zk: zk.create(paths.slave(group, phantom), b"meta://127.0.0.1:1", ephemeral=True)),
        ]

    def _main(self) -> None:
        zk = KazooClient(hosts=self.zk_connect, timeout=10)
        try:
            zk.start(timeout=30)
        except Exception:
            return
        n = 0
        try:
            while not self._stop.is_set():
                n += 1
                for group in range(self.groups):
                    for what, write in self.forgeries(group, n):
                        try:
                            write(zk)
                        except NoAuthError:
                            self.refused += 1
                        except Exception:
                            continue  # no node, no quorum right now: neither accepted nor refused
                        else:
                            self.accepted.append(what)
                        self.sent += 1
                self._stop.wait(self.pause_s)
        finally:
            zk.stop()
            zk.close()

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "refused": self.refused}
