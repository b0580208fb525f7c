"""The console's aiohttp application: the page, its assets, and the JSON API it reads and acts through.

    GET  /                                  the page (one HTML file; assets under /static/, uPlot vendored)
    GET  /api/me                            the user, whether they may act, the session's CSRF token
    POST /api/login, /api/logout            sessions (access.py)
    GET  /api/snapshot                      the latest snapshot (collector.py)
    GET  /api/events                        the same, pushed as server-sent events at every new snapshot
    GET  /api/history                       failover history per group (epochs, takeovers seen)
    GET  /api/groups/{group}/describe       ``metaq groups describe``'s rows (lag in messages counted)
    GET  /api/drills                        drills run or kept, newest first
    POST /api/drills                        start one (admin)
    GET  /api/drills/{id}                   its timeline, markers and report
    GET  /api/drills/{id}/chart.png         the chart kept with its report
    POST /api/drills/{id}/chart             keep the chart (admin; the page that watched it sends it)
    POST /api/promote                       ``metaq promote`` (admin)
    POST /api/topics/{create|alter|delete}  ``metaq topics ...`` (admin)
    POST /api/groups/reset-offsets          ``metaq groups reset-offsets`` (admin; a dry run unless execute)

Every error is ``{"error": "one line"}`` with a 4xx/5xx status; an action refused by the
user's rights is 403, by the CLI's checks 409 (exit 1) or 400 (exit 2), with its lines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from pathlib import Path
from typing import Any, Awaitable, Callable

from aiohttp import web

from ..errors import MetaqError
from .access import Access, session_of
from .actions import ActionError, ClusterLogin, promote_words, reset_words, run_cli, topic_words
from .collector import Collector
from .drills import DrillBusy, Drills

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
COLLECTOR = web.AppKey("collector", Collector)
ACCESS = web.AppKey("access", Access)
DRILLS = web.AppKey("drills", Drills)
LOGIN = web.AppKey("login", ClusterLogin)
#: Seconds an idle event stream waits before it sends the snapshot again (a keep-alive).
EVENTS_IDLE_S = 15.0
#: What the page may load and talk to: only this console (no CDN, no inline script).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(collector: Collector, access: Access, drills: Drills, login: ClusterLogin) -> web.Application:
    app = web.Application(middlewares=[_errors, access.middleware()], client_max_size=8 * 1024 * 1024)
    app[COLLECTOR], app[ACCESS], app[DRILLS], app[LOGIN] = collector, access, drills, login
    app.on_response_prepare.append(_security_headers)
    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC, show_index=False)
    app.router.add_get("/api/me", me)
    app.router.add_post("/api/login", login_route)
    app.router.add_post("/api/logout", logout)
    app.router.add_get("/api/snapshot", snapshot)
    app.router.add_get("/api/events", events)
    app.router.add_get("/api/history", history)
    app.router.add_get("/api/groups/{group}/describe", describe_group)
    app.router.add_get("/api/drills", list_drills)
    app.router.add_post("/api/drills", start_drill)
    app.router.add_get("/api/drills/{id}", drill_view)
    app.router.add_get("/api/drills/{id}/chart.png", drill_chart)
    app.router.add_post("/api/drills/{id}/chart", keep_chart)
    app.router.add_post("/api/promote", promote)
    app.router.add_post("/api/topics/{action}", topics_action)
    app.router.add_post("/api/groups/reset-offsets", reset_offsets)
    return app


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason}, status=exc.status)
    except (ActionError, MetaqError) as exc:
        return web.json_response({"error": str(exc)}, status=400)
    except Exception as exc:  # a bug: logged with its traceback; the page still gets one line
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response({"error": f"internal error: {type(exc).__name__}: {exc}"}, status=500)


async def _form(request: web.Request) -> dict[str, Any]:
    try:
        form = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise ActionError("the body must be a JSON object") from None
    if not isinstance(form, dict):
        raise ActionError("the body must be a JSON object")
    return form


def _may_act(request: web.Request) -> None:
    """403 unless the session's user holds the admin permission."""
    reason = request.app[ACCESS].action_denial(session_of(request))
    if reason is not None:
        raise web.HTTPForbidden(reason=reason)


# --- pages and sessions ---------------------------------------------------------------------


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})


async def me(request: web.Request) -> web.Response:
    return web.json_response(request.app[ACCESS].me(session_of(request)))


async def login_route(request: web.Request) -> web.Response:
    from ..http.auth import Refused

    access = request.app[ACCESS]
    if not access.logins_required:
        return web.json_response({"error": "this console requires no login (started without --http-users)"}, status=400)
    form = await _form(request)
    user, password = form.get("user"), form.get("password")
    if not isinstance(user, str) or not isinstance(password, str) or not user:
        raise ActionError("give 'user' and 'password'")
    session = await access.login(request, user, password)
    if isinstance(session, Refused):
        return web.json_response({"error": f"{session.reason}: retry after {session.retry_after_s} s"}, status=429,
                                 headers={"Retry-After": str(session.retry_after_s)})
    if session is None:
        return web.json_response({"error": "wrong user or password"}, status=401)
    response = web.json_response(access.me(session))
    access.set_cookie(response, session)
    return response


async def logout(request: web.Request) -> web.Response:
    request.app[ACCESS].logout(session_of(request))
    return web.json_response({"logged_out": True})


# --- what the pages show -------------------------------------------------------------------------


async def snapshot(request: web.Request) -> web.Response:
    return web.json_response(request.app[COLLECTOR].snapshot)


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: ``snapshot`` with the whole snapshot, at every new one."""
    collector = request.app[COLLECTOR]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    await response.prepare(request)
    seen = -1
    try:
        while True:
            current = await collector.wait_newer(seen, EVENTS_IDLE_S)
            seen = current.get("seq", 0)
            await response.write(b"event: snapshot\ndata: " + json.dumps(current).encode() + b"\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return response


async def history(request: web.Request) -> web.Response:
    return web.json_response({"groups": await request.app[COLLECTOR].history()})


async def describe_group(request: web.Request) -> web.Response:
    """``metaq groups describe --group G``'s rows, by its own function."""
    from ..cli.groups import _children, _describe, live_members, read_rows

    collector, group = request.app[COLLECTOR], request.match_info["group"]

    def read() -> tuple[list[Any], list[str]]:
        topics = _children(collector.client, f"{collector.paths.consumer_group(group)}/offsets")
        rows = [row for topic in topics for row in read_rows(collector.client, collector.paths, group, topic)]
        return rows, live_members(collector.client, collector.paths, group)

    rows, members = await asyncio.to_thread(read)
    if not rows and not members:
        raise web.HTTPNotFound(reason=f"no consumer group {group!r} with offsets under {collector.zk_root}")
    table = await _describe(rows, collector.timeout, collector.creds)
    keys = ("topic", "partition", "committed", "log_end", "lag_bytes", "lag_messages", "problem")
    return web.json_response({"group": group, "live_members": members, "partitions": [dict(zip(keys, row)) for row in table]})


# --- drills --------------------------------------------------------------------------------------


async def list_drills(request: web.Request) -> web.Response:
    return web.json_response({"drills": request.app[DRILLS].reports()})


async def start_drill(request: web.Request) -> web.Response:
    _may_act(request)
    form = await _form(request)
    broker_id = form.get("broker_id")
    if not isinstance(broker_id, int) or isinstance(broker_id, bool) or broker_id < 0:
        raise ActionError("'broker_id' must be a broker group id")
    if str(form.get("confirm", "")).strip() != str(broker_id):
        raise ActionError(f"not confirmed: type the broker group id {broker_id!r} to confirm")
    rate = form.get("rate", 200)
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 < rate <= 10_000:
        raise ActionError("'rate' must be messages per second, above 0 and at most 10000")
    topic = form.get("topic") or None
    if topic is not None and not isinstance(topic, str):
        raise ActionError("'topic' must be a topic name")
    try:
        live = request.app[DRILLS].start(broker_id, str(form.get("fault", "kill")), topic, float(rate), session_of(request).user)
    except DrillBusy as exc:
        return web.json_response({"error": str(exc)}, status=409)
    return web.json_response(live.view(), status=202)


async def drill_view(request: web.Request) -> web.Response:
    view = request.app[DRILLS].view(request.match_info["id"])
    if view is None:
        raise web.HTTPNotFound(reason=f"no drill {request.match_info['id']!r}")
    return web.json_response(view)


async def drill_chart(request: web.Request) -> web.StreamResponse:
    path = request.app[DRILLS].chart_path(request.match_info["id"])
    if path is None:
        raise web.HTTPNotFound(reason=f"no chart kept for drill {request.match_info['id']!r}")
    return web.FileResponse(path, headers={"Content-Type": "image/png"})


async def keep_chart(request: web.Request) -> web.Response:
    _may_act(request)
    refusal = request.app[DRILLS].save_chart(request.match_info["id"], await request.read())
    if refusal is not None:
        raise ActionError(refusal)
    return web.json_response({"kept": True})


# --- operations: the CLI's commands --------------------------------------------------------------


async def _run(request: web.Request, words: list[str], broker_id: int | None = None) -> web.Response:
    result = await run_cli(request.app[LOGIN], words, broker_id)
    log.info("console: %s by %s: exit %d", " ".join(words[:2]), session_of(request).user or "(no login)", result.exit_code)
    return web.json_response(result.json(), status=result.http_status)


async def promote(request: web.Request) -> web.Response:
    _may_act(request)
    words, broker_id = promote_words(await _form(request))
    return await _run(request, words, broker_id)


async def topics_action(request: web.Request) -> web.Response:
    _may_act(request)
    words, broker_id = topic_words(request.match_info["action"], await _form(request))
    return await _run(request, words, broker_id)


async def reset_offsets(request: web.Request) -> web.Response:
    _may_act(request)
    return await _run(request, reset_words(await _form(request)))


# --- running -----------------------------------------------------------------------------------


async def serve(collector: Collector, access: Access, drills: Drills, login: ClusterLogin, host: str, port: int,
                ready: Callable[[str], None] | None = None, *, ssl_context: ssl.SSLContext | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (SIGINT/SIGTERM set it when none is given); ``ready`` gets the URL."""
    from ..http.app import serve_app

    # An open page's event stream never ends by itself: stopping does not wait for it.
    await serve_app(build_app(collector, access, drills, login), host, port, ready, ssl_context=ssl_context, stop=stop,
                    shutdown_timeout=1.0)
