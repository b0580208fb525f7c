"""The aiohttp application: routes, content negotiation, errors as JSON (docs/http-openapi.yaml).

    GET  /topics                                              topic names
    GET  /topics/{topic}                                      partitions, replicas, writable
    POST /topics/{topic}/messages                             produce (JSON, or one raw message)
    GET  /topics/{topic}/partitions/{partition}/offsets       first and committed offset [, the offset for ?time=MS]
    GET  /topics/{topic}/partitions/{partition}/messages      fetch at ?offset= or ?time=MS (JSON, or one raw message)

Every error is ``{"error": "one line"}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from typing import Any, Awaitable, Callable
from urllib.parse import quote

from aiohttp import web

from .. import __version__
from ..client.config import READ_FROM_CHOICES
from ..client.message import Message
from .bodies import (
    ENCODINGS,
    checked_message,
    choice_param,
    int_param,
    message_json,
    messages_from_json,
    parse_json,
    parse_partition,
    produce_status,
    send_result_json,
)
from .auth import HttpUsers
from .errors import HttpError
from .gateway import MAX_WAIT_MS, FetchResult, Gateway

log = logging.getLogger(__name__)

GATEWAY = web.AppKey("gateway", Gateway)
MAX_REQUEST_BYTES = web.AppKey("max_request_bytes", int)
#: Largest request body by default: a batch of JSON messages, base64 included.
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
DEFAULT_FETCH_BYTES = 1024 * 1024
MAX_FETCH_BYTES = 64 * 1024 * 1024
RAW = "application/octet-stream"
#: Largest ``time`` query parameter (ms since 1970): what an int64 holds.
MAX_TIME_MS = 2**63 - 1

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(gateway: Gateway, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, users: HttpUsers | None = None) -> web.Application:
    """The routes; with ``users``, every request must log in and pass the user's ACL (http/auth.py)."""
    middlewares = [_errors] if users is None else [_errors, users.middleware()]
    app = web.Application(client_max_size=max_request_bytes, middlewares=middlewares)
    app[GATEWAY] = gateway
    app[MAX_REQUEST_BYTES] = max_request_bytes
    app.router.add_get("/topics", list_topics)
    app.router.add_get("/topics/{topic}", describe_topic)
    app.router.add_post("/topics/{topic}/messages", produce)
    app.router.add_get("/topics/{topic}/partitions/{partition}/offsets", offsets)
    app.router.add_get("/topics/{topic}/partitions/{partition}/messages", fetch)
    return app


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except HttpError as exc:
        headers = {}
        if exc.status == 301:  # MetaQ's "moved": the same request at the offset the broker named
            url = request.rel_url
            if "time" in url.query:  # a fetch asked by time goes on by offset: its time's messages went with the log start
                url = url.with_query([(k, v) for k, v in url.query.items() if k != "time"])
            headers["Location"] = str(url.update_query(offset=exc.extra["offset"]))
        return web.json_response(exc.body(), status=exc.status, headers=headers)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[MAX_REQUEST_BYTES]
        return web.json_response({"error": f"request body larger than {limit} bytes"}, status=413)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason}, status=exc.status)
    except Exception as exc:  # a bug: logged with its traceback; the client still gets one line
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response(HttpError(500, f"internal error: {type(exc).__name__}: {exc}").body(), status=500)


# --- handlers ---------------------------------------------------------------------------------


async def list_topics(request: web.Request) -> web.Response:
    return web.json_response({"topics": await request.app[GATEWAY].topic_names(), "version": __version__})


async def describe_topic(request: web.Request) -> web.Response:
    topic = request.match_info["topic"]
    return web.json_response({"topic": topic, "partitions": await request.app[GATEWAY].describe(topic)})


async def produce(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    topic = request.match_info["topic"]
    body = await request.read()
    if request.content_type == RAW:
        attribute = request.query.get("attribute")
        messages = [checked_message(Message(topic, body, attribute), "message", gateway.max_message_size)]
    elif request.content_type == "application/json":
        messages = messages_from_json(topic, parse_json(body), gateway.max_message_size)
    else:
        raise HttpError(415, f"Content-Type must be application/json or {RAW}, got {request.content_type!r}")
    results = await gateway.produce(topic, messages)
    return web.json_response({"results": [send_result_json(r) for r in results]}, status=produce_status(results))


async def offsets(request: web.Request) -> web.Response:
    topic, partition = request.match_info["topic"], parse_partition(request.match_info["partition"])
    read_from = choice_param(request.query, "read_from", READ_FROM_CHOICES, "master")
    gateway = request.app[GATEWAY]
    if "time" not in request.query:
        replica, reply = await gateway.offsets(topic, partition, read_from)
        return web.json_response({
            "topic": topic, "partition": str(partition), "replica": replica.role, "broker": replica.address,
            "min_offset": int(reply["min_offset"]), "max_offset": int(reply["max_offset"]),
        })
    time_ms = int_param(request.query, "time", None, 0, MAX_TIME_MS)
    replica, reply = await gateway.offset_for_time(topic, partition, time_ms, read_from)
    return web.json_response({
        "topic": topic, "partition": str(partition), "replica": replica.role, "broker": replica.address,
        "min_offset": int(reply["min_offset"]), "max_offset": int(reply["max_offset"]),
        "time": time_ms, "offset": int(reply["offset"]), "latest": bool(reply.get("latest")),
    })


async def fetch(request: web.Request) -> web.Response:
    topic, partition = request.match_info["topic"], parse_partition(request.match_info["partition"])
    query = request.query
    read_from = choice_param(query, "read_from", READ_FROM_CHOICES, "master")
    if ("offset" in query) == ("time" in query):
        raise HttpError(400, "give exactly one of the query parameters 'offset' and 'time' (ms since 1970)")
    if "time" in query:
        # The first message at or after the time (the end when none is that late: a long poll there waits for new ones).
        _, answer = await request.app[GATEWAY].offset_for_time(topic, partition, int_param(query, "time", None, 0, MAX_TIME_MS), read_from)
        offset = int(answer["offset"])
    else:
        offset = int_param(query, "offset", None, 0, 2**63 - 1)
    max_bytes = int_param(query, "max_bytes", DEFAULT_FETCH_BYTES, 1, MAX_FETCH_BYTES)
    wait_ms = int_param(query, "wait_ms", 0, 0, MAX_WAIT_MS)
    encoding = choice_param(query, "encoding", ENCODINGS, "base64")
    raw = RAW in request.headers.get("Accept", "")
    result = await request.app[GATEWAY].fetch(topic, partition, offset, max_bytes, wait_ms, read_from)
    return _raw_message(result, partition) if raw else _json_messages(result, topic, partition, encoding)


def _json_messages(result: FetchResult, topic: str, partition: Any, encoding: str) -> web.Response:
    return web.json_response({
        "topic": topic,
        "partition": str(partition),
        "replica": result.replica.role,
        "broker": result.replica.address,
        "offset": result.offset,
        "next_offset": result.next_offset,
        "committed": result.committed,
        "messages": [message_json(m, end, encoding) for m, end in zip(result.messages, result.ends)],
    })


def _raw_message(result: FetchResult, partition: Any) -> web.Response:
    """The first message's bytes; where it is (and where the next one is) in headers."""
    headers = {
        "X-Metaq-Partition": str(partition),
        "X-Metaq-Replica": result.replica.role,
        "X-Metaq-Committed": str(result.committed),
    }
    if not result.messages:
        return web.Response(status=204, headers={**headers, "X-Metaq-Next-Offset": str(result.next_offset)})
    message = result.messages[0]
    headers.update({
        "X-Metaq-Offset": str(message.offset),
        "X-Metaq-Next-Offset": str(result.ends[0]),
        "X-Metaq-Msg-Id": str(message.id),
    })
    if message.attribute is not None:
        headers["X-Metaq-Attribute"] = quote(message.attribute, safe="")  # percent-encoded UTF-8
    return web.Response(body=message.data, content_type=RAW, headers=headers)


# --- running ---------------------------------------------------------------------------------


async def serve(gateway: Gateway, host: str, port: int, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                ready: Callable[[str], None] | None = None, *, ssl_context: ssl.SSLContext | None = None,
                users: HttpUsers | None = None) -> None:
    """Serve until SIGINT/SIGTERM (HTTPS with ``ssl_context``; logins with ``users``); ``ready`` gets the URL once the port is open."""
    try:
        await serve_app(build_app(gateway, max_request_bytes, users), host, port, ready, ssl_context=ssl_context)
    finally:
        if users is not None:
            users.close()


async def serve_app(app: web.Application, host: str, port: int, ready: Callable[[str], None] | None = None, *,
                    ssl_context: ssl.SSLContext | None = None, stop: asyncio.Event | None = None,
                    shutdown_timeout: float = 60.0) -> None:
    """Serve ``app`` until ``stop`` is set (without one: until SIGINT/SIGTERM); ``ready`` gets the
    URL once the port is open; requests still running then get ``shutdown_timeout`` seconds.
    ``metaq http`` and ``metaq console`` both run this way."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        if ready is not None:
            bound_host, bound_port = runner.addresses[0][:2]
            ready(f"{'https' if ssl_context else 'http'}://{bound_host}:{bound_port}/")
        if stop is None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
