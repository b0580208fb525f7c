"""One line when a broker's ZooKeeper connection comes back, saying how long it was away.

The start of an outage is logged where it is acted on (the registry: "lost its
ZooKeeper connection" / "lost its ZooKeeper session"); kazoo's own per-attempt
warnings are muted (metaq/logsetup.py), so an outage is two lines however long it lasts.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kazoo.client import KazooState

log = logging.getLogger(__name__)


class OutageReporter:
    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self.down_since: float | None = None
        self.session_lost = False

    def __call__(self, state: str) -> None:
        # kazoo's connection thread: log and return, nothing more.
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            if self.down_since is None:
                self.down_since = self._clock()
            self.session_lost = self.session_lost or state == KazooState.LOST
        elif state == KazooState.CONNECTED and self.down_since is not None:
            away = self._clock() - self.down_since
            session = "a new session" if self.session_lost else "the same session"
            log.warning("ZooKeeper reachable again after %.1f s (%s)", away, session)
            self.down_since, self.session_lost = None, False
