"""What all of a broker's connections may hold together: request bytes and connection slots.

Two broker-wide ledgers, shared by every ``ClientConnection`` (docs/security.md, "Limits"):

``RequestBudget`` ([system] ``maxBufferedRequestBytes``): bytes of requests being
received. A frame whose body does not arrive in the same read as its header is
announced by the decoder (``FrameHead``) before any of its body is buffered; the
connection reserves the frame's whole declared size here first, and a frame that does
not fit is refused (503, its body skipped unread). What each connection holds is
re-counted after every read, so the ledger also shows bytes no one could refuse (the
read just made, a header being received).

``ConnectionSlots`` ([system] ``maxConnections``, ``maxConnectionsPerAddress``): who
holds the broker's connection slots. With security on, a peer is unknown until it logs
in, so a slot cannot be kept free for "logged-in users and the group's brokers" at
accept time; instead, a connection that has not logged in never keeps a slot from a
newcomer: when every slot is taken, a connection that has not logged in (the oldest of
the address with the most of them) is closed to make room. Connections that logged in are never closed for room.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Protocol

log = logging.getLogger(__name__)


class RequestBudget:
    """Bytes of requests being received, broker-wide, against one limit.

    Invariant (enforced in ``fits``, used by ``ClientConnection._admit_head``): a frame
    whose body is still to come is buffered only if the broker's total, with that frame's
    whole declared size counted, stays within ``limit``. Beyond the limit the broker can
    hold, per connection, only what one read returns and one frame header (both bounded).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def fits(self, current: int, wanted: int) -> bool:
        """Could a holder of ``current`` bytes hold ``wanted`` instead without passing the limit?"""
        return wanted <= current or self.held - current + wanted <= self.limit

    def move(self, current: int, wanted: int) -> int:
        """A holder's count goes from ``current`` to ``wanted`` (unchecked: bytes already read); returns ``wanted``."""
        self.held += wanted - current
        return wanted


class Slotted(Protocol):
    """What the slots know of a connection (metaq.server.connection.ClientConnection)."""

    peer_host: str

    def evict(self, reason: str) -> None: ...

    def close(self) -> None: ...


class ConnectionSlots:
    """The broker's ``max_connections`` slots, at most ``max_per_address`` per peer address.

    Invariant (enforced in ``admit``): at most ``max_connections`` connections hold a slot,
    and a newcomer is refused only if its own address already holds ``max_per_address``,
    or every slot is held by a connection that logged in (with security off every
    connection counts as logged in: there is no one to tell apart). So a user or a broker
    of the group always gets a connection while an attacker holds only connections that
    have not logged in, and keeps it once it has logged in. An evicted connection gives
    up its slot at once (not when its socket finally closes), so the count is exact.

    Whom to close for room: the oldest not-logged-in connection of the address that has
    the most of them. A flood comes from few addresses with many connections each, a
    user logging in from one with few: the flood loses its own connections first.
    """

    def __init__(self, max_connections: int, max_per_address: int) -> None:
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self._holders: dict[Slotted, None] = {}
        # Per address, its connections that hold a slot and have not logged in, oldest first (dicts keep order).
        self._not_logged_in: dict[str, dict[Slotted, None]] = {}
        self._per_address: Counter[str] = Counter()
        self._last_log: dict[str, float] = {}

    @property
    def held(self) -> int:
        return len(self._holders)

    @property
    def not_logged_in(self) -> int:
        return sum(len(waiting) for waiting in self._not_logged_in.values())

    def admit(self, conn: Slotted, logged_in: bool) -> tuple[str, str] | None:
        """Give ``conn`` a slot (closing a not-logged-in connection for room if need be), or say why not:
        (the refusal's stats name, a reason for the log)."""
        host = conn.peer_host
        if self._per_address[host] >= self.max_per_address:
            return "per_address", f"{self._per_address[host]} connections from {host} (maxConnectionsPerAddress={self.max_per_address})"
        if len(self._holders) >= self.max_connections:
            if not self._not_logged_in:
                return "max_connections", (
                    f"{len(self._holders)} connections open, none of them waiting to log in (maxConnections={self.max_connections})"
                )
            most = max(self._not_logged_in.values(), key=len)
            victim = next(iter(most))
            self.release(victim)
            victim.evict(f"making room for a new connection, all {self.max_connections} slots taken (maxConnections)")
        self._holders[conn] = None
        self._per_address[host] += 1
        if not logged_in:
            self._not_logged_in.setdefault(host, {})[conn] = None
        return None

    def logged_in(self, conn: Slotted) -> None:
        """``conn`` proved who it is: its slot can no longer be taken for room."""
        self._stop_waiting(conn)

    def _stop_waiting(self, conn: Slotted) -> None:
        waiting = self._not_logged_in.get(conn.peer_host)
        if waiting is not None:
            waiting.pop(conn, None)
            if not waiting:
                del self._not_logged_in[conn.peer_host]

    def release(self, conn: Slotted) -> None:
        """``conn`` gives up its slot (idempotent: an evicted connection releases again when it closes)."""
        if conn not in self._holders:
            return
        del self._holders[conn]
        self._stop_waiting(conn)
        self._per_address[conn.peer_host] -= 1
        if not self._per_address[conn.peer_host]:
            del self._per_address[conn.peer_host]

    def close_all(self) -> None:
        """The broker stops: every connection closes (a listener's close leaves them open, and
        a request they sent later would reach logs that are closed by then)."""
        for conn in list(self._holders):
            conn.close()

    def log_once_a_second(self, kind: str, line: str) -> None:
        """A refusal's log line, one per second per kind at most: a connection flood must not become a log flood."""
        now = time.monotonic()
        if now - self._last_log.get(kind, -1.0) >= 1.0:
            self._last_log[kind] = now
            log.warning("%s", line)
