"""The topology under chaos: ZooKeeper, broker groups, every broker link through the fault proxy.

::

    slaves, returning brokers ──► proxy "peer-{broker}" ──► broker (advertisedAddress = this proxy)
    clients (the workload)    ──► proxy "client-{broker}" ──► broker (the clients' address_map)
    broker ──► proxy "zk{i}-{broker}" ──► ZooKeeper node i   (zk.zkConnect lists these proxies)
    runner's own ZK clients (monitor, real-client producer) ──► ZooKeeper directly

* ZooKeeper: ``zk_nodes=3`` runs a 3-node ensemble of EmbeddedZooKeeper peers (ZK-node
  faults are survivable), ``zk_nodes=1`` a standalone server.
* ``groups`` broker groups, each a master ``g{id}-a`` (started without ``--slave``, so it
  founds the group) and ``slaves`` slaves ``g{id}-b`` (``slaveId=1``), ``g{id}-c``
  (``slaveId=2``), in ``sync`` mode (``onSyncSlaveLoss`` ``degrade``, the default here, or
  ``reject``; ``minSyncSlaves=1``) or ``async`` mode (``autoFailover=true``).
* A broker registers its *advertised* address, so brokers reach each other through
  ``peer-{broker}``. The workload's clients map each advertised address to the broker's
  ``client-{broker}`` proxy instead (``MetaClientConfig.address_map``; the raw producers and
  readers do the same). So the links can be cut apart: ``peer-*`` alone is the master-slave
  link, ``client-*`` alone the client-broker link, both together all TCP peers; cutting its
  ``zk*`` proxies isolates a broker from ZooKeeper while clients still reach it (the
  split-brain case). UDP heartbeats are not proxied; they never decide mastership.

``hosts="netns"`` (``--hosts netns``) puts each ZooKeeper node and each broker on a host of
its own instead: a network namespace on one bridge (chaos/hosts.py), with its own address
and the real ports (ZooKeeper 2181/2888/3888, brokers 8123). No proxy sits in between:
brokers register their own address, clients and brokers connect to it directly, brokers
reach ZooKeeper directly; the workload runs in the root namespace, on the bridge. The
link faults are the hosts' own: ``silence`` takes a host's link down (silent both ways),
``cut_zk`` / ``cut_peers`` drop its packets to and from chosen peers with nftables. Toxics
(latency, bandwidth) need the proxy and are refused in this mode.

Every process is started and signalled by its own pid.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from metaq.addresses import parse_broker_url
from metaq.client.connection import BrokerConnection, Credentials
from metaq.tools.launcher import BrokerProcess, port_accepts, wait_until
from metaq.zk.embedded import EmbeddedZooKeeper, Peer, free_port
from metaq.zk.group import read_members
from metaq.zk.paths import ZkPaths, decode_epoch
from metaq.zk.tls import make_kazoo_client

from .corruption import Corruption, flip_bit, truncate_segment
from .hosts import Host, HostNetwork
from .power_loss import PowerLossDisk, PowerLossReport, build_shim
from .toxiproxy_client import FaultProxy

log = logging.getLogger(__name__)

TOPIC = "chaos"
#: The transactions' second topic (``--transactions``): each transaction of the workload
#: spreads its messages over both topics, so "all or nothing" spans topics, not just
#: partitions (chaos/transactions.py). On every broker group, like ``TOPIC``.
TXN_TOPIC = "txn-b"
TXN_PARTITIONS = 3
SESSION_MS = 1500
#: The workload's user with ``secure``: produce and consume on every topic, no admin.
CLIENT_USER = "app"


ON_SYNC_SLAVE_LOSS = ("degrade", "reject")
#: Broker settings of a run with the corrupt-* and truncate-* faults: sealed segments appear after 4 KiB
#: (a few seconds of the workload: a truncation needs one),
#: and the scrub re-reads them every second.
CORRUPTION_SYSTEM = {"maxSegmentSize": 4 * 1024, "scrubIntervalMs": 1000}
#: Where the processes run: all on 127.0.0.1 behind the proxy, or each on a host of its own.
HOSTS_MODES = ("local", "netns")
#: Ports on a host of its own (--hosts netns): each host has its own port space.
ZK_CLIENT_PORT, ZK_PEER_PORT, ZK_ELECTION_PORT = 2181, 2888, 3888
BROKER_PORT = 8123


def mode_system(mode: str, on_sync_slave_loss: str = "degrade") -> dict[str, Any]:
    # Group commit (acked after the fsync that covers it) on every member: the setting under
    # which a power loss keeps every ack (docs/guarantees.md P1-P5; P3 and P5 need it), so
    # the power-loss faults are judged like kills (sync: nothing acked may be lost).
    common = {"unflushThreshold": 0}
    if on_sync_slave_loss not in ON_SYNC_SLAVE_LOSS:
        raise ValueError(f"onSyncSlaveLoss must be degrade or reject, got {on_sync_slave_loss!r}")
    if mode == "sync":
        return {**common, "replicationMode": "sync", "onSyncSlaveLoss": on_sync_slave_loss,
                "syncSlaveTimeoutMs": 1000, "minSyncSlaves": 1}
    if mode == "async":
        return {**common, "replicationMode": "async", "autoFailover": True}
    raise ValueError(f"mode must be sync or async, got {mode!r}")


#: ``view`` reads the epoch again after the members, at most this many times, until both agree.
VIEW_ATTEMPTS = 5


@dataclass
class GroupView:
    master: str | None
    epoch: int
    slaves: dict[int, str]
    sync_set: set[int]


class ChaosBroker:
    """A broker process plus its proxies (brokers' link, clients' link, one per ZooKeeper node),
    or (--hosts netns) plus its own host and no proxies."""

    def __init__(self, process: BrokerProcess, group: int, peer_port: int, client_port: int, zk_proxies: list[str],
                 host: Host | None = None):
        self.process = process
        #: Its own host (--hosts netns), or None: on 127.0.0.1 behind the proxies.
        self.host = host
        #: Where brokers and clients reach it: its proxies' address, or its host's.
        self.address = host.address if host is not None else "127.0.0.1"
        self.group = group
        self.peer_proxy = f"peer-{process.name}"
        self.peer_port = peer_port
        self.client_proxy = f"client-{process.name}"
        self.client_port = client_port
        self.zk_proxies = zk_proxies
        self.paused = False

    @property
    def name(self) -> str:
        return self.process.name

    @property
    def url(self) -> str:
        """The address it registers in ZooKeeper (its peer proxy, or its own host's address)."""
        return f"meta://{self.address}:{self.peer_port}"

    def data_dir(self) -> Path:
        return self.process.dir / "data"

    def disk_log(self, topic: str, partition: int) -> bytes:
        """Every byte of the partition's segment files from offset 0 (raises if it does not start at 0)."""
        start, data = self.process.disk_log(topic, partition)
        if data and start != 0:
            raise RuntimeError(f"{self.name} {topic}-{partition}: first segment starts at {start}, not 0")
        return data

    def disk_end(self, topic: str, partition: int) -> int:
        directory = self.data_dir() / f"{topic}-{partition}"
        if not directory.is_dir():
            return 0
        for _attempt in range(5):
            try:
                return sum(p.stat().st_size for p in directory.glob("*.meta") if len(p.stem) == 20 and p.stem.isdigit())
            except FileNotFoundError:
                # A segment went between the listing and its stat (a truncation, a replaced
                # slave's wipe): the log is changing, so look again (campaign seed 7204: the
                # runner crashed here, an ERROR row).
                continue
        return 0

    def __repr__(self) -> str:
        return f"ChaosBroker({self.name}, group {self.group}, {self.url}, pid {self.process.pid})"


class ChaosCluster:
    def __init__(
        self,
        work_dir: str | Path,
        *,
        groups: int = 1,
        mode: str = "sync",
        zk_nodes: int = 1,
        partitions: int = 2,
        topic: str = TOPIC,
        txn_topic: str = TXN_TOPIC,
        txn_partitions: int = TXN_PARTITIONS,
        session_ms: int = SESSION_MS,
        tick_ms: int = 100,
        proxy_mode: str = "auto",
        slaves: int = 1,
        on_sync_slave_loss: str = "degrade",
        secure: bool = False,
        hosts: str = "local",
        power_loss: bool = False,
        corruption: bool = False,
    ) -> None:
        if hosts not in HOSTS_MODES:
            raise ValueError(f"hosts must be local or netns, got {hosts!r}")
        if zk_nodes not in (1, 3):
            raise ValueError("zk_nodes must be 1 or 3")
        if slaves not in (1, 2):
            raise ValueError("slaves must be 1 or 2")
        self.slaves_per_group = slaves
        self.on_sync_slave_loss = on_sync_slave_loss
        mode_system(mode, on_sync_slave_loss)  # a bad mode or policy fails here, before any process starts
        # Absolute: ZooKeeper and the brokers run with their own directory as cwd, so a path
        # relative to ours would name nothing there.
        self.work_dir = Path(work_dir).absolute()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.num_groups = groups
        self.mode = mode
        self.partitions = partitions
        self.topic = topic
        self.txn_topic = txn_topic
        self.txn_partitions = txn_partitions
        self.session_ms = session_ms
        self.tick_ms = tick_ms
        self.zk_root = "/meta"
        self.paths = ZkPaths(self.zk_root)
        self.zks: list[EmbeddedZooKeeper] = []
        self.zk_nodes = zk_nodes
        self.hosts = hosts
        #: --hosts netns: the bridge and namespaces (made in start(), removed in stop()).
        self.network: HostNetwork | None = HostNetwork() if hosts == "netns" else None
        self.zk_hosts: list[Host] = []
        # Without a real Toxiproxy, ours runs in its own process: the workload's event
        # loop must not slow the links. Hosts of their own need no proxy.
        self.proxy: FaultProxy | None = None if self.network else FaultProxy(mode=proxy_mode, fallback="process")
        self.proxy_mode = proxy_mode
        if self.network is None:
            self._make_zk(zk_nodes)  # hosts of their own get addresses only once the network is up
        self.brokers: list[ChaosBroker] = []
        self._zk: KazooClient | None = None
        #: With ``secure``: every group has its own group secret (brokers authenticate to
        #: each other, and their ZooKeeper nodes get the group's digest ACL) and the brokers
        #: a security file of users; the workload logs in as a client user.
        self.secure = secure
        self.credentials = Credentials()
        self._group_security: dict[int, dict[str, Any]] = {}
        #: With ``power_loss``: each broker writes through a PowerLossDisk (its data directory
        #: journalled by the LD_PRELOAD shim), by broker name.
        self.power_loss = power_loss
        self.disks: dict[str, PowerLossDisk] = {}
        #: With ``corruption``: small segments (so there are sealed ones to corrupt) and a
        #: scrub pass every second (chaos/corruption.py, the corrupt-* faults).
        self.corruption = corruption
        # ZooKeeper JVMs die with the *thread* that forked them (PR_SET_PDEATHSIG, see
        # metaq/zk/embedded.py): start them all from this one long-lived thread, never from
        # the short-lived worker threads the runner's fault schedule runs in.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chaos-zk-spawner")

    # --- set-up -------------------------------------------------------------------------

    def _make_zk(self, nodes: int) -> None:
        if self.network is not None:
            self.zk_hosts = [self.network.add_host(f"zk{i}") for i in range(1, nodes + 1)]
            peers = [Peer(i, h.address, ZK_PEER_PORT, ZK_ELECTION_PORT) for i, h in enumerate(self.zk_hosts, 1)]
            self.zks = [
                EmbeddedZooKeeper(ZK_CLIENT_PORT, self.work_dir / f"zk{i}", self.tick_ms, h.address,
                                  server_id=i if nodes > 1 else None, peers=peers if nodes > 1 else None,
                                  command_prefix=h.command([]))
                for i, h in enumerate(self.zk_hosts, 1)
            ]
            return
        if nodes == 1:
            self.zks = [EmbeddedZooKeeper(data_dir=self.work_dir / "zk1", tick_ms=self.tick_ms)]
            return
        peers = [Peer(i, "127.0.0.1", free_port(), free_port()) for i in range(1, nodes + 1)]
        self.zks = [
            EmbeddedZooKeeper(data_dir=self.work_dir / f"zk{i}", tick_ms=self.tick_ms, server_id=i, peers=peers)
            for i in range(1, nodes + 1)
        ]

    @property
    def topics(self) -> dict[str, int]:
        """Every topic of every broker group (broker config) -> its partition count: the
        workload's topic and the transactions' second one, unless it has no partitions (a
        run without transactions); the side topic of ``--topic-ops`` is made and dropped at
        run time, chaos/topic_ops.py."""
        if not self.txn_partitions:
            return {self.topic: self.partitions}
        return {self.topic: self.partitions, self.txn_topic: self.txn_partitions}

    def partition_names(self, group: int) -> list[tuple[str, int, str]]:
        """Every partition of ``topics`` in ``group``: (topic, n, its history name ``{topic}/{group}-{n}``)."""
        return [(topic, n, f"{topic}/{group}-{n}") for topic, count in self.topics.items() for n in range(count)]

    @property
    def zk_connect(self) -> str:
        """Direct connect string (the runner's own clients; brokers go through proxies)."""
        return ",".join(z.connect_string for z in self.zks)

    def start(self, timeout: float = 90.0) -> "ChaosCluster":
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _secure_groups(self) -> None:
        """Security files per group, made as the trust tests make them (one secret per group)."""
        from tests.integration.trust_support import PASSWORDS, SecuredGroup

        for group in range(self.num_groups):
            self._group_security[group] = SecuredGroup(self.work_dir / "security" / f"g{group}", group).system
        self.credentials = Credentials(CLIENT_USER, PASSWORDS[CLIENT_USER])

    def _start(self, timeout: float) -> None:
        if self.secure:
            self._secure_groups()
        if self.network is not None:
            self.network.up()
            self._make_zk(self.zk_nodes)
        for zk in self.zks:
            self._start_zk(zk)
        if self.proxy is not None:
            self.proxy.start()  # while the ZooKeeper JVMs start (the proxy is a process of its own)
        for zk in self.zks:
            zk.wait_until_serving(timeout)
        self._zk = make_kazoo_client(self.zk_connect, timeout=10)
        self._zk.start(timeout=30)
        system = mode_system(self.mode, self.on_sync_slave_loss)
        if self.corruption:
            system = {**system, **CORRUPTION_SYSTEM}
        power_loss_shim = build_shim(self.work_dir / "powerloss-shim") if self.power_loss else None
        for group in range(self.num_groups):
            for slave_id, role in enumerate("abc"[: 1 + self.slaves_per_group]):
                name = f"g{group}-{role}"
                slave_props = {"slaveId": slave_id} if slave_id else None
                if self.network is not None:
                    hosted = self._hosted_broker(name, group, {**system, **self._group_security.get(group, {})}, slave_props)
                    self._under_power_loss_shim(hosted.process, power_loss_shim)
                    self.brokers.append(hosted)
                    continue
                client = self.proxy.client
                zk_names, zk_ports = [], []
                for i, zk in enumerate(self.zks, 1):
                    proxy_name = f"zk{i}-{name}"
                    port = free_port()
                    client.create(upstream=zk.connect_string, name=proxy_name, listen=f"127.0.0.1:{port}")
                    zk_names.append(proxy_name)
                    zk_ports.append(port)
                server_port, peer_port, client_port = free_port(), free_port(), free_port()
                client.create(upstream=f"127.0.0.1:{server_port}", name=f"peer-{name}", listen=f"127.0.0.1:{peer_port}")
                client.create(upstream=f"127.0.0.1:{server_port}", name=f"client-{name}", listen=f"127.0.0.1:{client_port}")
                zk_connect = ",".join(f"127.0.0.1:{p}" for p in zk_ports)
                process = BrokerProcess(
                    self.work_dir, zk_connect, group, self.topics,
                    {**system, **self._group_security.get(group, {}), "serverPort": server_port,
                     "advertisedAddress": f"127.0.0.1:{peer_port}"},
                    slave_props, self.zk_root,
                    name=name, zookeeper={"zk.zkSessionTimeoutMs": self.session_ms},
                )
                self._under_power_loss_shim(process, power_loss_shim)
                self.brokers.append(ChaosBroker(process, group, peer_port, client_port, zk_names))
        masters = [b for b in self.brokers if b.name.endswith("-a")]
        slaves = [b for b in self.brokers if not b.name.endswith("-a")]
        for b in masters:
            b.process.start(wait=False)
        for b in masters:
            wait_until(lambda b=b: self.view(b.group).master == b.url, timeout, 0.1, f"{b.name} to register as master")
        for b in slaves:
            b.process.start(wait=False)
        self.wait_settled(timeout)

    def _under_power_loss_shim(self, process: BrokerProcess, shim: Path | None) -> None:
        """With ``power_loss``: the broker's data directory journalled by the shim (LD_PRELOAD; on a
        host of its own too: ``ip netns exec`` execs the broker with the same environment)."""
        if shim is not None:
            disk = PowerLossDisk(process.dir / "data", process.dir / "powerloss", shim)
            process.extra_env = disk.env()
            self.disks[process.name] = disk

    def group_secret_file(self, group: int) -> str | None:
        """With ``secure``: the file of group ``group``'s secret (its ZooKeeper login, as an
        operator's ``metaq topics --group-secret`` uses it); None without security."""
        return self._group_security.get(group, {}).get("groupSecretFile")

    def _hosted_broker(self, name: str, group: int, system: dict[str, Any],
                       slave_props: dict[str, Any] | None) -> ChaosBroker:
        """A broker on a host of its own: it binds and registers the host's address."""
        assert self.network is not None
        host = self.network.add_host(name)
        process = BrokerProcess(
            self.work_dir, self.zk_connect, group, self.topics, {**system, "serverPort": BROKER_PORT},
            slave_props, self.zk_root, name=name, zookeeper={"zk.zkSessionTimeoutMs": self.session_ms},
            host=host.address, command_prefix=host.command([]),
        )
        return ChaosBroker(process, group, BROKER_PORT, BROKER_PORT, [], host=host)

    def _start_zk(self, zk: EmbeddedZooKeeper) -> None:
        self._spawner.submit(zk.start, wait=False).result()

    def stop(self) -> None:
        masters: set[str] = set()
        if self._zk is not None:
            masters = {v.master for v in (self.view(g) for g in range(self.num_groups)) if v.master}
        # Slaves first, so that stopping does not cause failovers.
        for b in sorted(self.brokers, key=lambda b: b.url in masters):
            try:
                b.process.stop(timeout=10)
            except Exception:  # pragma: no cover - best effort
                log.exception("stopping %s", b.name)
        if self._zk is not None:
            try:
                self._zk.stop()
                self._zk.close()
            except Exception:
                pass
            self._zk = None
        for zk in self.zks:
            zk.stop()
        self._spawner.shutdown(wait=True)
        if self.proxy is not None:
            self.proxy.stop()
        if self.network is not None:
            # After every process in a namespace is stopped: a namespace lives on while one runs.
            self.network.down()

    def __enter__(self) -> "ChaosCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- views ----------------------------------------------------------------------------

    @property
    def zk(self) -> KazooClient:
        assert self._zk is not None
        return self._zk

    def _get(self, path: str) -> bytes | None:
        try:
            return self.zk.get_async(path).get(timeout=5)[0]
        except Exception:
            return None

    def view(self, group: int) -> GroupView:
        """The group as ZooKeeper has it, with an epoch that belongs with its master.

        The epoch and the master node are two reads; an election commits both at once, and one
        between the reads would pair the new master with the old epoch (seen: a failover
        recorded "to epoch 1", which the checker then took for one that deposed no epoch). So
        the epoch is read before and after the members until both reads agree."""
        for _ in range(VIEW_ATTEMPTS):
            epoch = self._epoch(group)
            try:
                members = read_members(self.zk, self.paths, group, timeout=5)
                master, slaves = members.master_url, members.slaves
            except Exception:  # the group's node is not there yet, or ZooKeeper is busy
                data = self._get(self.paths.master(group))
                master, slaves = (data.decode() if data else None), {}
            if self._epoch(group) == epoch:
                break
        sync = self._get(self.paths.sync_set(group))
        sync_set = set(json.loads(sync)["slaves"]) if sync else set()
        return GroupView(master, epoch, slaves, sync_set)

    def _epoch(self, group: int) -> int:
        data = self._get(self.paths.epoch(group))
        return decode_epoch(data)[0] if data else 0

    def group_brokers(self, group: int) -> list[ChaosBroker]:
        return [b for b in self.brokers if b.group == group]

    def by_url(self, url: str | None) -> ChaosBroker | None:
        return next((b for b in self.brokers if b.url == url), None)

    def master_of(self, group: int) -> ChaosBroker | None:
        return self.by_url(self.view(group).master)

    def slaves_of(self, group: int) -> list[ChaosBroker]:
        master = self.view(group).master
        return [b for b in self.group_brokers(group) if b.url != master]

    # --- faults -----------------------------------------------------------------------------

    def kill(self, b: ChaosBroker) -> None:
        b.process.kill()
        b.paused = False

    def restart(self, b: ChaosBroker) -> None:
        if not b.process.alive:
            b.process.start(wait=False)

    def lose_power(self, b: ChaosBroker) -> PowerLossReport:
        """Cut what a killed broker wrote and did not fsync (``power_loss`` clusters only)."""
        if b.process.alive:
            raise RuntimeError(f"{b.name} must be killed before it loses power")
        if b.name not in self.disks:
            raise RuntimeError(f"{b.name} does not run under the power-loss shim (start the cluster with power_loss)")
        report = self.disks[b.name].lose_power()
        log.info("%s lost power: %s", b.name, report)
        return report

    def corrupt(self, b: ChaosBroker, rng: random.Random, truncate: bool = False) -> Corruption | None:
        """Flip one payload bit of a flushed record in a broker's data, or (``truncate``) cut a
        sealed segment short (chaos/corruption.py)."""
        if truncate:
            found = truncate_segment(b.data_dir(), rng, self.topic)
        else:
            found = flip_bit(b.data_dir(), rng, self.topic, sealed_only=b.process.alive)
        log.info("%s corrupted: %s", b.name, found or "nothing flushed to corrupt yet")
        return found

    def wipe(self, b: ChaosBroker) -> None:
        """Empty a stopped broker's data directory: it comes back as a new, empty member."""
        if b.process.alive:
            raise RuntimeError(f"{b.name} must be stopped before its data is wiped")
        shutil.rmtree(b.data_dir(), ignore_errors=True)

    def pause(self, b: ChaosBroker) -> None:
        b.process.pause()
        b.paused = True

    def resume(self, b: ChaosBroker) -> None:
        b.process.resume()
        b.paused = False

    def _proxy(self, name: str) -> Any:
        if self.proxy is None:
            raise ValueError("this fault needs the fault proxy, which --hosts netns does not run")
        return self.proxy.client.get_proxy(name)

    def silence(self, b: ChaosBroker) -> None:
        """Its host's link down (--hosts netns): silent both ways, its sockets hang, no RST."""
        self.network_of(b).link_down(b.host)

    def unsilence(self, b: ChaosBroker) -> None:
        self.network_of(b).link_up(b.host)

    def network_of(self, b: ChaosBroker) -> HostNetwork:
        if self.network is None or b.host is None:
            raise ValueError(f"{b.name} has no host of its own: this fault needs --hosts netns")
        return self.network

    def cut_zk(self, b: ChaosBroker) -> None:
        if self.network is not None:
            for zk_host in self.zk_hosts:
                self.network_of(b).cut(b.host, zk_host.address)
            return
        for name in b.zk_proxies:
            self._proxy(name).disable()

    def heal_zk(self, b: ChaosBroker) -> None:
        if self.network is not None:
            for zk_host in self.zk_hosts:
                self.network_of(b).uncut(b.host, zk_host.address)
            return
        for name in b.zk_proxies:
            self._proxy(name).enable()

    def cut_peers(self, b: ChaosBroker, links: tuple[str, ...] = ("brokers", "clients")) -> None:
        """Cut a broker's TCP links: ``brokers`` (master-slave), ``clients``, or both."""
        if self.network is not None:
            for peer in self._peer_addresses(b, links):
                self.network_of(b).cut(b.host, peer)
            return
        for name in self._link_proxies(b, links):
            self._proxy(name).disable()

    def heal_peers(self, b: ChaosBroker, links: tuple[str, ...] = ("brokers", "clients")) -> None:
        if self.network is not None:
            for peer in self._peer_addresses(b, links):
                self.network_of(b).uncut(b.host, peer)
            return
        for name in self._link_proxies(b, links):
            self._proxy(name).enable()

    def _peer_addresses(self, b: ChaosBroker, links: tuple[str, ...]) -> list[str]:
        """--hosts netns: the other brokers of its group (``brokers``); the root namespace,
        where every client runs (``clients``)."""
        assert self.network is not None
        peers = {"brokers": [o.address for o in self.group_brokers(b.group) if o is not b],
                 "clients": [self.network.gateway]}
        return [address for link in links for address in peers[link]]

    @staticmethod
    def _link_proxies(b: ChaosBroker, links: tuple[str, ...]) -> list[str]:
        return [{"brokers": b.peer_proxy, "clients": b.client_proxy}[link] for link in links]

    def add_toxic(self, b: ChaosBroker, kind: str, **attributes: Any) -> None:
        """A toxic both ways on all of a broker's TCP links."""
        for name in (b.peer_proxy, b.client_proxy):
            proxy = self._proxy(name)
            for stream in ("upstream", "downstream"):
                proxy.add_toxic(name=f"{kind}_{stream}", type=kind, stream=stream, attributes=attributes)

    def clear_toxics(self, b: ChaosBroker) -> None:
        for name in (b.peer_proxy, b.client_proxy):
            proxy = self._proxy(name)
            for toxic in list(proxy.toxics()):
                proxy.destroy_toxic(toxic)

    @property
    def client_address_map(self) -> dict[str, str]:
        """Advertised address -> the client proxy (MetaClientConfig.address_map)."""
        return {f"{b.address}:{b.peer_port}": f"{b.address}:{b.client_port}" for b in self.brokers}

    def client_address(self, url: str) -> tuple[str, int]:
        """Where a workload client connects for the broker registered as ``url``."""
        b = self.by_url(url)
        return (b.address, b.client_port) if b is not None else parse_broker_url(url)

    async def connect(self, url: str, timeout: float) -> BrokerConnection:
        """A workload connection to the broker registered as ``url`` (logged in with ``secure``)."""
        return await self.credentials.open(*self.client_address(url), timeout)

    def kill_zk(self, index: int) -> None:
        self.zks[index].kill()

    def restart_zk(self, index: int) -> None:
        zk = self.zks[index]
        if not zk.alive:
            self._start_zk(zk)

    def heal_all(self) -> list[str]:
        """Undo every fault: continue paused, restart dead, reconnect links, drop toxics."""
        done = []
        for i, zk in enumerate(self.zks):
            if not zk.alive:
                self._start_zk(zk)
                done.append(f"restart zk{i + 1}")
        if self.network is not None:
            done += self.network.heal_all()
        else:
            try:
                self.proxy.client.reset()
            except Exception as exc:  # pragma: no cover
                log.warning("proxy reset failed: %s", exc)
        for b in self.brokers:
            if b.process.alive:
                b.process.resume()
                b.paused = False
            else:
                b.process.start(wait=False)
                done.append(f"restart {b.name}")
        return done

    # --- settling and snapshots --------------------------------------------------------------

    def settle_problem(self) -> str | None:
        """Why the cluster is not settled yet, or None: every group has one master, every
        broker is registered and alive, slaves are in the sync set (sync) and caught up."""
        for zk in self.zks:
            if not zk.alive:
                return f"zk {zk.connect_string} down"
        for group in range(self.num_groups):
            view = self.view(group)
            master = self.by_url(view.master)
            if master is None:
                return f"group {group}: no master"
            for b in self.group_brokers(group):
                if b.paused:
                    return f"{b.name} paused"
                if not b.process.alive:
                    # Its last words: a broker that died at start says why (a port taken, ...).
                    tail = b.process.log_text(last_lines=5).replace("\n", " | ")
                    return f"{b.name} not running (log: {tail})"
                if b is not master and b.url not in view.slaves.values():
                    return f"{b.name} not registered as a slave of group {group}"
                if not port_accepts(b.address, b.peer_port):
                    return f"{b.name} not reachable"
            if self.mode == "sync":
                ids = {sid for sid, url in view.slaves.items() if url != master.url}
                if not ids <= view.sync_set:
                    return f"group {group}: sync set {sorted(view.sync_set)} lacks some of {sorted(ids)}"
            for topic, n, _name in self.partition_names(group):
                end = master.disk_end(topic, n)
                for b in self.group_brokers(group):
                    if b is not master and b.disk_end(topic, n) != end:
                        return f"{b.name} behind on {topic}-{n}: {b.disk_end(topic, n)} < {end}"
        return None

    def wait_settled(self, timeout: float = 90.0) -> float:
        started = time.monotonic()
        last: list[str | None] = [None]

        def settled() -> bool:
            last[0] = self.settle_problem()
            return last[0] is None

        try:
            wait_until(settled, timeout, 0.2, "the cluster to settle")
        except AssertionError:
            raise AssertionError(f"cluster did not settle in {timeout:.0f}s: {last[0]}") from None
        return time.monotonic() - started

    def snapshot(self, history: Any) -> None:
        for group in range(self.num_groups):
            view = self.view(group)
            for b in self.group_brokers(group):
                role = "master" if b.url == view.master else "slave"
                # Both topics: the checker's replica_prefix compares each slave's logs of
                # every one of them with its master's, and the final master logs are the truth
                # for the transactions' messages on the second topic too.
                parts = {name: b.disk_log(topic, n) for topic, n, name in self.partition_names(group)}
                history.snapshot(b.name, group, role, parts, url=b.url, epoch=view.epoch)

    def log_report(self, last_lines: int = 40) -> str:
        parts = []
        for b in self.brokers:
            parts.append(f"===== {b.name} ({b.process.log_path}) =====")
            parts.append(b.process.log_text(last_lines=last_lines) or "(empty)")
        return "\n".join(parts)


__all__ = ["ChaosBroker", "ChaosCluster", "GroupView", "HOSTS_MODES", "TOPIC", "TXN_TOPIC", "mode_system", "parse_broker_url"]
