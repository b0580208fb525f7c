"""A real ZooKeeper server in a child JVM, for `metaq zk`, `metaq demo` and the tests.

Never a mock: the broker's HA depends on ZooKeeper's real session, ephemeral-node and
ordering semantics, so tests run the real server, started from whichever jars the
machine has (Debian's ``zookeeper`` package, else the ones that ship inside pyspark).

A standalone server answers ``srvr`` 0.5-0.8 s after launch with the JVM flags below
(measured with Debian's 3.8 jars and with pyspark's 3.9 jars; most of it is JVM start).

The class is written so that a member of a 3-node ensemble is the same object with a
``server_id`` and a ``peers`` list: those only add ``server.N=`` lines and a ``myid`` file.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import logging
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..private_files import private_opener
from ..process import ChildProcess
from .tls import ZkServerTls

log = logging.getLogger(__name__)

DEBIAN_JAR_DIR = Path("/usr/share/java")
# Set to a ':'-separated classpath to use other jars than the ones found automatically.
CLASSPATH_ENV = "METAQ_ZK_CLASSPATH"
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
# Small heap, serial GC and C1 only: a test server needs a fast start, not throughput.
JVM_FLAGS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")
LOG_FILE_NAME = "zookeeper.log"
# The JVM options that carry secrets: ``java @FILE`` reads them (Java 9+), so they never
# appear in ``ps`` or /proc/PID/cmdline; the file is 0600 and deleted once the server serves.
SECRET_ARGS_FILE_NAME = "jvm-secret.args"
# The four-letter words this package sends (four_letter_word callers): ``conf`` and ``srvr``
# tell is_serving() the server is ours and up, ``ruok`` is the classic liveness probe. The
# others (``dump`` lists sessions and ephemeral paths, ``cons``/``wchc`` every client and
# watch, ``stat`` the connected addresses) help nobody but someone mapping the cluster.
FOUR_LETTER_WORDS = ("conf", "ruok", "srvr")
# ZooKeeper's per-address connection cap (its default is 60). One broker holds one session,
# each client, tool and test fixture one more; a test run or a chaos run on one host stays
# well under this, while one address cannot take every file descriptor of the server.
DEFAULT_MAX_CLIENT_CONNECTIONS = 200
# The Netty jars ZooKeeper's NettyServerCnxnFactory (the only one that serves TLS) loads.
NETTY_PARTS = ("buffer", "codec", "common", "handler", "resolver", "transport", "transport-native-unix-common",
               "transport-native-epoll", "transport-classes-epoll")
NETTY_FACTORY = "org.apache.zookeeper.server.NettyServerCnxnFactory"


class ZooKeeperError(RuntimeError):
    """The embedded server could not be found, started or stopped; the message says why."""


# --- jar discovery -----------------------------------------------------------------


def _first_match(directory: Path, pattern: str) -> Path | None:
    regex = re.compile(pattern)
    matches = sorted(p for p in directory.iterdir() if regex.fullmatch(p.name))
    return matches[0] if matches else None


def _classpath_from(directory: Path, required: dict[str, str], optional: dict[str, str]) -> list[Path] | None:
    """The jars named by the patterns, or None when a required one is missing."""
    if not directory.is_dir():
        return None
    jars: list[Path] = []
    for pattern in required.values():
        jar = _first_match(directory, pattern)
        if jar is None:
            return None
        jars.append(jar)
    jars.extend(jar for pattern in optional.values() if (jar := _first_match(directory, pattern)))
    return jars


def _debian_classpath() -> list[Path] | None:
    # Debian's unversioned symlinks. 3.8 runs with just the first four; metrics-core and
    # snappy are loaded by some code paths (3.9 needs both at start), so add them if present.
    required = {
        "server": r"zookeeper\.jar",
        "jute": r"zookeeper-jute\.jar",
        "slf4j": r"slf4j-api\.jar",
    }
    optional = {
        # slf4j 1.7 binding: log lines go to stderr, which we send to the log file.
        "binding": r"slf4j-simple\.jar",
        "metrics": r"metrics-core\.jar",
        "snappy": r"snappy-java\.jar",
        # Netty (Debian's libnetty-java, a dependency of the zookeeper package): the TLS
        # port needs NettyServerCnxnFactory. Plaintext servers never load these classes.
        **{f"netty-{part}": rf"netty-{part}\.jar" for part in NETTY_PARTS},
    }
    return _classpath_from(DEBIAN_JAR_DIR, required, optional)


def _pyspark_jar_dir() -> Path | None:
    # find_spec locates the package without importing it (importing pyspark is slow).
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def _pyspark_classpath() -> list[Path] | None:
    directory = _pyspark_jar_dir()
    if directory is None:
        return None
    version = r"-\d[\w.\-]*\.jar"
    required = {
        "server": r"zookeeper" + version,
        "jute": r"zookeeper-jute" + version,
        "slf4j": r"slf4j-api" + version,
        # ZooKeeper 3.9's default metrics provider and snapshot code need these at start.
        "metrics": r"metrics-core" + version,
        "snappy": r"snappy-java" + version,
    }
    optional = {
        # slf4j 2 -> log4j2; without them slf4j falls back to no logging at all.
        "binding": r"log4j-slf4j2-impl" + version,
        "log4j-api": r"log4j-api" + version,
        "log4j-core": r"log4j-core" + version,
        **{f"netty-{part}": rf"netty-{part}" + version for part in NETTY_PARTS},
    }
    return _classpath_from(directory, required, optional)


def find_zookeeper_classpath() -> list[str]:
    """The jars to run a ZooKeeper server from; raises ZooKeeperError when none are installed."""
    override = os.environ.get(CLASSPATH_ENV)
    if override:
        return [entry for entry in override.split(os.pathsep) if entry]
    for finder in (_debian_classpath, _pyspark_classpath):
        jars = finder()
        if jars:
            return [str(jar) for jar in jars]
    raise ZooKeeperError(
        "no ZooKeeper jars found: install Debian's 'zookeeper' package (jars in /usr/share/java), "
        f"or pyspark (pip install pyspark), or set {CLASSPATH_ENV}"
    )


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise ZooKeeperError("java not found: install a JDK (17+) or set JAVA_HOME")
    return java


# --- small helpers -------------------------------------------------------------------


#: Ports this process has handed out: never handed out twice, even once free again (a
#: broker that is down keeps its port for its restart).
_handed_out: set[int] = set()
_LOWEST_PORT = 10000
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Ports handed out by the processes of this user on this machine, one file per port holding
#: the pid that took it (``_PortClaims``): what ``_handed_out`` is to one process, across processes.
PORT_CLAIMS_DIR = Path(tempfile.gettempdir()) / f"metaq-port-claims-{os.getuid()}"


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in _EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(host: str, port: int) -> bool:
    """Free for TCP and for UDP: a broker listens on both at its port (the heartbeats)."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _PortClaims:
    """Claims on ports across the processes of this machine (``PORT_CLAIMS_DIR``), held while
    the claiming process lives: a test session's brokers and a chaos run's, started side by
    side, each check that a port is free before binding it later (or again, at a restart),
    so each could pick the other's. Claims are taken under one ``flock``; a claim of a dead
    process is taken over. Where the directory cannot be used, no claims: ``_handed_out``
    alone, as before."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock_file: int | None = None

    def __enter__(self) -> "_PortClaims | None":
        try:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            self._lock_file = os.open(self.directory / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        except OSError:
            self._release()
            return None
        return self

    def __exit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        if self._lock_file is not None:
            os.close(self._lock_file)  # closing drops the flock
            self._lock_file = None

    def claim(self, port: int) -> bool:
        """Claim ``port`` for this process unless a live process (this one included) holds it."""
        path = self.directory / str(port)
        try:
            owner = int(path.read_text() or 0)
        except FileNotFoundError:
            owner = 0
        except (OSError, ValueError):
            return False
        if owner and _pid_alive(owner):
            return False
        try:
            path.write_text(str(os.getpid()))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free right now, and that an outgoing connection will not take later.

    Why not simply ``bind(0)``: that port comes from the kernel's ephemeral range, the same
    range every outgoing connection (a proxy's upstream, a ZooKeeper client) draws its
    local port from. A port chosen for a broker that starts later, or restarts at the
    same address, could be taken by such a connection in between, and the broker then
    fails to bind. So the port is drawn at random from outside the ephemeral range (and
    not one this process handed out before, nor one another live process of this machine
    claimed: ``_PortClaims``, as the test session and the chaos runs beside it each start
    brokers); ``bind(0)`` is the fallback when the range leaves no room. A process that
    does not claim may still bind it first: that is what the check at bind time is for.
    """
    low, high = _ephemeral_range()
    candidates = [(_LOWEST_PORT, low - 1), (high + 1, 65535)]
    candidates = [(a, b) for a, b in candidates if b - a >= 1000]
    with _PortClaims(PORT_CLAIMS_DIR) as claims:
        for _ in range(200 if candidates else 0):
            # Each range by its size: every port as likely as any other.
            a, b = random.choices(candidates, weights=[b - a + 1 for a, b in candidates])[0]
            port = random.randint(a, b)
            if port not in _handed_out and _bindable(host, port) and (claims is None or claims.claim(port)):
                _handed_out.add(port)
                return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def _port_in_use(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def four_letter_word(host: str, port: int, command: str, timeout: float = 1.0, *,
                     tls: "ssl.SSLContext | None" = None) -> str:
    """Send one of ZooKeeper's four-letter commands (ruok, srvr, stat, mntr...) and read the reply.

    ``tls``: the context to speak to a TLS-only port with (``ZkServerTls.probe_context``).
    """
    with socket.create_connection((host, port), timeout=timeout) as raw:
        sock = tls.wrap_socket(raw, server_hostname=host) if tls is not None else raw
        sock.sendall(command.encode("ascii"))
        chunks = []
        try:
            while chunk := sock.recv(4096):
                chunks.append(chunk)
        except ssl.SSLEOFError:
            pass  # the server closes after its reply without a TLS close_notify
    return b"".join(chunks).decode("utf-8", "replace")


def _kill_with_parent() -> None:
    """Runs in the child before exec: Linux sends it SIGKILL when the parent dies.

    So a test run that is itself killed does not leave JVMs behind. (The signal fires when
    the *thread* that forked exits, so start servers from a long-lived thread.)
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass  # not Linux: no safety net, stop() still works


@dataclass(frozen=True)
class Peer:
    """One ensemble member, as written in zoo.cfg: ``server.{id}={host}:{peer_port}:{election_port}``."""

    server_id: int
    host: str
    peer_port: int
    election_port: int

    def cfg_line(self) -> str:
        return f"server.{self.server_id}={self.host}:{self.peer_port}:{self.election_port}"


class EmbeddedZooKeeper(ChildProcess):
    """One ZooKeeper server JVM: ``start()``, ``stop()``, ``kill()``, ``pause()``/``resume()``.

    ``port=0`` picks a free port. Without ``data_dir`` a temporary directory is used and
    removed again by ``stop()``. Java's output goes to ``{data_dir}/zookeeper.log``.
    """

    def __init__(
        self,
        port: int = 0,
        data_dir: str | Path | None = None,
        tick_ms: int = 500,
        host: str = "127.0.0.1",
        *,
        min_session_timeout_ms: int | None = None,
        max_session_timeout_ms: int = 120_000,
        server_id: int | None = None,
        peers: list[Peer] | None = None,
        die_with_parent: bool = True,
        super_digest: str | None = None,
        command_prefix: Sequence[str] = (),
        max_client_connections: int = DEFAULT_MAX_CLIENT_CONNECTIONS,
        tls: ZkServerTls | None = None,
    ) -> None:
        self.host = host
        # Run the JVM through this (``ip netns exec NS``: it execs, so the pid is the JVM's).
        self.command_prefix = list(command_prefix)
        self.tick_ms = tick_ms
        self._requested_port = port
        self.port = port or free_port(host)
        # ZooKeeper's default floor is 2 ticks; keep it so tests can use short sessions.
        self.min_session_timeout_ms = min_session_timeout_ms or 2 * tick_ms
        # The default cap (20 ticks) would silently shorten sessions brokers ask for.
        self.max_session_timeout_ms = max_session_timeout_ms
        self.server_id = server_id
        self.peers = list(peers or [])
        self.die_with_parent = die_with_parent
        # "super:{base64 sha1}" (metaq.zk.acl.super_digest): a client logged in as "super" with
        # the matching password passes every ACL, the way out when a node is locked wrongly.
        self.super_digest = super_digest
        self.max_client_connections = max_client_connections
        # TLS only: ``port`` is then ZooKeeper's secureClientPort and there is no plaintext port.
        self.tls = tls
        self._probe_tls = tls.probe_context() if tls is not None else None
        self._owns_data_dir = data_dir is None
        # Absolute: the server runs with its data dir as cwd and is given zoo.cfg's path.
        self._data_dir_arg = Path(data_dir).absolute() if data_dir is not None else None
        self.data_dir: Path | None = self._data_dir_arg
        self._process: subprocess.Popen[bytes] | None = None
        self._log_handle = None
        self.start_seconds: float | None = None

    # --- properties ---------------------------------------------------------------------

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path | None:
        return self.data_dir / LOG_FILE_NAME if self.data_dir else None

    def log_text(self, last_lines: int | None = None) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return ""
        lines = path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-last_lines:] if last_lines else lines)

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.alive else "stopped"
        return f"EmbeddedZooKeeper({self.connect_string}, {state})"

    # --- configuration --------------------------------------------------------------------

    def _config_lines(self) -> list[str]:
        assert self.data_dir is not None
        lines = [
            f"tickTime={self.tick_ms}",
            f"dataDir={self.data_dir / 'data'}",
            *self._port_lines(),
            f"minSessionTimeout={self.min_session_timeout_ms}",
            f"maxSessionTimeout={self.max_session_timeout_ms}",
            # The admin server would take port 8080, which clashes between instances.
            "admin.enableServer=false",
            f"4lw.commands.whitelist={','.join(FOUR_LETTER_WORDS)}",
            f"maxClientCnxns={self.max_client_connections}",
            # Snapshots and logs are throwaway; don't let them pile up across a long run.
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
        ]
        if self.peers:
            lines += ["initLimit=10", "syncLimit=5"]
            lines += [peer.cfg_line() for peer in self.peers]
        return lines

    def _port_lines(self) -> list[str]:
        if self.tls is None:
            return [f"clientPort={self.port}", f"clientPortAddress={self.host}"]
        assert self.data_dir is not None
        # ZooKeeper reads a PEM key store as one file: key then certificate chain (0600, it holds the key).
        key_store = self.data_dir / "zk-keystore.pem"
        key_store.unlink(missing_ok=True)
        with open(key_store, "x", encoding="ascii", opener=private_opener) as handle:
            handle.write(self.tls.key_store_pem())
        # No clientPort line at all: nothing listens in clear, so no credential can cross in clear.
        lines = [
            f"secureClientPort={self.port}",
            f"secureClientPortAddress={self.host}",
            f"serverCnxnFactory={NETTY_FACTORY}",
            f"ssl.keyStore.location={key_store}",
            "ssl.keyStore.type=PEM",
            "ssl.protocol=TLSv1.2",
        ]
        if self.tls.client_ca_file:
            # Absolute: the JVM runs in the data directory, where a path relative to the
            # operator's directory (`--tls-client-ca ca.pem`) names nothing.
            trust_store = Path(self.tls.client_ca_file).resolve()
            lines += [f"ssl.trustStore.location={trust_store}", "ssl.trustStore.type=PEM", "ssl.clientAuth=need"]
        else:
            lines += ["ssl.clientAuth=none"]
        return lines

    def _write_config(self) -> Path:
        assert self.data_dir is not None
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        if self.peers:
            if self.server_id is None:
                raise ZooKeeperError("an ensemble member needs a server_id")
            (self.data_dir / "data" / "myid").write_text(f"{self.server_id}\n")
        config = self.data_dir / "zoo.cfg"
        config.write_text("\n".join(self._config_lines()) + "\n")
        return config

    @property
    def _secret_args_path(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir / SECRET_ARGS_FILE_NAME

    def _write_secret_args(self) -> list[str]:
        """``@FILE`` for the secret JVM options (none: no argument), so they stay off the command line."""
        if not self.super_digest:
            return []
        self._remove_secret_args()  # one left by a killed run: "x" below creates it afresh, 0600
        with open(self._secret_args_path, "x", encoding="ascii", opener=private_opener) as handle:
            handle.write(f"-Dzookeeper.DigestAuthenticationProvider.superDigest={self.super_digest}\n")
        return [f"@{self._secret_args_path}"]

    def _remove_secret_args(self) -> None:
        # The launcher read the file before the JVM started; a copy on disk only adds exposure.
        if self.data_dir is not None:
            self._secret_args_path.unlink(missing_ok=True)

    def _command(self, config: Path) -> list[str]:
        classpath = os.pathsep.join(find_zookeeper_classpath())
        return [
            *self.command_prefix,
            find_java(),
            *JVM_FLAGS,
            # The log4j2 binding from pyspark's jars logs only errors unless told otherwise.
            "-Dlog4j2.level=INFO",
            "-Dzookeeper.admin.enableServer=false",
            *self._write_secret_args(),
            "-cp",
            classpath,
            MAIN_CLASS,
            str(config),
        ]

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 30.0, wait: bool = True) -> "EmbeddedZooKeeper":
        """Launch the JVM and (with ``wait``) return once the server answers ``srvr`` with a mode.

        ``ruok`` alone is not enough: it says ``imok`` even while the server failed to
        load its database. An ensemble member cannot serve before a quorum is up, so
        start all members with ``wait=False`` and then ``wait_until_serving()`` on each.
        """
        if self.alive:
            raise ZooKeeperError(f"{self!r} is already running")
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="metaq-zk-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A port picked for us may have been taken meanwhile: then try another one.
        attempts = 3 if self._requested_port == 0 else 1
        for attempt in range(attempts):
            if _port_in_use(self.host, self.port):
                if attempt + 1 < attempts:
                    self.port = free_port(self.host)
                    continue
                raise ZooKeeperError(f"cannot start ZooKeeper: {self.connect_string} is already in use")
            try:
                self._launch()
                if wait:
                    self.wait_until_serving(timeout)
                return self
            except ZooKeeperError as exc:
                self._reap()
                self._remove_secret_args()
                address_in_use = "Address already in use" in self.log_text(last_lines=200)
                if not (address_in_use and attempt + 1 < attempts):
                    raise exc from None
                log.info("port %d was taken, retrying ZooKeeper on another port", self.port)
                self.port = free_port(self.host)
        return self  # unreachable: the loop either returns or raises

    def _launch(self) -> None:
        config = self._write_config()
        command = self._command(config)
        assert self.log_path is not None
        self._log_handle = open(self.log_path, "ab")
        self._started_at = time.monotonic()
        self._process = subprocess.Popen(
            command,
            cwd=self.data_dir,
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            # Own process group: a Ctrl-C meant for `metaq zk` reaches us, and we stop the
            # JVM in order instead of it dying half-way through a snapshot.
            start_new_session=True,
            preexec_fn=_kill_with_parent if self.die_with_parent else None,
        )
        log.debug("started ZooKeeper pid %d on %s", self._process.pid, self.connect_string)

    def wait_until_serving(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive:
                code = self._process.returncode if self._process else None
                raise ZooKeeperError(
                    f"ZooKeeper on {self.connect_string} exited with code {code} during start; "
                    f"log {self.log_path}:\n{self.log_text(last_lines=20)}"
                )
            if self.is_serving():
                self._remove_secret_args()
                self.start_seconds = time.monotonic() - self._started_at
                log.info("ZooKeeper serving on %s after %.2fs", self.connect_string, self.start_seconds)
                return
            if time.monotonic() > deadline:
                self.kill()
                raise ZooKeeperError(
                    f"ZooKeeper on {self.connect_string} did not start within {timeout:.0f}s; "
                    f"log {self.log_path}:\n{self.log_text(last_lines=20)}"
                )
            time.sleep(0.05)

    def is_serving(self) -> bool:
        """True when the server on our port is this instance (its dataDir is ours) and serving.

        The identity check matters: if another server holds the port, it would answer for us.
        """
        try:
            config = four_letter_word(self.host, self.port, "conf", timeout=0.5, tls=self._probe_tls)
            status = four_letter_word(self.host, self.port, "srvr", timeout=0.5, tls=self._probe_tls)
        except OSError:
            return False
        our_data_dir = f"dataDir={self.data_dir / 'data'}" if self.data_dir else None
        return bool(our_data_dir) and our_data_dir in config and "Mode:" in status

    def mode(self) -> str | None:
        """``standalone``, ``leader`` or ``follower``; None when not serving."""
        try:
            reply = four_letter_word(self.host, self.port, "srvr", timeout=0.5, tls=self._probe_tls)
        except OSError:
            return None
        match = re.search(r"^Mode: (\w+)", reply, re.MULTILINE)
        return match.group(1) if match else None

    def stop(self, grace: float = 10.0) -> int | None:  # type: ignore[override]
        """SIGTERM, then SIGKILL after ``grace`` seconds; a temporary data dir goes too. Idempotent."""
        code = super().stop(grace)
        self._remove_secret_args()
        if self._owns_data_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None
        return code

    def __enter__(self) -> "EmbeddedZooKeeper":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
