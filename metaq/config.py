"""Broker and slave configuration: MetaQ's ``server.ini`` and ``async_slave.properties``.

Both files keep MetaQ's key names so that operators can carry their configs over.
Every problem (unknown key, bad value, missing required key) raises ConfigError
naming the file, the section and the key, so ``metaq broker`` can print one clear
line instead of a traceback.
"""

from __future__ import annotations

import configparser
import os
import ipaddress
import re
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from .addresses import check_zk_connect, parse_host_port
from .cron import QuartzCron
from .delete_policy import parse_delete_policy
from .errors import MetaqError
from .txn import config as txn_config
from .txn.config import TxnSettings

DEFAULT_DELETE_POLICY = "delete,168"
#: A put frame carries at most 16 messages of maxMessageSize plus headers, and never more than 64 MiB.
MAX_PUT_BATCH_MESSAGES = 16
FRAME_OVERHEAD = 64 * 1024
MAX_REQUEST_BODY = 64 * 1024 * 1024


def max_request_body(max_message_size: int) -> int:
    """The largest request body a broker with this maxMessageSize reads (a bigger one is answered 400 and skipped)."""
    return min(MAX_REQUEST_BODY, max_message_size * MAX_PUT_BATCH_MESSAGES + FRAME_OVERHEAD)
DEFAULT_DELETE_WHEN = "0 0 6,18 * * ?"


class ConfigError(ValueError):
    """A configuration file or value is wrong; the message names the file and key."""


@dataclass(frozen=True)
class TopicConfig:
    """Per-topic storage settings; ``[system]`` gives the defaults, ``[topic=NAME]`` overrides."""

    name: str
    num_partitions: int = 1
    data_path: str = "data"
    unflush_threshold: int = 1000
    unflush_interval_ms: int = 10000
    max_segment_size: int = 1024 * 1024 * 1024
    max_transfer_size: int = 1024 * 1024
    delete_policy: str = DEFAULT_DELETE_POLICY
    delete_when: str = DEFAULT_DELETE_WHEN
    accept_publish: bool = True
    accept_subscribe: bool = True
    #: Which life of the topic this is (the group's topic configuration assigns one at each
    #: create, like Kafka's topic ids; "" for a topic from before incarnations or without ZooKeeper).
    incarnation: str = ""


# --- ZooKeeper TLS settings (broker, client and tools; used by metaq/zk/tls.py) ----------------

ENV_CA = "METAQ_ZK_TLS_CA"
ENV_CERT = "METAQ_ZK_TLS_CERT"
ENV_KEY = "METAQ_ZK_TLS_KEY"
ENV_VERIFY_HOSTNAME = "METAQ_ZK_TLS_VERIFY_HOSTNAME"


class ZkTlsError(MetaqError):
    """ZooKeeper TLS settings are unusable, or the TLS handshake with ZooKeeper failed."""


@dataclass(frozen=True)
class ZkTls:
    """How a client reaches ZooKeeper over TLS: the CA that signed the server, an optional
    client certificate (mutual TLS, for a server with ``ssl.clientAuth=need``), and whether
    the server's certificate must name the host in the connect string."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None
    verify_hostname: bool = True

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ZkTlsError("ZooKeeper TLS: a client certificate needs its key and a key its certificate (give both or neither)")
        for what, path in (("CA file", self.ca_file), ("certificate file", self.cert_file), ("key file", self.key_file)):
            if path and not os.path.isfile(path):
                raise ZkTlsError(f"ZooKeeper TLS: {what} {path} does not exist or is not a file")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ZkTls | None":
        """The settings named by METAQ_ZK_TLS_* (None when METAQ_ZK_TLS_CA is unset)."""
        env = os.environ if environ is None else environ
        ca = env.get(ENV_CA)
        if not ca:
            return None
        verify = env.get(ENV_VERIFY_HOSTNAME, "true").strip().lower()
        if verify not in ("true", "false", "1", "0", "yes", "no"):
            raise ZkTlsError(f"{ENV_VERIFY_HOSTNAME} must be true or false, got {verify!r}")
        return cls(ca, env.get(ENV_CERT) or None, env.get(ENV_KEY) or None, verify in ("true", "1", "yes"))

    def to_env(self) -> dict[str, str]:
        """The environment that makes a child process (a tool, a broker's helper) use these settings."""
        env = {ENV_CA: self.ca_file, ENV_VERIFY_HOSTNAME: "true" if self.verify_hostname else "false"}
        if self.cert_file and self.key_file:
            env.update({ENV_CERT: self.cert_file, ENV_KEY: self.key_file})
        return env

    def kazoo_kwargs(self) -> dict[str, Any]:
        # verify_certs stays on: a TLS link to an unverified server protects nothing.
        kwargs: dict[str, Any] = {"use_ssl": True, "ca": self.ca_file, "verify_certs": True,
                                  "check_hostname": self.verify_hostname}
        if self.cert_file:
            kwargs.update(certfile=self.cert_file, keyfile=self.key_file)
        return kwargs



@dataclass(frozen=True)
class ZkConfig:
    zk_connect: str = "127.0.0.1:2181"
    session_timeout_ms: int = 30000
    connection_timeout_ms: int = 30000
    sync_time_ms: int = 5000
    root: str = "/meta"
    # zk.zkEnable=false: a standalone broker that does not register (benchmarks, tests).
    enabled: bool = True
    # ZooKeeper over TLS (docs/security.md): set zk.zkTlsCaFile to turn it on; the cert and
    # key are for a server that wants client certificates (mutual TLS).
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_verify_hostname: bool = True

    @property
    def tls(self) -> "ZkTls | None":
        """The kazoo TLS settings (None: plaintext); the files were checked when the file was read."""
        if self.tls_ca_file is None:
            return None
        return ZkTls(self.tls_ca_file, self.tls_cert_file, self.tls_key_file, self.tls_verify_hostname)


@dataclass(frozen=True)
class SecurityConfig:
    """The ``[system]`` security keys; metaq/security turns them into authenticators and contexts.

    ``securityEnabled=true`` alone turns on client and replication authentication, ACLs
    and ZooKeeper ACLs (the files default to ``security.ini`` and ``group.secret`` beside
    server.ini). TLS is on when ``tlsCertFile`` and ``tlsKeyFile`` are set. Paths are only
    resolved here, not opened: a slave parses its master's server.ini too.
    """

    enabled: bool = False
    security_config: str = "security.ini"
    group_secret_file: str = "group.secret"
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None
    tls_client_auth: str = "none"
    tls_reload_interval_ms: int = 10_000

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert_file is not None


@dataclass(frozen=True)
class BrokerConfig:
    broker_id: int
    host_name: str = "127.0.0.1"
    server_port: int = 8123
    data_path: str = "data"
    zk: ZkConfig = field(default_factory=ZkConfig)
    topics: dict[str, TopicConfig] = field(default_factory=dict)
    # The [system] values every topic starts from (for topics learnt from a master).
    topic_defaults: TopicConfig = field(default_factory=lambda: TopicConfig(name=""))
    # Largest single message payload a put may carry.
    max_message_size: int = 1024 * 1024
    replication_mode: str = "async"
    min_sync_slaves: int = 1
    sync_slave_timeout_ms: int = 2000
    # Push each put's bytes to caught-up sync slaves (metaq/ha/stream.py) instead of their fetches.
    replication_stream: bool = False
    on_sync_slave_loss: str = "reject"
    auto_failover: bool = True
    # "host:port" that other brokers and clients are told to use (registered in
    # ZooKeeper) instead of hostName:serverPort: for NAT, proxies and fault injection.
    advertised_address: str | None = None
    # Bounded resources per broker and per connection (see docs/security.md, "Limits").
    # maxConnections: each connection is an open file, 5-7 KiB idle, and up to maxQueuedReplyBytes of replies
    # plus its share of maxBufferedRequestBytes; the broker's open-file limit must hold them all
    # beside its partitions (metaq/server/open_files.py refuses to start otherwise).
    max_connections: int = 1024
    max_requests_in_flight: int = 1000
    max_queued_reply_bytes: int = 16 * 1024 * 1024
    request_body_timeout_ms: int = 30_000
    connection_idle_timeout_ms: int = 600_000
    # Bytes of requests being received, all connections together (the frames that did not arrive in one read).
    max_buffered_request_bytes: int = 64 * 1024 * 1024
    # A connection that has not logged in (security on) within this is closed.
    login_timeout_ms: int = 10_000
    # Connections from one peer address (IP); past it that address's new connections are refused:
    # one host (a runaway client, a flood) cannot take every slot from the others.
    max_connections_per_address: int = 256
    # A master warns, counts (metaq_partitions_not_replicated) and lists in stats the partitions
    # a registered slave has not replicated for this long (metaq/server/replica_health.py).
    not_replicating_after_ms: int = 30_000
    # Background scrub of sealed segments (metaq/store/scrub.py): the pause between passes
    # (0: off) and the most it reads per second.
    scrub_interval_ms: int = 3_600_000
    scrub_bytes_per_second: int = 8 * 1024 * 1024
    source_path: str | None = None
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # MetaQ's transaction settings (maxCheckpoints, flushTxLogAtCommit, ...; metaq/txn/config.py).
    txn: TxnSettings = field(default_factory=TxnSettings)
    # CRC32 of the file's bytes, published as master_config_checksum.
    checksum: int = 0
    # The raw file, served to slaves for config auto-sync.
    raw: bytes = b""
    # Prometheus metrics over HTTP on this port (None: off; 0: a free port, logged).
    metrics_port: int | None = None
    # Where the metrics port listens: loopback unless the operator opens it (docs/operations.md, "Metrics").
    metrics_host: str = "127.0.0.1"
    # HTTP Basic login for scrapes (the password file is owner-only; None: no login) and HTTPS
    # with the broker's tlsCertFile/tlsKeyFile.
    metrics_user: str = "metrics"
    metrics_password_file: str | None = None
    metrics_tls: bool = False
    # Logging (metaq/logsetup.py); None: as the command line set it (stderr, text, INFO).
    log_file: str | None = None
    log_format: str | None = None
    log_level: str | None = None
    log_max_bytes: int = 100 * 1024 * 1024
    log_backup_count: int = 5

    def topic(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)

    @property
    def max_request_body(self) -> int:
        return max_request_body(self.max_message_size)


@dataclass(frozen=True)
class SlaveConfig:
    slave_id: int
    slave_group: str
    slave_max_delay_ms: int = 500
    auto_sync_master_config: bool = True


# --- value parsers ---------------------------------------------------------------


def _int(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be <= {maximum}, got {value}")
        return value

    return parse


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return value

    return parse


def _text(text: str) -> str:
    value = text.strip()
    if not value:
        raise ValueError("must not be empty")
    return value


def _delete_policy(text: str) -> str:
    """Parsed by retention's own parser, so that a value it could not run (``delete,5,true``: the
    third field is archive's alone) is refused with the file or `metaq topics alter`, not by each
    broker's retention scheduler afterwards."""
    value = text.strip()
    try:
        parse_delete_policy(value)
    except ValueError:
        raise ValueError(f"expected 'delete,N[s|m|h]' or 'archive,N[s|m|h][,true|false]', got {text!r}") from None
    return value


def _delete_when(text: str) -> str:
    """A Quartz cron expression, parsed here as retention will parse it: a value it would
    refuse (an hour 25, ``L``) is refused with the file, not by the retention scheduler after
    the rest of a reload was applied."""
    value = text.strip()
    if len(value.split()) not in (6, 7):
        raise ValueError(f"expected a 6-field Quartz cron expression, got {text!r}")
    QuartzCron(value)  # ValueError naming the field and the value
    return value


def check_zk_root(text: str) -> str:
    """A ZooKeeper root (``zk.zkRoot``, ``--zk-root``), stripped; ValueError naming what is wrong.

    Absolute, and no ``.`` or ``..`` component: kazoo refuses those in every call it makes,
    so one that got through failed with a traceback at a broker's start or a tool's first read.
    """
    value = text.strip()
    if not value.startswith("/"):
        raise ValueError(f"must start with '/', got {text!r}")
    if any(part in (".", "..") for part in value.split("/")):
        raise ValueError(f"must not have a '.' or '..' component, got {text!r}")
    return value


def _host_port(text: str) -> str:
    parse_host_port(text)  # raises ValueError naming the text
    return text.strip()


#: A topic name becomes a directory name and a ZooKeeper node name: kept short and plain.
TOPIC_NAME_MAX = 200


def _topic_name(text: str) -> str:
    if not text:
        raise ValueError("topic name is empty")
    if len(text) > TOPIC_NAME_MAX:
        raise ValueError(f"topic name {text[:20]!r}... is {len(text)} characters long; at most {TOPIC_NAME_MAX}")
    if not re.fullmatch(r"[A-Za-z0-9._\-]+", text):
        raise ValueError(f"topic name {text!r} may only use letters, digits, '.', '_' and '-'")
    if text in (".", ".."):
        # ZooKeeper refuses them as node names (as Kafka does as topic names).
        raise ValueError(f"topic name {text!r} is not allowed")
    return text


def check_topic_name(name: object) -> str:
    """The ``[topic=NAME]`` rule for a name from anywhere else (a peer's reply): ValueError if it breaks it.

    A topic name becomes a directory name: no separators, no ``..``, ever.
    """
    if not isinstance(name, str):
        raise ValueError(f"topic name must be a string, got {type(name).__name__}")
    return _topic_name(name)


# Topic-level keys, allowed in [system] (as defaults) and in [topic=NAME].
_TOPIC_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "numPartitions": ("num_partitions", _int(1)),
    "dataPath": ("data_path", _text),
    "unflushThreshold": ("unflush_threshold", _int(0)),
    "unflushInterval": ("unflush_interval_ms", _int(1)),
    "maxSegmentSize": ("max_segment_size", _int(1024)),
    "maxTransferSize": ("max_transfer_size", _int(1024)),
    "deletePolicy": ("delete_policy", _delete_policy),
    "deleteWhen": ("delete_when", _delete_when),
    "acceptPublish": ("accept_publish", _bool),
    "acceptSubscribe": ("accept_subscribe", _bool),
}

#: The topic keys a broker group's shared topic configuration may set: every topic key
#: but ``dataPath``, which names a directory on each broker's own disk.
SHARED_TOPIC_KEYS = tuple(key for key in _TOPIC_KEYS if key != "dataPath")


def setting_text(value: Any) -> str:
    """A setting as MetaQ spells it in server.ini (booleans in lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def topic_settings(topic: TopicConfig) -> dict[str, str]:
    """A topic's shared settings under MetaQ key names, as server.ini text."""
    return {key: setting_text(getattr(topic, _TOPIC_KEYS[key][0])) for key in SHARED_TOPIC_KEYS}


def topic_from_settings(base: TopicConfig, name: str, settings: dict[str, Any], where: str) -> TopicConfig:
    """``base`` (a broker's ``[system]`` defaults, its dataPath) with ``settings`` applied.

    Every value is checked by the same parser as in server.ini; a bad one raises
    ConfigError naming ``where`` and the key.
    """
    values: dict[str, Any] = {}
    for key, raw in settings.items():
        if key not in SHARED_TOPIC_KEYS:
            raise ConfigError(f"{where}: topic {name}: {key}: not a shared topic key (one of {', '.join(SHARED_TOPIC_KEYS)})")
        attr, parse = _TOPIC_KEYS[key]
        values[attr] = _convert(where, f"topic={name}", key, setting_text(raw), parse)
    return replace(base, name=name, **values)


# [system]-only keys.
_SYSTEM_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "brokerId": ("broker_id", _int(0)),
    "hostName": ("host_name", _text),
    # A TCP port: 0 picks a free one; above 65535 the OS would silently wrap it.
    "serverPort": ("server_port", _int(0, 65535)),
    "metricsPort": ("metrics_port", _int(0, 65535)),
    "metricsHost": ("metrics_host", _text),
    "metricsUser": ("metrics_user", _text),
    "metricsPasswordFile": ("metrics_password_file", _text),
    "metricsTls": ("metrics_tls", _bool),
    "logFile": ("log_file", _text),
    "logFormat": ("log_format", _choice("text", "json")),
    "logLevel": ("log_level", _choice("DEBUG", "INFO", "WARNING", "ERROR")),
    "logMaxBytes": ("log_max_bytes", _int(0)),
    "logBackupCount": ("log_backup_count", _int(0)),
    "maxMessageSize": ("max_message_size", _int(1)),
    "replicationMode": ("replication_mode", _choice("async", "sync")),
    "minSyncSlaves": ("min_sync_slaves", _int(0)),
    "syncSlaveTimeoutMs": ("sync_slave_timeout_ms", _int(1)),
    "replicationStream": ("replication_stream", _bool),
    "onSyncSlaveLoss": ("on_sync_slave_loss", _choice("reject", "degrade")),
    "autoFailover": ("auto_failover", _bool),
    "advertisedAddress": ("advertised_address", _host_port),
    "maxConnections": ("max_connections", _int(1)),
    "maxRequestsInFlight": ("max_requests_in_flight", _int(1)),
    "maxQueuedReplyBytes": ("max_queued_reply_bytes", _int(64 * 1024)),
    "requestBodyTimeoutMs": ("request_body_timeout_ms", _int(100)),
    "connectionIdleTimeoutMs": ("connection_idle_timeout_ms", _int(0)),
    "maxBufferedRequestBytes": ("max_buffered_request_bytes", _int(64 * 1024)),
    "loginTimeoutMs": ("login_timeout_ms", _int(100)),
    "maxConnectionsPerAddress": ("max_connections_per_address", _int(1)),
    "notReplicatingAfterMs": ("not_replicating_after_ms", _int(1000)),
    "scrubIntervalMs": ("scrub_interval_ms", _int(0)),
    "scrubBytesPerSecond": ("scrub_bytes_per_second", _int(1024)),
}

# [system] security keys -> SecurityConfig fields.
_SECURITY_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "securityEnabled": ("enabled", _bool),
    "securityConfig": ("security_config", _text),
    "groupSecretFile": ("group_secret_file", _text),
    "tlsCertFile": ("tls_cert_file", _text),
    "tlsKeyFile": ("tls_key_file", _text),
    "tlsCaFile": ("tls_ca_file", _text),
    "tlsClientAuth": ("tls_client_auth", _choice("none", "optional", "required")),
    "tlsReloadIntervalMs": ("tls_reload_interval_ms", _int(0)),
}
_SECURITY_PATH_FIELDS = ("security_config", "group_secret_file", "tls_cert_file", "tls_key_file", "tls_ca_file")

_ZK_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "zk.zkConnect": ("zk_connect", lambda text: check_zk_connect(_text(text))),
    "zk.zkSessionTimeoutMs": ("session_timeout_ms", _int(400)),  # 400: two ticks of a 200 ms ZooKeeper; failover < 1 s needs < 1000
    "zk.zkConnectionTimeoutMs": ("connection_timeout_ms", _int(100)),
    "zk.zkSyncTimeMs": ("sync_time_ms", _int(0)),
    "zk.zkRoot": ("root", check_zk_root),
    "zk.zkEnable": ("enabled", _bool),
    "zk.zkTlsCaFile": ("tls_ca_file", _text),
    "zk.zkTlsCertFile": ("tls_cert_file", _text),
    "zk.zkTlsKeyFile": ("tls_key_file", _text),
    "zk.zkTlsVerifyHostname": ("tls_verify_hostname", _bool),
}
_ZK_TLS_PATH_KEYS = {"tls_ca_file": "zk.zkTlsCaFile", "tls_cert_file": "zk.zkTlsCertFile", "tls_key_file": "zk.zkTlsKeyFile"}

# Keys MetaQ accepts that this broker reads but does not act on; kept so that a
# MetaQ server.ini loads unchanged.
_IGNORED_SYSTEM_KEYS = {
    "dashboardHttpPort",
    "getProcessThreadCount",
    "putProcessThreadCount",
    "statTopicSet",
    "appClassPath",
    "quartzThreadCount",
    "slaveId",
    "stat",
    "updateConsumerOffsets",
    "loadMessageStoresInParallel",
}


def _convert(path: str, section: str | None, key: str, raw: str, parse: Callable[[str], Any]) -> Any:
    try:
        return parse(raw)
    except ValueError as exc:
        where = f"[{section}] {key}" if section else key
        raise ConfigError(f"{path}: {where}: {exc}") from None


def _read_ini(text: str, path: str) -> configparser.ConfigParser:
    # MetaQ's files carry trailing comments (``brokerId=0 ; the master's id``): a ';'
    # or '#' after whitespace ends the value, as in Java's ini4j.
    parser = configparser.ConfigParser(
        interpolation=None, strict=True, delimiters=("=",), inline_comment_prefixes=(";", "#")
    )
    parser.optionxform = str  # MetaQ keys are camelCase
    try:
        parser.read_string(text, source=path)
    except configparser.MissingSectionHeaderError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: {exc.line.strip()!r} comes before any section (the file starts with [system])") from None
    except configparser.Error as exc:
        message = exc.message if hasattr(exc, "message") else str(exc)
        raise ConfigError(f"{path}: not a valid INI file: {' '.join(message.split())}") from None
    return parser


def parse_server_ini(data: bytes, path: str = "server.ini") -> BrokerConfig:
    """Parse the bytes of a server.ini into a BrokerConfig (raises ConfigError)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    parser = _read_ini(text, path)
    if not parser.has_section("system"):
        raise ConfigError(f"{path}: missing section [system]")

    system: dict[str, Any] = {}
    topic_defaults: dict[str, Any] = {}
    security: dict[str, Any] = {}
    txn: dict[str, Any] = {}
    for key, raw in parser.items("system"):
        if key in _SECURITY_KEYS:
            name, parse = _SECURITY_KEYS[key]
            security[name] = _convert(path, "system", key, raw, parse)
        elif key in txn_config.KEYS:
            name, parse = txn_config.KEYS[key]
            txn[name] = _convert(path, "system", key, raw, parse)
        elif key in _SYSTEM_KEYS:
            name, parse = _SYSTEM_KEYS[key]
            system[name] = _convert(path, "system", key, raw, parse)
        elif key in _TOPIC_KEYS:
            name, parse = _TOPIC_KEYS[key]
            topic_defaults[name] = _convert(path, "system", key, raw, parse)
        elif key not in _IGNORED_SYSTEM_KEYS:
            raise ConfigError(f"{path}: [system] {key}: unknown key")
    if "broker_id" not in system:
        raise ConfigError(f"{path}: [system] brokerId: required key is missing")
    if system["broker_id"] > 1023:
        raise ConfigError(f"{path}: [system] brokerId: must be <= 1023, got {system['broker_id']}")

    zk: dict[str, Any] = {}
    if parser.has_section("zookeeper"):
        for key, raw in parser.items("zookeeper"):
            if key not in _ZK_KEYS:
                raise ConfigError(f"{path}: [zookeeper] {key}: unknown key")
            name, parse = _ZK_KEYS[key]
            zk[name] = _convert(path, "zookeeper", key, raw, parse)
    zk_config = _zk_config(zk, path)

    log_file = system.get("log_file")
    if log_file and not Path(log_file).is_absolute() and Path(path).parent != Path(""):
        system["log_file"] = str(Path(path).parent / log_file)  # like dataPath: beside the file

    data_path = topic_defaults.get("data_path", "data")
    if not Path(data_path).is_absolute() and path and Path(path).parent != Path(""):
        # Relative data paths are relative to the config file, not the cwd.
        topic_defaults["data_path"] = str(Path(path).parent / data_path)
    default_topic = TopicConfig(name="", **topic_defaults)

    topics: dict[str, TopicConfig] = {}
    for section in parser.sections():
        if section in ("system", "zookeeper"):
            continue
        if not section.startswith("topic="):
            raise ConfigError(f"{path}: [{section}]: unknown section (expected [system], [zookeeper] or [topic=NAME])")
        name = _convert(path, section, "topic", section[len("topic=") :], _topic_name)
        overrides: dict[str, Any] = {}
        for key, raw in parser.items(section):
            if key not in _TOPIC_KEYS:
                if key in ("stat", "group"):  # MetaQ per-topic keys with no meaning here
                    continue
                raise ConfigError(f"{path}: [{section}] {key}: unknown key")
            attr, parse = _TOPIC_KEYS[key]
            overrides[attr] = _convert(path, section, key, raw, parse)
        if "data_path" in overrides and not Path(overrides["data_path"]).is_absolute() and Path(path).parent != Path(""):
            overrides["data_path"] = str(Path(path).parent / overrides["data_path"])
        topics[name] = replace(default_topic, name=name, **overrides)

    mode = system.get("replication_mode", "async")
    if mode == "sync" and system.get("min_sync_slaves", 1) < 1:
        raise ConfigError(f"{path}: [system] minSyncSlaves: must be >= 1 in sync mode")
    if system.get("replication_stream") and mode != "sync":
        # Only sync slaves report positions as they append; an async slave fetches in batches.
        raise ConfigError(f"{path}: [system] replicationStream: needs replicationMode=sync")

    budget = system.get("max_buffered_request_bytes", BrokerConfig.max_buffered_request_bytes)
    largest = max_request_body(system.get("max_message_size", BrokerConfig.max_message_size))
    if budget < largest:
        # Else the largest put could never be received: it would be refused on every try.
        raise ConfigError(
            f"{path}: [system] maxBufferedRequestBytes: must be >= the largest request body, {largest} bytes "
            f"(maxMessageSize x {MAX_PUT_BATCH_MESSAGES} + {FRAME_OVERHEAD}, at most {MAX_REQUEST_BODY}), got {budget}"
        )

    _check_metrics_access(system, security, path)
    password_file = system.get("metrics_password_file")
    if password_file and not Path(password_file).is_absolute() and Path(path).parent != Path(""):
        system["metrics_password_file"] = str(Path(path).parent / password_file)  # like dataPath: beside the file

    data_log_path = txn.get("data_log_path")
    if data_log_path and not Path(data_log_path).is_absolute() and Path(path).parent != Path(""):
        txn["data_log_path"] = str(Path(path).parent / data_log_path)  # like dataPath: beside the file

    return BrokerConfig(
        data_path=default_topic.data_path,
        security=_security_config(security, path),
        txn=TxnSettings(**txn),
        zk=zk_config,
        topics=topics,
        topic_defaults=default_topic,
        source_path=path,
        checksum=zlib.crc32(data),
        raw=bytes(data),
        **system,
    )


def _check_metrics_access(system: dict[str, Any], security: dict[str, Any], path: str) -> None:
    """The metrics port's access rules: with security on, a port other hosts can reach needs a login and TLS."""
    if system.get("metrics_tls") and "tls_cert_file" not in security:
        raise ConfigError(f"{path}: [system] metricsTls: needs TLS on (set tlsCertFile and tlsKeyFile)")
    if system.get("metrics_port") is None or not security.get("enabled") or is_loopback(system.get("metrics_host", "127.0.0.1")):
        return
    # Else anyone who reaches the port reads topic names, traffic and roles without logging in,
    # and a Basic login sent in the clear is as good as none.
    if not system.get("metrics_password_file") or not system.get("metrics_tls"):
        raise ConfigError(
            f"{path}: [system] metricsHost: {system['metrics_host']} is reachable from other hosts; with securityEnabled "
            "that needs metricsPasswordFile (a login) and metricsTls=true (HTTPS), or a loopback metricsHost"
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine (a name other than localhost counts as not)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _security_config(values: dict[str, Any], path: str) -> SecurityConfig:
    """The security keys, with their cross-key rules checked and paths made relative to the file."""
    if ("tls_cert_file" in values) != ("tls_key_file" in values):
        present, missing = ("tlsCertFile", "tlsKeyFile") if "tls_cert_file" in values else ("tlsKeyFile", "tlsCertFile")
        raise ConfigError(f"{path}: [system] {missing}: required when {present} is set")
    if values.get("tls_client_auth", "none") != "none" and "tls_ca_file" not in values:
        raise ConfigError(f"{path}: [system] tlsCaFile: required when tlsClientAuth is not none (it verifies client certificates)")
    if values.get("tls_client_auth", "none") != "none" and "tls_cert_file" not in values:
        raise ConfigError(f"{path}: [system] tlsClientAuth: needs TLS on (set tlsCertFile and tlsKeyFile)")
    base = Path(path).parent
    for name in _SECURITY_PATH_FIELDS:
        value = values.get(name, getattr(SecurityConfig, name))
        if value is not None and not Path(value).is_absolute() and base != Path(""):
            values[name] = str(base / value)
    return SecurityConfig(**values)


def _zk_config(values: dict[str, Any], path: str) -> ZkConfig:
    """The [zookeeper] keys, TLS files made relative to the config file and checked now (not at first connect)."""
    base = Path(path).parent
    for name, key in _ZK_TLS_PATH_KEYS.items():
        if name in values and not Path(values[name]).is_absolute() and base != Path(""):
            values[name] = str(base / values[name])
    if "tls_ca_file" not in values and any(name in values for name in ("tls_cert_file", "tls_key_file")):
        raise ConfigError(f"{path}: [zookeeper] zk.zkTlsCaFile: required when zk.zkTlsCertFile or zk.zkTlsKeyFile is set "
                          "(it turns ZooKeeper TLS on)")
    config = ZkConfig(**values)
    try:
        config.tls
    except ZkTlsError as exc:
        raise ConfigError(f"{path}: [zookeeper] {exc}") from None
    return config


def load_server_ini(path: str | Path) -> BrokerConfig:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_server_ini(data, str(path))


def _read_properties(text: str) -> dict[str, str]:
    """Java .properties, the subset MetaQ's files use: key=value or key: value, # and ! comments
    (and ``;``, as in server.ini, so one comment style serves both files)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped[0] in "#!;":
            continue
        # A trailing comment after whitespace (``slaveId=0   # unique``, ``slaveId=0 ; unique``),
        # as in server.ini: docs/operations.md promises the same rule for both files.
        stripped = re.sub(r"\s+[#!;].*$", "", stripped)
        match = re.match(r"^([^=:\s]+)\s*[=:\s]\s*(.*)$", stripped)
        if not match:
            values[stripped] = ""
            continue
        values[match.group(1)] = match.group(2).strip()
    return values


def parse_slave_properties(text: str, path: str = "async_slave.properties") -> SlaveConfig:
    values = _read_properties(text)
    known = {"slaveId", "slaveGroup", "slaveMaxDelayInMills", "autoSyncMasterConfig"}
    for key in values:
        if key not in known:
            raise ConfigError(f"{path}: {key}: unknown key (expected one of {', '.join(sorted(known))})")
    if "slaveId" not in values or not values["slaveId"]:
        raise ConfigError(f"{path}: slaveId: required key is missing")
    slave_id = _convert(path, None, "slaveId", values["slaveId"], _int(0))
    group = values.get("slaveGroup", "").strip() or f"meta-slave-group_{slave_id}"
    delay = _convert(path, None, "slaveMaxDelayInMills", values.get("slaveMaxDelayInMills", "500"), _int(0))
    auto_sync = _convert(path, None, "autoSyncMasterConfig", values.get("autoSyncMasterConfig", "true"), _bool)
    return SlaveConfig(slave_id=slave_id, slave_group=group, slave_max_delay_ms=delay, auto_sync_master_config=auto_sync)


def load_slave_properties(path: str | Path) -> SlaveConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse_slave_properties(text, str(path))


def changed_keys(old: BrokerConfig, new: BrokerConfig) -> list[str]:
    """The ``[system]`` and ``[zookeeper]`` keys (MetaQ names) whose values differ.

    Topic keys in ``[system]`` compare the topic defaults; ``[topic=NAME]`` sections
    are not included (a reload compares topics itself).
    """
    keys = [key for key, (attr, _) in _SYSTEM_KEYS.items() if getattr(old, attr) != getattr(new, attr)]
    keys += [key for key, (attr, _) in _TOPIC_KEYS.items() if getattr(old.topic_defaults, attr) != getattr(new.topic_defaults, attr)]
    keys += [key for key, (attr, _) in _ZK_KEYS.items() if getattr(old.zk, attr) != getattr(new.zk, attr)]
    keys += [key for key, (attr, _) in _SECURITY_KEYS.items() if getattr(old.security, attr) != getattr(new.security, attr)]
    keys += [key for key, (attr, _) in txn_config.KEYS.items() if getattr(old.txn, attr) != getattr(new.txn, attr)]
    return keys
