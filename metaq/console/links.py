"""One logged-in connection per broker, kept from one collection cycle to the next.

The console asks every broker for its stats every second. ``metaq cluster``'s way (a new
connection and, with security on, a new SCRAM login per question) is right for a command
run once, but kept up it would cost each broker a password check (a PBKDF2) and a log line
per question, forever. So a broker that answered once is asked again on a connection kept
for it; a failure on that connection (the broker died, restarted, closed it) drops it, and
the next question goes the CLI's way again (``stats_answer``), whose answer says why a
broker cannot answer (unreachable, needs login, TLS mismatch, 403).

Held: at most one connection per broker registered now; a broker that left the cluster
has its connection closed at the next cycle (``keep_only``).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from ..cli.admin import Answer, stats_answer


class BrokerLinks:
    def __init__(self, creds: Any, timeout: float) -> None:
        self.creds, self.timeout = creds, timeout
        self._conns: dict[str, Any] = {}
        self._opening: dict[str, asyncio.Lock] = {}

    async def stats(self, url: str, item: str) -> Answer:
        """``stats_answer(url, item)``, on the broker's kept connection when there is one."""
        from ..protocol.messages import StatsRequest
        from ..protocol.replies import StatsReply

        conn = self._conns.get(url)
        if conn is not None:
            try:
                reply = await conn.request(StatsRequest(item=item, format="map").to_header(), timeout=self.timeout)
                if reply.ok:
                    return Answer(StatsReply.of(reply))
            except Exception:  # closed, timed out, malformed: the CLI's way below says why
                pass
            self._drop(url)
        answer = await stats_answer(url, item, self.timeout, self.creds)
        if answer.reply is not None:
            await self._keep(url)
        return answer

    async def _keep(self, url: str) -> None:
        """Open the connection to keep (the broker just answered), once even if asked twice at once."""
        from ..addresses import parse_broker_url
        from ..client.connection import AuthenticationFailed

        lock = self._opening.setdefault(url, asyncio.Lock())
        async with lock:
            if url in self._conns:
                return
            host, port = parse_broker_url(url)
            try:
                self._conns[url] = await self.creds.open(host, port, self.timeout)
            except AuthenticationFailed:
                # A broker with security off refuses a login (stats_answer asked it without one).
                try:
                    self._conns[url] = await replace(self.creds, user=None, password=None).open(host, port, self.timeout)
                except Exception:
                    pass
            except Exception:
                pass

    def _drop(self, url: str) -> None:
        conn = self._conns.pop(url, None)
        if conn is not None:
            conn.close()

    def keep_only(self, urls: set[str]) -> None:
        for url in set(self._conns) - urls:
            self._drop(url)
        for url in set(self._opening) - urls:
            del self._opening[url]

    def close(self) -> None:
        self.keep_only(set())
