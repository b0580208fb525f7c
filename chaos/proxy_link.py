"""The data path of the fault proxy: a listener per proxy, and per accepted connection an
upstream connection and one pump per direction that applies the proxy's toxics.

A ``Proxy`` owns its listener and its live ``Connection``s; a ``Connection`` owns its two
sockets, its two pump tasks and the timers of its ``timeout``/``reset_peer`` toxics.
Invariant: a closed connection has no task or timer left and is no longer in its proxy's
``connections`` (``Connection._finish``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from typing import Any

from .toxics import ApiError, Toxic, data_limit, latency_delay, shape

READ_SIZE = 32 * 1024
QUEUE_CHUNKS = 256


def split_hostport(address: str) -> tuple[str, int]:
    if not isinstance(address, str) or ":" not in address:
        raise ApiError(400, f"bad address {address!r}: expected host:port")
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ApiError(400, f"bad port in {address!r}") from None
    if not 0 <= number <= 65535:
        raise ApiError(400, f"bad port in {address!r}")
    return host, number



def _reset_socket(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0) instead of FIN."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(Exception):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(Exception):
        writer.transport.abort()


class Connection:
    """One proxied TCP connection: a client socket, an upstream socket, two pumps."""

    def __init__(self, proxy: "Proxy", client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.proxy = proxy
        self.client_r, self.client_w = client
        self.up_r, self.up_w = upstream
        self.changed = asyncio.Event()  # set (and replaced) when the proxy's toxics change
        self.applies: dict[int, bool] = {}  # toxic serial -> drawn "does it apply here"
        self.timers: dict[int, asyncio.Task] = {}  # toxic serial -> close/reset timer
        self.sent = {"upstream": 0, "downstream": 0}
        self.closed = False
        self.eofs = 0
        self.tasks: list[asyncio.Task] = []
        self.rng = proxy.rng

    def applies_to(self, toxic: Toxic) -> bool:
        drawn = self.applies.get(toxic.serial)
        if drawn is None:
            drawn = toxic.toxicity >= 1.0 or (toxic.toxicity > 0.0 and self.rng.random() < toxic.toxicity)
            self.applies[toxic.serial] = drawn
        return drawn

    def active(self, stream: str) -> list[Toxic]:
        return [t for t in self.proxy.toxics.values() if t.stream == stream and self.applies_to(t)]

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.tasks = [
            loop.create_task(self._direction("upstream", self.client_r, self.up_w)),
            loop.create_task(self._direction("downstream", self.up_r, self.client_w)),
        ]
        self.toxics_changed()

    def toxics_changed(self) -> None:
        """Called whenever the proxy's toxic set changes: wake held pumps, (re)arm timers."""
        old, self.changed = self.changed, asyncio.Event()
        old.set()
        if self.closed:
            return
        live = {t.serial: t for t in self.proxy.toxics.values()}
        for serial in list(self.timers):
            if serial not in live:
                self.timers.pop(serial).cancel()
        for toxic in live.values():
            if toxic.type not in ("timeout", "reset_peer") or toxic.serial in self.timers:
                continue
            if not self.applies_to(toxic):
                continue
            if toxic.type == "timeout" and toxic.attr("timeout") <= 0:
                continue  # hold forever, never close
            self.timers[toxic.serial] = asyncio.get_running_loop().create_task(self._timer(toxic))

    async def _timer(self, toxic: Toxic) -> None:
        await asyncio.sleep(toxic.attr("timeout") / 1000.0)
        if toxic.type == "reset_peer":
            self.reset()
        else:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for writer in (self.client_w, self.up_w):
            with contextlib.suppress(Exception):
                writer.close()
        self._finish()

    def reset(self) -> None:
        if self.closed:
            return
        self.closed = True
        _reset_socket(self.client_w)
        _reset_socket(self.up_w)
        self._finish()

    def _finish(self) -> None:
        for task in list(self.timers.values()) + self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self.timers.clear()
        self.proxy.connections.discard(self)
        self.changed.set()

    async def _direction(self, stream: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)
        loop = asyncio.get_running_loop()

        async def read_side() -> None:
            try:
                while True:
                    data = await reader.read(READ_SIZE)
                    await queue.put((loop.time(), data))
                    if not data:
                        return
            except (ConnectionError, OSError):
                await queue.put((loop.time(), b""))

        reading = loop.create_task(read_side())
        try:
            while not self.closed:
                arrived, data = await queue.get()
                if not data:
                    await self._eof(stream, writer)
                    return
                await self._deliver(stream, arrived, data, writer)
        except (ConnectionError, OSError):
            self.close()
        finally:
            reading.cancel()

    async def _wait_change(self) -> None:
        await self.changed.wait()

    async def _deliver(self, stream: str, arrived: float, data: bytes, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        # Hold while a timeout toxic is active; drop while reset_peer is active.
        while True:
            toxics = self.active(stream)
            types = {t.type for t in toxics}
            if "reset_peer" in types:
                return  # dropped; the timer resets the connection
            if "timeout" not in types:
                break
            await self._wait_change()
            if self.closed:
                return
        delay = latency_delay(toxics, self.rng)
        if delay > 0:
            wait = arrived + delay - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
        pieces = shape(data, toxics, self.rng)
        limit = data_limit(toxics)
        for piece, before in pieces:
            if before > 0:
                await asyncio.sleep(before)
            if self.closed:
                return
            if limit is not None:
                room = max(0, limit - self.sent[stream])
                if len(piece) >= room:
                    if room:
                        writer.write(piece[:room])
                        self.sent[stream] += room
                        with contextlib.suppress(Exception):
                            await writer.drain()
                    self.close()
                    return
            writer.write(piece)
            self.sent[stream] += len(piece)
            await writer.drain()

    async def _eof(self, stream: str, writer: asyncio.StreamWriter) -> None:
        for toxic in self.active(stream):
            if toxic.type == "slow_close" and toxic.attr("delay") > 0:
                await asyncio.sleep(toxic.attr("delay") / 1000.0)
        # Half-close: the other direction keeps going until it ends too.
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
        self.eofs += 1
        if self.eofs >= 2:
            self.close()


class Proxy:
    def __init__(self, name: str, listen: str, upstream: str, rng: random.Random) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self.toxics: dict[str, Toxic] = {}
        self.connections: set[Connection] = set()
        self.server: asyncio.AbstractServer | None = None
        self.rng = rng

    def to_json(self, with_toxics: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
        }
        if with_toxics:
            out["toxics"] = [t.to_json() for t in self.toxics.values()]
        return out

    async def start(self) -> None:
        if self.enabled:
            return
        host, port = split_hostport(self.listen)
        try:
            self.server = await asyncio.start_server(self._accept, host, port, reuse_address=True)
        except OSError as exc:
            raise ApiError(500, f"listen {self.listen}: {exc}") from None
        bound = self.server.sockets[0].getsockname()
        self.listen = f"{host}:{bound[1]}"  # a ":0" request becomes the real port
        self.enabled = True

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for conn in list(self.connections):
            conn.close()
        self.enabled = False
        await asyncio.sleep(0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = split_hostport(self.upstream)
        try:
            up = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
        except (OSError, asyncio.TimeoutError):
            writer.close()
            return
        if not self.enabled:
            up[1].close()
            writer.close()
            return
        for w in (writer, up[1]):
            sock = w.get_extra_info("socket")
            with contextlib.suppress(Exception):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(self, (reader, writer), up)
        self.connections.add(conn)
        conn.start()

    def toxics_changed(self) -> None:
        for conn in list(self.connections):
            conn.toxics_changed()
