"""Prometheus metrics of one broker over HTTP (``[system] metricsPort``; off when unset).

Built on ``prometheus-client``: a registry of its own per broker, served by the
library's WSGI app on ``metricsHost:metricsPort`` (loopback unless the operator opens it),
behind an HTTP Basic login when ``metricsPasswordFile`` is set and over HTTPS with
``metricsTls`` (the broker's own certificate, reloaded with it). Counters and gauges are read from
the broker's own state at scrape time (``BrokerCollector``), so nothing on the hot
path changes for them; the latency histograms are fed by ``InstrumentedHandlers``
(wrapping the request handlers the connections call) and by the store's fsync hook.

Series (all prefixed ``metaq_``): see docs/operations.md, "Metrics".
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import inspect
import logging
import socket
import ssl
import threading
import time
from functools import partial
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Iterator, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..config import BrokerConfig, ConfigError
from ..deferred import Deferred
from ..security.errors import SecurityError
from ..security.files import read_private
from ..store.timeindex import REBUILDS as time_index_rebuilds
from .stats import REFUSAL_KINDS

if TYPE_CHECKING:
    from ..ha.node import HaNode
    from ..store.manager import MessageStoreManager
    from ..store.scrub import Scrubber
    from .admission import ConnectionSlots, RequestBudget
    from .registry import BrokerRegistry
    from .replica_health import ReplicaCoverage
    from .stats import BrokerStats


log = logging.getLogger(__name__)

#: Seconds; from a fast in-memory ack to a slow sync replication wait.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ROLES = ("master", "slave", "starting", "following", "orphaned", "electing", "resigned", "fenced", "stopped")
ZK_STATES = ("CONNECTED", "SUSPENDED", "LOST")
#: A scrape waits this long for the event loop to read the broker's state.
SCRAPE_TIMEOUT_S = 5.0


class MeasuredBroker(Protocol):
    """What a scrape reads of the broker (metaq.server.broker.Broker), and nothing more
    (tests/unit/test_broker_protocols.py holds this module to it)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def stats(self) -> BrokerStats: ...

    @property
    def slots(self) -> ConnectionSlots: ...

    @property
    def request_budget(self) -> RequestBudget: ...

    @property
    def ha(self) -> HaNode: ...

    @property
    def scrubber(self) -> Scrubber: ...

    @property
    def store(self) -> MessageStoreManager: ...

    @property
    def registry(self) -> BrokerRegistry | None: ...

    @property
    def replica_coverage(self) -> ReplicaCoverage: ...


class BrokerMetrics:
    def __init__(self, broker: MeasuredBroker) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.request_seconds = Histogram(
            "metaq_request_seconds", "Time from a put or get request to its reply (puts: including the durability wait)",
            ["op"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.fsync_seconds = Histogram(
            "metaq_fsync_seconds", "Time one fsync of a partition log took", buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.rejected_puts = Counter(
            "metaq_put_rejected", "Puts answered with an error, by result code", ["code"], registry=self.registry
        )
        # The children of the timed ops, looked up once: ``labels()`` per request costs a
        # lock and a dict lookup on every put and get.
        self._request_seconds_of = {op: self.request_seconds.labels(op) for op in InstrumentedHandlers.TIMED}
        self.collector = BrokerCollector(broker)
        self.registry.register(self.collector)
        self._server: Any = None
        self.port: int | None = None

    def start(self, host: str, port: int, *, login: tuple[str, str] | None = None, tls: ssl.SSLContext | None = None) -> int:
        """Serve on ``host:port`` (in threads of its own); with ``login`` every scrape needs it, with ``tls`` over HTTPS."""
        self.collector.loop = asyncio.get_running_loop()
        app = make_wsgi_app(self.registry)
        if login is not None:
            app = _require_login(app, *login)
        server_class = type("MetricsServer", (_MetricsServer,), {"address_family": _address_family(host, port)})
        server = make_server(host, port, app, server_class, handler_class=_MetricsRequest)
        if tls is not None:
            # The handshake happens in the request's own thread (with its timeout), not in accept():
            # a client that never finishes one must not stall the next scrape.
            server.socket = tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        threading.Thread(target=server.serve_forever, name="metaq-metrics", daemon=True).start()
        self._server = server
        self.port = server.server_address[1]
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def observe_reply(self, op: str, started: float, reply: Any) -> None:
        self._request_seconds_of[op].observe(time.perf_counter() - started)
        if op == "put" and isinstance(reply, tuple) and isinstance(reply[0], dict):
            code = reply[0].get("code")
            if code is not None and code != 200:
                self.rejected_puts.labels(str(code)).inc()


def metrics_login(config: BrokerConfig) -> tuple[str, str] | None:
    """(user, password) scrapes must send, from ``metricsPasswordFile`` (owner-only); None without one."""
    if config.metrics_password_file is None:
        return None
    try:
        password = read_private(config.metrics_password_file, "metricsPasswordFile").decode("utf-8").strip()
    except (SecurityError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{config.source_path}: [system] metricsPasswordFile: {exc}") from None
    if not password:
        raise ConfigError(f"{config.source_path}: [system] metricsPasswordFile: {config.metrics_password_file} is empty")
    return config.metrics_user, password


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _require_login(app: WsgiApp, user: str, password: str) -> WsgiApp:
    """``app`` behind HTTP Basic: anything but ``user:password`` gets 401 (compared in constant time)."""
    expected = hashlib.sha256(b"Basic " + base64.b64encode(f"{user}:{password}".encode())).digest()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        offered = hashlib.sha256(environ.get("HTTP_AUTHORIZATION", "").strip().encode("latin-1", "replace")).digest()
        if not hmac.compare_digest(offered, expected):
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="metaq metrics"'), ("Content-Type", "text/plain")])
            return [b"authentication required\n"]
        return app(environ, start_response)

    return guarded


def _address_family(host: str, port: int) -> socket.AddressFamily:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]


class _MetricsServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up or failed its TLS handshake: nothing for the broker's log at INFO.
        log.debug("metrics: request from %s failed", client_address, exc_info=True)


class _MetricsRequest(WSGIRequestHandler):
    timeout = 10  # seconds a client may take for its handshake and request

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        pass  # one line per scrape would drown the broker's log


class InstrumentedHandlers:
    """The request handlers as the connections see them, with puts and gets timed."""

    TIMED = ("put", "get")

    def __init__(self, handlers: Any, metrics: BrokerMetrics) -> None:
        self._handlers = handlers
        self._metrics = metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handlers, name)

    def handle(self, req: Any, ctx: Any) -> Any:
        if req.op not in self.TIMED:
            return self._handlers.handle(req, ctx)
        started = time.perf_counter()
        result = self._handlers.handle(req, ctx)
        if isinstance(result, Deferred):
            return result.then(partial(self._observed, req.op, started))
        if inspect.isawaitable(result):
            return self._timed(req.op, started, result)
        self._metrics.observe_reply(req.op, started, result)
        return result

    def _observed(self, op: str, started: float, done: Deferred[Any]) -> Any:
        reply = done.result()
        self._metrics.observe_reply(op, started, reply)
        return reply

    async def _timed(self, op: str, started: float, result: Awaitable[Any]) -> Any:
        reply = await result
        self._metrics.observe_reply(op, started, reply)
        return reply


class BrokerCollector(Collector):
    """Counters and gauges read from the broker when Prometheus scrapes.

    The HTTP server runs in its own thread; the broker's state belongs to the event
    loop, so the values are read there (a scrape never sees a dict mid-update).
    """

    def __init__(self, broker: MeasuredBroker) -> None:
        self.broker = broker
        self.loop: asyncio.AbstractEventLoop | None = None

    def collect(self) -> Iterator[Any]:
        loop = self.loop
        if loop is None or loop.is_closed():
            return iter(())

        async def on_loop() -> list[Any]:
            return list(self._families())

        return iter(asyncio.run_coroutine_threadsafe(on_loop(), loop).result(SCRAPE_TIMEOUT_S))

    def _families(self) -> Iterator[Any]:
        broker = self.broker
        yield from self._traffic()
        yield _one(GaugeMetricFamily, "metaq_connections", "Client connections open now", broker.stats.connections)
        yield _one(CounterMetricFamily, "metaq_connections_opened", "Client connections accepted since start", broker.stats.total_connections)
        yield _one(GaugeMetricFamily, "metaq_connections_not_logged_in",
                   "Connections open now that have not logged in (security on)", broker.slots.not_logged_in)
        yield _one(GaugeMetricFamily, "metaq_buffered_request_bytes",
                   "Bytes of requests being received now (limit: maxBufferedRequestBytes)", broker.request_budget.held)
        refusals = CounterMetricFamily(
            "metaq_refusals", "Connections and requests refused or closed to bound the broker's connections and memory",
            labels=["reason"],
        )
        for kind in REFUSAL_KINDS:
            refusals.add_metric([kind], broker.stats.refusals[kind])
        yield refusals
        role = GaugeMetricFamily("metaq_role", "1 for the role this broker has now", labels=["role"])
        current = broker.ha.role_name
        current = "slave" if current.startswith("slave") else current  # slave{k}: the id is not a role
        for name in ROLES if current in ROLES else (*ROLES, current):
            role.add_metric([name], 1.0 if name == current else 0.0)
        yield role
        yield _one(GaugeMetricFamily, "metaq_epoch", "The master epoch this broker serves in", broker.ha.epoch)
        scrub = broker.scrubber.stats
        yield _one(CounterMetricFamily, "metaq_scrub_bytes", "Bytes of sealed segments the scrub re-verified", scrub.bytes_checked)
        yield _one(CounterMetricFamily, "metaq_scrub_corrupt_ranges",
                   "Corrupt byte ranges the scrub found (never served; a slave re-fetches them)", scrub.corrupt_ranges)
        yield _one(CounterMetricFamily, "metaq_time_index_rebuilds",
                   "Segment time index files found missing, torn or corrupt and rebuilt from their segment",
                   time_index_rebuilds.total)
        yield from self._replication()
        yield self._zookeeper()

    def _traffic(self) -> Iterator[Any]:
        families = {
            "put_messages": CounterMetricFamily("metaq_put_messages", "Messages appended by puts", labels=["topic"]),
            "put_bytes": CounterMetricFamily("metaq_put_bytes", "Bytes appended by puts", labels=["topic"]),
            "put_failed": CounterMetricFamily("metaq_put_failed_messages", "Messages of puts that failed validation or append", labels=["topic"]),
            "get_requests": CounterMetricFamily("metaq_get_requests", "Consumer fetches", labels=["topic"]),
            "get_bytes": CounterMetricFamily("metaq_get_bytes", "Bytes sent to consumers", labels=["topic"]),
            "get_miss": CounterMetricFamily("metaq_get_miss", "Consumer fetches that found nothing new", labels=["topic"]),
            "replica_get_bytes": CounterMetricFamily("metaq_replica_get_bytes", "Bytes sent to replicating slaves", labels=["topic"]),
        }
        for topic, counters in sorted(self.broker.stats.topic_totals().items()):
            for name, family in families.items():
                family.add_metric([topic], getattr(counters, name))
        yield from families.values()

    def _replication(self) -> Iterator[Any]:
        broker = self.broker
        lag_bytes = GaugeMetricFamily("metaq_replication_lag_bytes", "Bytes a slave is behind this master", labels=["slave", "topic", "partition"])
        lag_messages = GaugeMetricFamily("metaq_replication_lag_messages", "Messages a slave is behind this master", labels=["slave", "topic", "partition"])
        lag_seconds = GaugeMetricFamily("metaq_replication_lag_seconds", "Age of the oldest message a slave lacks", labels=["slave", "topic", "partition"])
        sync_set = GaugeMetricFamily("metaq_sync_set_size", "Slaves in the sync set (sync mode, on the master)")
        under = GaugeMetricFamily(
            "metaq_under_replicated_partitions",
            "Partitions a known slave has lagged on for longer than syncSlaveTimeoutMs, or, in sync mode, "
            "all partitions while the sync set is smaller than minSyncSlaves",
        )
        lagging: set[tuple[str, int]] = set()
        if broker.ha.acting_master:
            ends = {key: log_.log_end for key, log_ in broker.store.logs().items()}
            for row in broker.ha.progress.lag(ends):
                labels = [str(row.slave_id), row.topic, str(row.partition)]
                lag_bytes.add_metric(labels, row.bytes)
                lag_messages.add_metric(labels, row.messages)
                lag_seconds.add_metric(labels, row.millis / 1000)
                if row.millis > broker.config.sync_slave_timeout_ms:
                    lagging.add((row.topic, row.partition))
            members = broker.ha.sync_set
            if members is not None:
                sync_set.add_metric([], len(members.members))
                if members.too_small:
                    lagging.update(ends)
        under.add_metric([], len(lagging))
        not_replicated = GaugeMetricFamily(
            "metaq_partitions_not_replicated",
            "Partitions this master serves that a registered slave has not replicated for notReplicatingAfterMs"
            " (no replica of it, or one that stopped while behind)", labels=["slave"],
        )
        missing = broker.replica_coverage.missing
        registered = broker.registry.slave_ids if broker.registry is not None and broker.ha.acting_master else ()
        for slave_id in sorted(set(registered) | set(missing)):
            not_replicated.add_metric([str(slave_id)], len(missing.get(slave_id, ())))
        yield from (lag_bytes, lag_messages, lag_seconds, sync_set, under, not_replicated)

    def _zookeeper(self) -> Any:
        state = GaugeMetricFamily("metaq_zookeeper_state", "1 for the state of the broker's ZooKeeper session", labels=["state"])
        registry = self.broker.registry
        current = str(registry.client.state) if registry is not None else "DISABLED"
        for name in (*ZK_STATES, "DISABLED"):
            state.add_metric([name], 1.0 if name == current else 0.0)
        return state


def _one(family: Any, name: str, documentation: str, value: float) -> Any:
    """A metric family of one unlabelled sample."""
    metric = family(name, documentation)
    metric.add_metric([], value)
    return metric
