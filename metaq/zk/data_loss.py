"""Reconnecting to a ZooKeeper that lost its data.

ZooKeeper refuses a client that has seen a newer transaction than the server's last one
("Refusing session request for client ... as it has seen zxid 0x32 our last zxid is 0x1
client must try another server"): in an ensemble a lagging server must not show a client
an older state than it already saw. A server restarted with an empty data directory starts
again at zxid 0, so every broker and client connected before it was wiped (kazoo remembers
the last zxid it saw) is refused until other clients' writes push the server past that
number; on a quiet cluster, for good. The group then has no master although every broker
is alive.

``ReconnectAfterDataLoss`` is a kazoo listener. Once the connection has been down for the
session timeout (any session we had is over by then; a lagging ensemble member has had
that long to catch up, or we have reached another one), it asks each server's ``srvr``
(ZooKeeper's default four-letter whitelist) for its last zxid; when a serving server is
behind what we saw, that server lost its data: we forget the zxid we saw (kazoo's
``last_zxid``), connect with a new session, and the HA layer finds a ZooKeeper without the
group's state (metaq/ha/election.py, "ZooKeeper lost its data"). The consistency check
given up is only the one the lost data made meaningless.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Callable

from kazoo.client import KazooClient, KazooState
from kazoo.protocol.states import KeeperState

from .embedded import four_letter_word

log = logging.getLogger(__name__)

#: How often a disconnected client looks at the servers' zxids.
PROBE_INTERVAL_S = 0.5

_ZXID = re.compile(r"^Zxid: (0x[0-9a-fA-F]+)", re.MULTILINE)


def server_zxid(host: str, port: int) -> int | None:
    """The last zxid a serving ZooKeeper reports (``srvr``), or None if it does not answer."""
    try:
        reply = four_letter_word(host, port, "srvr", timeout=0.5)
    except OSError:
        return None
    match = _ZXID.search(reply)
    return int(match.group(1), 16) if match and "Mode:" in reply else None


class ReconnectAfterDataLoss:
    def __init__(
        self, client: KazooClient, grace_s: float,
        probe: Callable[[str, int], int | None] = server_zxid, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.grace_s = grace_s
        self._probe = probe
        self._clock = clock
        self._watching = threading.Lock()

    def __call__(self, state: str) -> None:
        # kazoo's connection thread: start the watcher and return.
        if state in (KazooState.SUSPENDED, KazooState.LOST) and self._watching.acquire(blocking=False):
            threading.Thread(target=self._watch, name="zk-data-loss", daemon=True).start()

    def _watch(self) -> None:
        try:
            down_since = self._clock()
            while not self.client.connected and self.client.client_state != KeeperState.CLOSED:  # CLOSED: stopped
                time.sleep(PROBE_INTERVAL_S)
                if self._clock() - down_since >= self.grace_s and self.forget_if_server_behind():
                    return
        finally:
            self._watching.release()

    def forget_if_server_behind(self) -> bool:
        """If a serving server is behind the zxid we saw, forget it (True)."""
        seen = self.client.last_zxid
        for host, port in self.client.hosts or []:
            zxid = self._probe(host, port)
            if zxid is not None and zxid < seen:
                log.warning(
                    "ZooKeeper at %s:%d is at transaction 0x%x, behind the 0x%x this session saw: it lost its data;"
                    " connecting anyway (a new session; see docs/operations.md, \"Losing ZooKeeper's data\")",
                    host, port, zxid, seen,
                )
                self.client.last_zxid = 0
                return True
        return False


def reconnect_after_data_loss(client: KazooClient, session_timeout_ms: int) -> Any:
    """Add the listener to ``client``; returns it."""
    listener = ReconnectAfterDataLoss(client, session_timeout_ms / 1000)
    client.add_listener(listener)
    return listener
