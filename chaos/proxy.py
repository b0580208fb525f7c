"""A TCP fault proxy that speaks Toxiproxy's HTTP API, on asyncio.

No Toxiproxy server binary installs from the registries here, so this module provides
one. The scenarios drive it only through ``toxiproxy-python`` (see
``chaos.toxiproxy_client``), so a real ``toxiproxy-server`` can replace it unchanged.

HTTP API (same paths, verbs, JSON shapes and status codes as Toxiproxy 2.x)::

    GET    /proxies                         {name: proxy, ...}               200
    POST   /proxies                         create {name, listen, upstream, enabled}
                                            -> proxy 201; 409 if the name exists
    POST   /populate                        [proxy, ...] create or replace -> {"proxies": [...]} 201
    GET    /proxies/{p}                     proxy                            200 / 404
    POST   /proxies/{p}                     update enabled/listen/upstream -> proxy 200
    DELETE /proxies/{p}                     204
    GET    /proxies/{p}/toxics              [toxic, ...]                     200
    POST   /proxies/{p}/toxics              create {name?, type, stream?, toxicity?, attributes}
                                            -> toxic 200; 409 if the name exists; 400 bad type
    GET    /proxies/{p}/toxics/{t}          toxic                            200 / 404
    POST   /proxies/{p}/toxics/{t}          update attributes/toxicity -> toxic 200
    DELETE /proxies/{p}/toxics/{t}          204
    POST   /reset                           enable every proxy, remove every toxic   204
    GET    /version                         {"version": "..."}               200

    proxy = {"name", "listen": "host:port" (the bound port once listening), "upstream",
             "enabled", "toxics": [toxic, ...]}
    toxic = {"name" (default "{type}_{stream}"), "type", "stream": "upstream"|"downstream"
             (default downstream), "toxicity": 0..1 (default 1), "attributes": {...}}
    errors = {"error": "...", "status": code}

"upstream" is the client -> server direction, "downstream" server -> client.

Toxics (attributes as in Toxiproxy):

* ``latency`` {latency, jitter} ms: every chunk is delivered ``latency +- jitter`` after it
  was read (chunks are pipelined: a delay, not a throughput cap).
* ``bandwidth`` {rate} KB/s (1 KB = 1000 bytes): bytes pass at most at that rate.
* ``slow_close`` {delay} ms: the close of the stream is delayed.
* ``timeout`` {timeout} ms: no data passes while the toxic is active (it is held, and flows
  again when the toxic is removed); the connection is closed ``timeout`` ms after the toxic
  became active on it. ``timeout=0`` holds forever and never closes.
* ``reset_peer`` {timeout} ms: data in the stream is dropped and ``timeout`` ms after the
  toxic became active the connection is reset (RST: SO_LINGER 0) on both sides.
* ``slicer`` {average_size, size_variation} bytes, {delay} microseconds: chunks are cut
  into slices of ``average_size +- size_variation`` bytes with ``delay`` between them.
* ``limit_data`` {bytes}: the connection is closed once that many bytes have passed in
  the stream (exactly ``bytes`` are delivered).

Toxicity is the probability that a toxic applies to a given connection; it is drawn
once per (connection, toxic), as Toxiproxy does per link. Disabling a proxy closes its
listener and every connection; enabling binds the same address again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import unquote

log = logging.getLogger("chaos.proxy")

VERSION = "2.9.0-metaq-chaos"
STREAMS = ("upstream", "downstream")
TOXIC_TYPES: dict[str, dict[str, int]] = {
    # type -> attribute defaults
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 0},
}
READ_SIZE = 32 * 1024
QUEUE_CHUNKS = 256


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# --- model -------------------------------------------------------------------------


@dataclass
class Toxic:
    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, Any]
    serial: int = 0  # identifies this toxic instance (for per-connection toxicity draws)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }

    def attr(self, key: str) -> float:
        return float(self.attributes.get(key, 0) or 0)


_serials = iter(range(1, 1 << 62))


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"{what} must be a number, got {value!r}")
    return value


def parse_toxic(body: Any, existing: Toxic | None = None) -> Toxic:
    """Build (or, with ``existing``, update) a toxic from request JSON; ApiError 400 if bad."""
    if not isinstance(body, dict):
        raise ApiError(400, "bad request body: expected a JSON object")
    if existing is None:
        ttype = body.get("type")
        if ttype not in TOXIC_TYPES:
            raise ApiError(400, f"invalid toxic type: {ttype!r}")
        stream = body.get("stream") or "downstream"
        if stream not in STREAMS:
            raise ApiError(400, f"invalid stream: {stream!r} (upstream or downstream)")
        name = body.get("name") or f"{ttype}_{stream}"
        if not isinstance(name, str):
            raise ApiError(400, "toxic name must be a string")
        attributes = dict(TOXIC_TYPES[ttype])
        toxicity = 1.0
    else:
        ttype, stream, name = existing.type, existing.stream, existing.name
        attributes = dict(existing.attributes)
        toxicity = existing.toxicity
    if "toxicity" in body and body["toxicity"] is not None:
        toxicity = float(_number(body["toxicity"], "toxicity"))
        if not 0.0 <= toxicity <= 1.0:
            raise ApiError(400, f"toxicity must be within 0..1, got {toxicity}")
    attrs = body.get("attributes") or {}
    if not isinstance(attrs, dict):
        raise ApiError(400, "attributes must be a JSON object")
    for key, value in attrs.items():
        if key not in TOXIC_TYPES[ttype]:
            continue  # Toxiproxy ignores unknown attributes
        if _number(value, f"attribute {key}") < 0:
            raise ApiError(400, f"attribute {key} must not be negative")
        attributes[key] = value
    return Toxic(name, ttype, stream, toxicity, attributes, serial=next(_serials))


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


# --- the data path -------------------------------------------------------------------


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
        delay = 0.0
        for toxic in toxics:
            if toxic.type == "latency":
                jitter = toxic.attr("jitter")
                delay += (toxic.attr("latency") + (self.rng.uniform(-jitter, jitter) if jitter else 0.0)) / 1000.0
        if delay > 0:
            wait = arrived + delay - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
        pieces: list[tuple[bytes, float]] = [(data, 0.0)]  # (bytes, sleep before)
        for toxic in toxics:
            if toxic.type == "slicer":
                pieces = self._slice(pieces, toxic)
        for toxic in toxics:
            if toxic.type == "bandwidth" and toxic.attr("rate") > 0:
                pieces = self._throttle(pieces, toxic.attr("rate") * 1000.0)
        limit = None
        for toxic in toxics:
            if toxic.type == "limit_data":
                cap = int(toxic.attr("bytes"))
                limit = cap if limit is None else min(limit, cap)
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

    def _slice(self, pieces: list[tuple[bytes, float]], toxic: Toxic) -> list[tuple[bytes, float]]:
        average = max(1, int(toxic.attr("average_size")))
        variation = int(toxic.attr("size_variation"))
        gap = toxic.attr("delay") / 1_000_000.0
        out: list[tuple[bytes, float]] = []
        for data, before in pieces:
            pos, first = 0, True
            while pos < len(data):
                size = max(1, average + (self.rng.randint(-variation, variation) if variation else 0))
                out.append((data[pos : pos + size], before if first else gap))
                pos += size
                first = False
        return out

    @staticmethod
    def _throttle(pieces: list[tuple[bytes, float]], bytes_per_s: float) -> list[tuple[bytes, float]]:
        step = max(1, int(bytes_per_s / 10))  # at most 100 ms worth per write
        out: list[tuple[bytes, float]] = []
        carry = 0.0
        for data, before in pieces:
            carry += before
            for pos in range(0, len(data), step):
                chunk = data[pos : pos + step]
                # Sleep before each write for the time the *previous* bytes took.
                out.append((chunk, carry))
                carry = len(chunk) / bytes_per_s
        if out and carry:
            out.append((b"", carry))  # pay for the last chunk before the next one
        return [(d, s) for d, s in out]

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


# --- the API -------------------------------------------------------------------------


class ToxiproxyServer:
    """The proxy collection plus its HTTP API, on the running asyncio loop."""

    def __init__(self, seed: int | None = None) -> None:
        self.proxies: dict[str, Proxy] = {}
        self.rng = random.Random(seed)
        self.http: asyncio.AbstractServer | None = None
        self.lock = asyncio.Lock()
        self.address: tuple[str, int] | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 8474) -> tuple[str, int]:
        self.http = await asyncio.start_server(self._http_client, host, port, reuse_address=True)
        self.address = (host, self.http.sockets[0].getsockname()[1])
        return self.address

    async def close(self) -> None:
        if self.http is not None:
            self.http.close()
        for proxy in list(self.proxies.values()):
            await proxy.stop()

    # --- operations (also usable directly, without HTTP) ---

    def _get(self, name: str) -> Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise ApiError(404, "proxy not found")
        return proxy

    async def create_proxy(self, body: Any) -> Proxy:
        if not isinstance(body, dict):
            raise ApiError(400, "bad request body: expected a JSON object")
        name = body.get("name")
        if not name or not isinstance(name, str):
            raise ApiError(400, "missing required field: name")
        upstream = body.get("upstream")
        if not upstream:
            raise ApiError(400, "missing required field: upstream")
        split_hostport(upstream)
        listen = body.get("listen") or "127.0.0.1:0"
        split_hostport(listen)
        if name in self.proxies:
            raise ApiError(409, "proxy already exists")
        proxy = Proxy(name, listen, upstream, self.rng)
        if body.get("enabled", True):
            await proxy.start()
        self.proxies[name] = proxy
        return proxy

    async def update_proxy(self, name: str, body: Any) -> Proxy:
        proxy = self._get(name)
        if not isinstance(body, dict):
            raise ApiError(400, "bad request body: expected a JSON object")
        listen = body.get("listen") or proxy.listen
        upstream = body.get("upstream") or proxy.upstream
        split_hostport(listen)
        split_hostport(upstream)
        enabled = body.get("enabled", proxy.enabled)
        moved = listen != proxy.listen or upstream != proxy.upstream
        if moved or not enabled:
            await proxy.stop()
        proxy.listen, proxy.upstream = listen, upstream
        if enabled and not proxy.enabled:
            await proxy.start()
        return proxy

    async def delete_proxy(self, name: str) -> None:
        proxy = self._get(name)
        await proxy.stop()
        del self.proxies[name]

    async def populate(self, body: Any) -> list[Proxy]:
        if isinstance(body, dict) and "proxies" in body:
            body = body["proxies"]
        if not isinstance(body, list):
            raise ApiError(400, "bad request body: expected a JSON array of proxies")
        out = []
        for item in body:
            if not isinstance(item, dict) or "name" not in item:
                raise ApiError(400, "every proxy needs a name")
            existing = self.proxies.get(item["name"])
            if existing is not None:
                same = existing.upstream == item.get("upstream") and (
                    item.get("listen") in (None, existing.listen))
                if same:
                    out.append(existing)
                    continue
                await self.delete_proxy(existing.name)
            out.append(await self.create_proxy(item))
        return out

    async def reset(self) -> None:
        for proxy in self.proxies.values():
            proxy.toxics.clear()
            proxy.toxics_changed()
            if not proxy.enabled:
                await proxy.start()

    def add_toxic(self, name: str, body: Any) -> Toxic:
        proxy = self._get(name)
        toxic = parse_toxic(body)
        if toxic.name in proxy.toxics:
            raise ApiError(409, "toxic already exists")
        proxy.toxics[toxic.name] = toxic
        proxy.toxics_changed()
        return toxic

    def get_toxic(self, name: str, toxic_name: str) -> Toxic:
        toxic = self._get(name).toxics.get(toxic_name)
        if toxic is None:
            raise ApiError(404, "toxic not found")
        return toxic

    def update_toxic(self, name: str, toxic_name: str, body: Any) -> Toxic:
        proxy = self._get(name)
        old = self.get_toxic(name, toxic_name)
        new = parse_toxic(body, existing=old)
        new.serial = old.serial  # same toxic: keep its per-connection draws and timers
        proxy.toxics[toxic_name] = new
        proxy.toxics_changed()
        return new

    def delete_toxic(self, name: str, toxic_name: str) -> None:
        proxy = self._get(name)
        self.get_toxic(name, toxic_name)
        del proxy.toxics[toxic_name]
        proxy.toxics_changed()

    # --- routing ---

    async def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = [unquote(p) for p in path.split("?", 1)[0].strip("/").split("/") if p]
        async with self.lock:
            if parts == ["version"] and method == "GET":
                return 200, {"version": VERSION}
            if parts == ["reset"] and method == "POST":
                await self.reset()
                return 204, None
            if parts == ["populate"] and method == "POST":
                proxies = await self.populate(body)
                return 201, {"proxies": [p.to_json() for p in proxies]}
            if parts == ["proxies"]:
                if method == "GET":
                    return 200, {n: p.to_json() for n, p in self.proxies.items()}
                if method == "POST":
                    return 201, (await self.create_proxy(body)).to_json()
            elif len(parts) == 2 and parts[0] == "proxies":
                if method == "GET":
                    return 200, self._get(parts[1]).to_json()
                if method in ("POST", "PATCH"):
                    return 200, (await self.update_proxy(parts[1], body)).to_json()
                if method == "DELETE":
                    await self.delete_proxy(parts[1])
                    return 204, None
            elif len(parts) == 3 and parts[0] == "proxies" and parts[2] == "toxics":
                if method == "GET":
                    return 200, [t.to_json() for t in self._get(parts[1]).toxics.values()]
                if method == "POST":
                    return 200, self.add_toxic(parts[1], body).to_json()
            elif len(parts) == 4 and parts[0] == "proxies" and parts[2] == "toxics":
                if method == "GET":
                    return 200, self.get_toxic(parts[1], parts[3]).to_json()
                if method in ("POST", "PATCH"):
                    return 200, self.update_toxic(parts[1], parts[3], body).to_json()
                if method == "DELETE":
                    self.delete_toxic(parts[1], parts[3])
                    return 204, None
            else:
                raise ApiError(404, "not found")
            raise ApiError(405, f"method {method} not allowed on {path}")

    async def _http_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A small HTTP/1.1 server: keep-alive, Content-Length bodies, JSON in and out."""
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                try:
                    method, target, _version = lines[0].split(" ", 2)
                except ValueError:
                    await self._respond(writer, 400, {"error": "bad request line", "status": 400}, False)
                    return
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        key, _, value = line.partition(":")
                        headers[key.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0") or 0)
                raw = await reader.readexactly(length) if length else b""
                keep = headers.get("connection", "").lower() != "close"
                try:
                    body = json.loads(raw) if raw.strip() else {}
                except ValueError:
                    status, payload = 400, {"error": "bad request body: invalid JSON", "status": 400}
                else:
                    try:
                        status, payload = await self.route(method.upper(), target, body)
                    except ApiError as exc:
                        status, payload = exc.status, {"error": exc.message, "status": exc.status}
                    except Exception as exc:  # never let one request kill the server
                        log.exception("API request %s %s failed", method, target)
                        status, payload = 500, {"error": str(exc), "status": 500}
                await self._respond(writer, status, payload, keep)
                if not keep:
                    return
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, status: int, payload: Any, keep: bool) -> None:
        reasons = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 404: "Not Found",
                   405: "Method Not Allowed", 409: "Conflict", 500: "Internal Server Error"}
        body = b"" if payload is None or status == 204 else json.dumps(payload).encode() + b"\n"
        head = [f"HTTP/1.1 {status} {reasons.get(status, 'Status')}", f"Content-Length: {len(body)}",
                "Connection: " + ("keep-alive" if keep else "close")]
        if body:
            head.append("Content-Type: application/json")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()


# --- running it ----------------------------------------------------------------------


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
