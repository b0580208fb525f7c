"""The fault proxy's HTTP API: Toxiproxy 2.x paths, verbs, JSON shapes and status codes.

::

    GET    /proxies                         {name: proxy, ...}               200
    POST   /proxies                         create {name, listen, upstream, enabled}
                                            -> proxy 201; 409 if the name exists; 400 if
                                            enabled is not a boolean
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

"upstream" is the client -> server direction, "downstream" server -> client; the toxic
types and their attributes are in ``chaos.toxics``.

``ToxiproxyServer`` holds the proxies (by name) and serves the API on its own small
HTTP/1.1 server (keep-alive, Content-Length bodies, JSON in and out; no aiohttp). Every
request runs under one lock, so API operations never interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from typing import Any
from urllib.parse import unquote

from .proxy_link import Proxy, split_hostport
from .toxics import ApiError, Toxic, parse_toxic

log = logging.getLogger("chaos.proxy")

VERSION = "2.9.0-metaq-chaos"


def enabled_field(body: dict[str, Any], default: bool) -> bool:
    """A proxy's ``enabled`` from a request: a JSON boolean or absent. Anything else is a 400,
    as Toxiproxy's decoder answers: a truthy string such as ``"no"`` must not enable it."""
    enabled = body.get("enabled", default)
    if not isinstance(enabled, bool):
        raise ApiError(400, f"enabled must be true or false, got {enabled!r}")
    return enabled


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
        if enabled_field(body, True):
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
        enabled = enabled_field(body, proxy.enabled)
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
