"""Local clusters of real processes: `metaq broker` processes and an embedded ZooKeeper.

Shared by the tests (integration, chaos), ``metaq demo`` and the benchmarks, so that they
all start brokers the same way. Every process is started and signalled by its own pid
(never by name), so a caller can ``kill -9``, SIGSTOP and restart one broker while the
others, and other runs on the same machine, are untouched.

* ``BrokerProcess``: one broker with its own server.ini, data dir and log file.
* ``BrokerFactory``: makes brokers wired to one ZooKeeper and root, stops them all.
* ``LocalCluster``: an EmbeddedZooKeeper plus N masters (and optionally slaves) in a
  work dir, started and stopped as one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from metaq.addresses import broker_url
from metaq.process import ChildProcess
from metaq.store.segment import parse_segment_start
from metaq.zk.embedded import EmbeddedZooKeeper, free_port
from metaq.zk.paths import ZkPaths
from metaq.zk.session import zk_session
from metaq.zk.tls import ZkTls

__all__ = [
    "BrokerFactory",
    "BrokerProcess",
    "DEFAULT_SESSION_TIMEOUT_MS",
    "LocalCluster",
    "free_port",
    "port_accepts",
    "wait_until",
    "zk_session",
]

#: The directory holding the ``metaq`` package: put first on a child's PYTHONPATH so that
#: the broker it runs is this very code, whatever else is installed.
PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # metaq/tools/launcher.py -> the directory holding metaq/
DEFAULT_SESSION_TIMEOUT_MS = 4000


def wait_until(predicate, timeout: float, interval: float = 0.05, message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {message}")
        time.sleep(interval)


def read_segments(directory: Path) -> tuple[int, bytes]:
    """``(start offset, bytes)`` of a partition directory's segment files, in order.

    Only real segments count: side files (``truncated-*``, ``.corrupt-*``) are left out.
    """
    segments = sorted(
        (start, p) for p in Path(directory).glob("*.meta") if (start := parse_segment_start(p)) is not None
    )
    if not segments:
        return 0, b""
    return segments[0][0], b"".join(p.read_bytes() for _, p in segments)


def port_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _ini_value(value: Any) -> str:
    # MetaQ spells booleans in lower case.
    return str(value).lower() if isinstance(value, bool) else str(value)


def _section(name: str, values: Mapping[str, Any]) -> str:
    body = "".join(f"{key}={_ini_value(value)}\n" for key, value in values.items())
    return f"[{name}]\n{body}\n"


class BrokerProcess(ChildProcess):
    """One `metaq broker` OS process with its own server.ini, data dir and log file.

    ``topics`` maps a topic name to its partition count or to a dict of ``[topic=NAME]``
    overrides (MetaQ key names). ``system`` overrides ``[system]`` keys; ``slave_props``
    makes it a slave (written to async_slave.properties and passed with ``--slave``).
    The port is chosen once, so a restarted broker comes back at the same address.
    """

    def __init__(
        self,
        tmp_dir: str | Path,
        zk_connect: str,
        broker_id: int,
        topics: Mapping[str, int | Mapping[str, Any]] | None = None,
        system: Mapping[str, Any] | None = None,
        slave_props: Mapping[str, Any] | None = None,
        zk_root: str = "/meta",
        *,
        name: str | None = None,
        zookeeper: Mapping[str, Any] | None = None,
        host: str = "127.0.0.1",
        command_prefix: Sequence[str] = (),
    ) -> None:
        role = f"s{slave_props['slaveId']}" if slave_props else "m"
        self.name = name or f"broker{broker_id}-{role}"
        self.dir = Path(tmp_dir) / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.zk_connect = zk_connect
        self.zk_root = zk_root
        self.broker_id = broker_id
        # The address it binds (hostName) and registers; the harness reaches it there too.
        self.host = host
        # Run the broker through this (``ip netns exec NS``: it execs, so the pid is the broker's).
        self.command_prefix = list(command_prefix)
        self.port = int((system or {}).get("serverPort") or free_port(self.host))
        self.slave_id: int | None = int(slave_props["slaveId"]) if slave_props else None
        self.config_path = self.dir / "server.ini"
        self.slave_path = self.dir / "async_slave.properties" if slave_props else None
        self.log_path = self.dir / "broker.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log_handle = None
        #: Added to the environment of every start (e.g. the power-loss shim's LD_PRELOAD).
        self.extra_env: dict[str, str] = {}
        # The ZK session that held our node last time: a restart must not mistake the
        # previous incarnation's not-yet-expired node for its own registration.
        self._last_zk_owner: int | None = None
        self._write_config(topics or {}, system or {}, zookeeper or {})
        if slave_props:
            assert self.slave_path is not None
            self.slave_path.write_text("".join(f"{k}={_ini_value(v)}\n" for k, v in slave_props.items()))

    def _write_config(
        self,
        topics: Mapping[str, int | Mapping[str, Any]],
        system: Mapping[str, Any],
        zookeeper: Mapping[str, Any],
    ) -> None:
        system_values = {
            "brokerId": self.broker_id,
            "hostName": self.host,
            "serverPort": self.port,
            "dataPath": str(self.dir / "data"),
            **system,
        }
        zk_values = {
            "zk.zkConnect": self.zk_connect,
            "zk.zkSessionTimeoutMs": DEFAULT_SESSION_TIMEOUT_MS,
            "zk.zkConnectionTimeoutMs": 10000,
            "zk.zkRoot": self.zk_root,
            # Tests want a fast stop; MetaQ's 5 s pause is for real clients.
            "zk.zkSyncTimeMs": 0,
            **zookeeper,
        }
        # The harness reaches ZooKeeper the way the broker does (its zk.zkTls* keys).
        ca = zk_values.get("zk.zkTlsCaFile")
        self.zk_tls = ZkTls(str(ca), zk_values.get("zk.zkTlsCertFile"), zk_values.get("zk.zkTlsKeyFile"),
                            str(zk_values.get("zk.zkTlsVerifyHostname", True)).lower() != "false") if ca else None
        text = _section("system", system_values) + _section("zookeeper", zk_values)
        for topic, spec in topics.items():
            overrides = {"numPartitions": spec} if isinstance(spec, int) else dict(spec)
            text += _section(f"topic={topic}", overrides)
        self.config_path.write_text(text)

    # --- properties ---------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def url(self) -> str:
        return broker_url(self.host, self.port)

    @property
    def zk_node(self) -> str:
        """The ephemeral node this broker registers: ``.../ids/{id}/master`` or ``/slave{k}``."""
        paths = ZkPaths(self.zk_root)
        if self.slave_id is None:
            return paths.master(self.broker_id)
        return paths.slave(self.broker_id, self.slave_id)

    def disk_log(self, topic: str, partition: int) -> tuple[int, bytes]:
        """``(start offset, bytes)`` of a partition's segment files (read_segments)."""
        return read_segments(self.dir / "data" / f"{topic}-{partition}")

    def log_text(self, last_lines: int | None = None) -> str:
        if not self.log_path.exists():
            return ""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-last_lines:] if last_lines else lines)

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.alive else "stopped"
        return f"BrokerProcess({self.name} {self.host}:{self.port}, {state})"

    # --- lifecycle --------------------------------------------------------------------------

    def command(self) -> list[str]:
        command = [*self.command_prefix, sys.executable, "-m", "metaq", "broker", "-c", str(self.config_path)]
        if self.slave_path is not None:
            command += ["--slave", str(self.slave_path)]
        return command

    def start(self, wait: bool = True, wait_zk: bool = True, timeout: float = 30.0) -> "BrokerProcess":
        if self.alive:
            raise RuntimeError(f"{self!r} is already running")
        env = dict(os.environ)
        # The repo's package, whatever is installed elsewhere.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        self._log_handle = open(self.log_path, "ab")
        self._log_handle.write(f"--- start {' '.join(self.command())}\n".encode())
        self._log_handle.flush()
        self._process = subprocess.Popen(
            self.command(),
            cwd=self.dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
        )
        if wait:
            self.wait_ready(wait_zk=wait_zk, timeout=timeout)
        return self

    def wait_ready(self, wait_zk: bool = True, timeout: float = 30.0) -> None:
        """Until the port accepts connections and (``wait_zk``) the broker's node is ours."""

        def port_ready() -> bool:
            self._raise_if_exited("while starting")
            return port_accepts(self.host, self.port)

        wait_until(port_ready, timeout, message=f"{self.name} to listen on {self.port}")
        if wait_zk:
            with zk_session(self.zk_connect, tls=self.zk_tls) as client:

                def registered() -> bool:
                    self._raise_if_exited("before registering in ZooKeeper")
                    found = client.exists(self.zk_node)
                    if found is None or found.ephemeralOwner == self._last_zk_owner:
                        return False
                    data, _ = client.get(self.zk_node)
                    if data.decode() != self.url:
                        return False
                    if self.slave_id is None:
                        # A master registers its checksum node once it takes writes
                        # (the master node itself appears first, as the election lock).
                        checksum = client.exists(ZkPaths(self.zk_root).master_config_checksum(self.broker_id))
                        if checksum is None or checksum.ephemeralOwner != found.ephemeralOwner:
                            return False
                    self._last_zk_owner = found.ephemeralOwner
                    return True

                wait_until(registered, timeout, interval=0.1, message=f"{self.name} to register {self.zk_node}")

    def _raise_if_exited(self, when: str) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with code {self._process.returncode} {when}; last log lines:\n"
                f"{self.log_text(last_lines=30)}"
            )

    def restart(self, kill: bool = False, **start_kwargs: Any) -> "BrokerProcess":
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start(**start_kwargs)


class BrokerFactory:
    """Creates brokers wired to the test's ZooKeeper and root; remembers them to stop them all."""

    def __init__(self, tmp_dir: Path, zk_connect: str, zk_root: str) -> None:
        self.tmp_dir = Path(tmp_dir).absolute()  # each broker runs with its own directory as cwd
        self.zk_connect = zk_connect
        self.zk_root = zk_root
        self.processes: list[BrokerProcess] = []

    def __call__(
        self,
        broker_id: int,
        topics: Mapping[str, int | Mapping[str, Any]] | None = None,
        system: Mapping[str, Any] | None = None,
        slave_props: Mapping[str, Any] | None = None,
        *,
        start: bool = True,
        **kwargs: Any,
    ) -> BrokerProcess:
        broker = BrokerProcess(
            self.tmp_dir, self.zk_connect, broker_id, topics, system, slave_props, self.zk_root, **kwargs
        )
        self.processes.append(broker)
        if start:
            broker.start()
        return broker

    def stop_all(self) -> None:
        # Slaves first, so that a stopping master does not trigger failover work.
        for broker in sorted(self.processes, key=lambda b: b.slave_id is None):
            broker.stop()

    def log_report(self, last_lines: int = 50) -> str:
        parts = []
        for broker in self.processes:
            parts.append(f"===== {broker.name} ({broker.log_path}), last {last_lines} lines =====")
            parts.append(broker.log_text(last_lines=last_lines) or "(empty)")
        return "\n".join(parts)


class LocalCluster:
    """An embedded ZooKeeper and ``masters`` broker groups in ``work_dir``, as real processes.

    Broker ids are ``0 .. masters-1``; with ``slaves=k`` each master gets slaves
    ``0 .. k-1`` (``async_slave.properties`` with ``slaveId``, plus ``slave_props``),
    started after all masters are registered. ``topics`` / ``system`` / ``zookeeper`` are
    as for ``BrokerProcess`` and apply to every broker (a slave's server.ini carries its
    master's brokerId and topics, as in MetaQ). ``start()`` waits until every broker is
    registered in ZooKeeper; ``stop()`` stops every process by pid (slaves, masters, then
    ZooKeeper) and is safe to call twice or after a failed start. Also a context manager::

        with LocalCluster(tmp, topics={"demo": 2}, slaves=1) as cluster:
            print(cluster.zk_connect, cluster.masters[0].url)
    """

    def __init__(
        self,
        work_dir: str | Path,
        masters: int = 1,
        slaves: int = 0,
        topics: Mapping[str, int | Mapping[str, Any]] | None = None,
        system: Mapping[str, Any] | None = None,
        *,
        zk_root: str = "/meta",
        zk_port: int = 0,
        tick_ms: int = 200,
        zookeeper: Mapping[str, Any] | None = None,
        slave_props: Mapping[str, Any] | None = None,
        slave_system: Mapping[str, Any] | None = None,
    ) -> None:
        if masters < 1 or slaves < 0:
            raise ValueError(f"need masters >= 1 and slaves >= 0, got {masters} and {slaves}")
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.zk_root = zk_root
        self.num_masters = masters
        self.num_slaves = slaves
        self.topics = dict(topics or {})
        self.system = dict(system or {})
        self.slave_system = dict(self.system if slave_system is None else slave_system)
        self.zookeeper = dict(zookeeper or {})
        self.slave_props = dict(slave_props or {})
        self.zk = EmbeddedZooKeeper(port=zk_port, data_dir=self.work_dir / "zookeeper", tick_ms=tick_ms)
        self.factory: BrokerFactory | None = None
        self.masters: list[BrokerProcess] = []
        #: broker id -> its slaves, by slave id
        self.slaves: dict[int, list[BrokerProcess]] = {}

    @property
    def zk_connect(self) -> str:
        return self.zk.connect_string

    @property
    def brokers(self) -> list[BrokerProcess]:
        return self.masters + [s for group in self.slaves.values() for s in group]

    def start(self, timeout: float = 60.0) -> "LocalCluster":
        try:
            self.zk.start(timeout=timeout)
            self.factory = BrokerFactory(self.work_dir, self.zk_connect, self.zk_root)
            for broker_id in range(self.num_masters):
                self.masters.append(
                    self.factory(broker_id, self.topics, self.system, start=False, zookeeper=self.zookeeper)
                )
            self._start_all(self.masters, timeout)
            started: list[BrokerProcess] = []
            for broker_id in range(self.num_masters):
                group = self.slaves.setdefault(broker_id, [])
                for slave_id in range(self.num_slaves):
                    props = {**self.slave_props, "slaveId": slave_id}
                    slave = self.factory(
                        broker_id, self.topics, self.slave_system, props, start=False, zookeeper=self.zookeeper
                    )
                    group.append(slave)
                    started.append(slave)
            self._start_all(started, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _start_all(brokers: list[BrokerProcess], timeout: float) -> None:
        # Launch them all, then wait: JVM-free but still ~1 s of Python start-up each.
        for broker in brokers:
            broker.start(wait=False)
        for broker in brokers:
            broker.wait_ready(timeout=timeout)

    def stop(self) -> None:
        if self.factory is not None:
            self.factory.stop_all()
        self.zk.stop()

    def log_report(self, last_lines: int = 50) -> str:
        parts = [self.factory.log_report(last_lines)] if self.factory is not None else []
        parts.append(f"===== zookeeper ({self.zk.log_path}), last {last_lines} lines =====")
        parts.append(self.zk.log_text(last_lines=last_lines) or "(empty)")
        return "\n".join(parts)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalCluster({self.zk!r}, {self.brokers!r})"
