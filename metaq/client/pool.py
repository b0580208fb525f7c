"""One pipelined connection per broker address, shared by a factory's producers and consumers."""

from __future__ import annotations

import asyncio

from ..addresses import parse_broker_url, parse_host_port
from .connection import BrokerConnection, ConnectionClosed, Credentials


class ConnectionPool:
    def __init__(
        self, connect_timeout: float = 5.0, address_map: dict[str, str] | None = None, credentials: Credentials | None = None
    ) -> None:
        self.connect_timeout = connect_timeout
        self.credentials = credentials or Credentials()
        # (host, port) as registered -> (host, port) to connect to (MetaClientConfig.address_map).
        self._redirects = {
            parse_host_port(registered): parse_host_port(actual) for registered, actual in (address_map or {}).items()
        }
        self._connections: dict[tuple[str, int], BrokerConnection] = {}
        # Concurrent callers for a new address wait on the same connect.
        self._connecting: dict[tuple[str, int], asyncio.Future[BrokerConnection]] = {}
        # address -> times abandoned: a connect that was under way when its broker departed is not kept.
        self._abandoned: dict[tuple[str, int], int] = {}

    def resolve(self, host: str, port: int) -> tuple[str, int]:
        """Where to connect for a broker registered at ``host:port`` (after ``address_map``)."""
        return self._redirects.get((host, port), (host, port))

    async def get(self, host: str, port: int) -> BrokerConnection:
        """An open connection to ``host:port`` (raises ConnectionClosed if it cannot connect)."""
        key = self.resolve(host, port)
        conn = self._connections.get(key)
        if conn is not None and conn.is_open:
            return conn
        pending = self._connecting.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[BrokerConnection] = asyncio.get_running_loop().create_future()
        self._connecting[key] = future
        abandoned = self._abandoned.get(key, 0)
        try:
            conn = await self.credentials.open(*key, self.connect_timeout)
            if self._abandoned.get(key, 0) != abandoned:
                conn.close()
                raise ConnectionClosed(f"{key[0]}:{key[1]} left the cluster while connecting")
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: nobody else may be waiting
            raise
        finally:
            self._connecting.pop(key, None)
        self._connections[key] = conn
        future.set_result(conn)
        return conn

    def abandon(self, url: str, reason: str) -> None:
        """Fail every request in flight to the broker registered as ``url`` and drop its connection.

        Called when ZooKeeper says the broker is no longer what those requests were sent to
        (``Cluster.add_departure_listener``): their outcome is unknown, and their senders
        retry elsewhere now instead of waiting for a reply that a silent host never sends.
        """
        key = self.resolve(*parse_broker_url(url))
        self._abandoned[key] = self._abandoned.get(key, 0) + 1
        conn = self._connections.pop(key, None)
        if conn is not None:
            conn.abandon(f"{conn.address} abandoned: {reason}")

    def close_all(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
