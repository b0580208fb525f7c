"""A TCP fault proxy that speaks Toxiproxy's HTTP API, on asyncio: how to run it.

No Toxiproxy server binary installs from the registries here, so this package provides
one. The scenarios drive it only through ``toxiproxy-python`` (see
``chaos.toxiproxy_client``), so a real ``toxiproxy-server`` can replace it unchanged.

The pieces:

* ``chaos.toxics``      toxic types, their validation and what they do to a chunk of data;
* ``chaos.proxy_link``  the data path: listener, upstream connection, per-direction pumps;
* ``chaos.proxy_api``   the proxy collection and its HTTP API (``ToxiproxyServer``);
* this module           running the server: ``ProxyThread`` (its own loop in a thread, for
                        synchronous code and tests) and ``serve_forever`` (``python -m chaos proxy``).

Toxicity is the probability that a toxic applies to a given connection; it is drawn
once per (connection, toxic), as Toxiproxy does per link. Disabling a proxy closes its
listener and every connection; enabling binds the same address again.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

from .proxy_api import VERSION, ToxiproxyServer

__all__ = ["ProxyThread", "ToxiproxyServer", "VERSION", "serve_forever"]


class ProxyThread:
    """The server on its own event loop in a daemon thread (for synchronous test code).

    >>> with ProxyThread() as server:      # port 0: a free port
    ...     server.url                      # "http://127.0.0.1:PORT"
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, seed: int | None = None) -> None:
        self.host, self.port, self.seed = host, port, seed
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: ToxiproxyServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "ProxyThread":
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            asyncio.set_event_loop(loop)
            self.server = ToxiproxyServer(self.seed)
            try:
                _, self.port = loop.run_until_complete(self.server.start(self.host, self.port))
            except BaseException as exc:  # report to the starting thread
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.server.close())
            loop.close()

        self._thread = threading.Thread(target=run, name="chaos-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]
        return self

    def call(self, fn: Callable[[ToxiproxyServer], Any]) -> Any:
        """Run ``fn(server)`` on the proxy's loop (awaiting it if it returns a coroutine)."""
        assert self.loop is not None and self.server is not None

        async def run() -> Any:
            result = fn(self.server)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def stop(self) -> None:
        if self.loop is not None and self._thread is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    def __enter__(self) -> "ProxyThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def serve_forever(host: str = "127.0.0.1", port: int = 8474, seed: int | None = None) -> None:
    server = ToxiproxyServer(seed)
    bound = await server.start(host, port)
    print(f"chaos proxy (Toxiproxy API {VERSION}) listening on http://{bound[0]}:{bound[1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.close()
