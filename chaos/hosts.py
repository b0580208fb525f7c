"""Hosts for ``--hosts netns``: each ZooKeeper node and broker in its own network namespace.

::

    root namespace (the workload, the runner's ZooKeeper clients)
      bridge {prefix}br  10.77.N.1/24  ({prefix}: mq + 6 random hex digits)
        ├── veth {prefix}v1 ══ eth0 in namespace {prefix}-zk1    10.77.N.11
        ├── veth {prefix}v2 ══ eth0 in namespace {prefix}-g0-a   10.77.N.12
        └── ...

Every host has its own address and port space, its own loopback, and one link: the veth
pair into the bridge. Nothing is routed off the bridge: hosts talk to each other and to
the root namespace of this machine only. The subnet's third octet ``N`` is the first one
no interface of this machine uses (chosen under a file lock, so parallel runs differ),
and every name starts with a random ``mq{6 hex digits}``, so parallel runs (even from
other PID namespaces, whose pids may repeat ours) never share a name; teardown removes
only what this network made.

Faults (docs/chaos-internals.md, "Hosts mode"):

* ``link_down(host)``: its veth goes down. Both directions go silent at once: frames are
  dropped, nobody gets a RST or an ICMP error, open sockets hang until their own timeouts
  (a host whose cable was pulled, or that froze with its NIC).
* ``cut(host, peer)``: nftables rules in the host's namespace drop every packet to and
  from one peer address (silent, both directions); other peers still reach it.

What is not simulated: latency, loss rates, reordering or bandwidth (that would need the
``netem``/``tbf`` qdiscs, which this kernel lacks), and routers or DNS between hosts.

Needs root and ``ip`` (iproute2); ``cut`` also needs ``nft``. ``unavailable()`` says in one
line why the mode cannot run here. ``HostNetwork.down()`` removes every namespace, veth and
the bridge it made; it runs from ``ChaosCluster.stop()`` and, should that never run, at exit.
"""

from __future__ import annotations

import atexit
import fcntl
import ipaddress
import logging
import os
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: The test subnets: 10.77.N.0/24, N the first one no interface of this machine uses.
SUBNET_BASE = "10.77"
#: Host addresses in the subnet start here (.1 is the bridge, the root namespace's address).
FIRST_HOST = 11
#: Held while a run picks its subnet and assigns the bridge address.
LOCK_PATH = "/tmp/metaq-chaos-netns.lock"
#: The nftables table a cut lives in, inside the cut host's namespace.
CUT_TABLE = "metaq_cut"

class HostsUnavailable(RuntimeError):
    """Network namespaces cannot be used here; the message says why in one line."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check)


def _run(command: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise HostsUnavailable(f"{' '.join(command)} failed: {result.stderr.strip() or result.returncode}")
    return result


def unavailable() -> str | None:
    """Why ``--hosts netns`` cannot run on this machine (one line), or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    return _in_probe_namespace([])


def nft_unavailable() -> str | None:
    """Why a host cannot be cut from one peer here (one line), or None when ``nft`` works."""
    if shutil.which("nft") is None:
        return "nft (Debian's nftables package) is not installed"
    return _in_probe_namespace(["nft", "add", "table", "inet", CUT_TABLE])


def _in_probe_namespace(command: list[str]) -> str | None:
    """Make a throwaway namespace and run ``command`` in it: why that failed, or None."""
    probe = f"mq{secrets.token_hex(3)}probe"
    try:
        _ip("netns", "add", probe)
    except HostsUnavailable as exc:
        return str(exc)
    try:
        if command:
            _run(["ip", "netns", "exec", probe, *command])
    except HostsUnavailable as exc:
        return str(exc)
    finally:
        _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One namespace: its name in the cluster (``zk1``, ``g0-a``), address and link."""

    name: str
    netns: str
    address: str
    veth: str  # the root namespace's end of its link, in the bridge

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the host (``ip netns exec`` execs it: the pid stays the same)."""
        return ["ip", "netns", "exec", self.netns, *argv]


class HostNetwork:
    """A bridge and hosts on it; ``up()`` before ``add_host``, ``down()`` removes it all."""

    def __init__(self) -> None:
        # Interface names have 15 characters at most: "mq" + 6 + "br" or "v{n}" fits.
        self.prefix = f"mq{secrets.token_hex(3)}"
        self.bridge = f"{self.prefix}br"
        self._bridge_made = False
        #: Hosts whose namespace this network made (only those are removed again).
        self.hosts: dict[str, Host] = {}
        self.gateway = ""
        self._network: ipaddress.IPv4Network | None = None
        self._cuts: dict[str, set[str]] = {}
        self._links_down: set[str] = set()

    def up(self) -> "HostNetwork":
        reason = unavailable()
        if reason:
            raise HostsUnavailable(reason)
        atexit.register(self.down)
        with open(LOCK_PATH, "a") as lock:
            # Two runs must not pick the same subnet: pick and assign under one lock.
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._network = self._free_subnet()
            self.gateway = str(self._network.network_address + 1)
            _ip("link", "add", self.bridge, "type", "bridge")
            self._bridge_made = True
            _ip("addr", "add", f"{self.gateway}/{self._network.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    @staticmethod
    def _free_subnet() -> ipaddress.IPv4Network:
        used = set(re.findall(rf"inet {re.escape(SUBNET_BASE)}\.(\d+)\.", _ip("-4", "-o", "addr", "show").stdout))
        for third in range(256):
            if str(third) not in used:
                return ipaddress.IPv4Network(f"{SUBNET_BASE}.{third}.0/24")
        raise HostsUnavailable(f"every subnet {SUBNET_BASE}.0-255.0/24 is in use")

    def add_host(self, name: str) -> Host:
        if self._network is None:
            raise RuntimeError("HostNetwork.up() first")
        if name in self.hosts:
            raise ValueError(f"host {name} exists already")
        index = len(self.hosts) + 1
        host = Host(name, f"{self.prefix}-{name}", str(self._network.network_address + FIRST_HOST + index - 1),
                    f"{self.prefix}v{index}")
        _ip("netns", "add", host.netns)  # fails if the name exists: then it is not ours to remove
        self.hosts[name] = host
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("link", "set", host.veth, "master", self.bridge, "up")
        inside = ["ip", "netns", "exec", host.netns, "ip"]
        _run([*inside, "addr", "add", f"{host.address}/{self._network.prefixlen}", "dev", "eth0"])
        _run([*inside, "link", "set", "eth0", "up"])
        _run([*inside, "link", "set", "lo", "up"])
        return host

    # --- faults -------------------------------------------------------------------------------

    def link_down(self, host: Host) -> None:
        """The host's only link goes down: silent both ways, no RST, no ICMP."""
        _ip("link", "set", host.veth, "down")
        self._links_down.add(host.name)

    def link_up(self, host: Host) -> None:
        _ip("link", "set", host.veth, "up")
        self._links_down.discard(host.name)

    def cut(self, host: Host, peer: str) -> None:
        """Drop every packet between ``host`` and the address ``peer`` (silent, both ways)."""
        if not self._cuts.get(host.name):
            # One table per cut host: a set of peers, dropped on the way in and out.
            script = (
                f"table inet {CUT_TABLE} {{\n"
                f"  set peers {{ type ipv4_addr; }}\n"
                f"  chain input {{ type filter hook input priority 0; ip saddr @peers drop; }}\n"
                f"  chain output {{ type filter hook output priority 0; ip daddr @peers drop; }}\n"
                f"}}\n"
            )
            self._nft(host, script)
        self._nft(host, f"add element inet {CUT_TABLE} peers {{ {peer} }}\n")
        self._cuts.setdefault(host.name, set()).add(peer)

    def uncut(self, host: Host, peer: str | None = None) -> None:
        """Undo ``cut`` for one peer, or (``peer=None``) for all of them."""
        peers = self._cuts.get(host.name, set())
        if peer is None or peers <= {peer}:
            if peers:
                self._nft(host, f"delete table inet {CUT_TABLE}\n")
            self._cuts.pop(host.name, None)
            return
        self._nft(host, f"delete element inet {CUT_TABLE} peers {{ {peer} }}\n")
        peers.discard(peer)

    @staticmethod
    def _nft(host: Host, script: str) -> None:
        result = subprocess.run(host.command(["nft", "-f", "-"]), input=script, capture_output=True, text=True,
                                timeout=30)
        if result.returncode != 0:
            raise HostsUnavailable(f"nft in {host.netns} failed: {result.stderr.strip()}")

    def heal_all(self) -> list[str]:
        """Every link up, every cut undone; returns what it did."""
        done = []
        for host in self.hosts.values():
            if host.name in self._links_down:
                self.link_up(host)
                done.append(f"link up {host.name}")
            if self._cuts.get(host.name):
                self.uncut(host)
                done.append(f"uncut {host.name}")
        return done

    # --- teardown ---------------------------------------------------------------------------------

    def down(self) -> None:
        """Remove every veth, namespace and the bridge this network made (safe to call twice).

        Call it after the processes in the namespaces are stopped: a namespace a process
        still runs in lives on, unnamed, until that process exits.
        """
        for host in self.hosts.values():
            _ip("link", "del", host.veth, check=False)  # removes both ends of the pair
            _ip("netns", "del", host.netns, check=False)
        if self._bridge_made:
            _ip("link", "del", self.bridge, check=False)
            self._bridge_made = False
        self.hosts.clear()
        self._cuts.clear()
        self._links_down.clear()
        atexit.unregister(self.down)


__all__ = ["Host", "HostNetwork", "HostsUnavailable", "nft_unavailable", "unavailable"]
