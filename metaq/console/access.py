"""Who is using the console and what they may do: logins, sessions, CSRF, the admin check.

With ``--http-users FILE`` (the brokers' security file: the cluster's SCRAM users and their
ACLs) every page and API call needs a login. The password is checked by the HTTP gateway's
own checker (metaq/http/auth.py, ``HttpUsers``: the stored SCRAM secret, a decoy for unknown
names, the failed-login rate limits) and the user's rights are decided by the brokers' own
decider (``Authz.denial``): everyone logged in may look (describe); acting (a drill, a
promote, topics create/alter/delete, offsets reset) needs the ``admin`` permission, and a
user without it gets 403 and an action-less page. Without the file the console trusts
whoever reaches its port (it listens on 127.0.0.1 by default), as the CLI trusts whoever
runs it against a cluster with security off.

A login makes a session: a random token in an ``HttpOnly``, ``SameSite=Strict`` cookie
(``Secure`` over HTTPS) and a second random token, the CSRF token, that the page reads from
``/api/me`` and sends back in the ``X-CSRF-Token`` header of every action. A request that
changes anything (every method but GET and HEAD) needs both, and an ``Origin`` header, when
the browser sends one, naming this console: a page of another site can make the browser
send the cookie but can read neither token. Nothing secret reaches a page: the session
cookie is unreadable to scripts, and passwords never leave this process.

Sessions live in memory (a restart logs everyone out), at most ``MAX_SESSIONS``, each
until ``SESSION_IDLE_S`` without a request.
"""

from __future__ import annotations

import base64
import collections
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiohttp import web

from ..http.auth import HttpUsers, Refused
from ..protocol.messages import Operation
from ..security.principals import Principal

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

COOKIE = "metaq_console"
CSRF_HEADER = "X-CSRF-Token"
MAX_SESSIONS = 10_000
SESSION_IDLE_S = 12 * 3600.0
#: Paths anyone may fetch before logging in: the page itself (its login form), its assets, the login.
OPEN_PATHS = ("/", "/index.html", "/api/login")
OPEN_PREFIXES = ("/static/",)
SAFE_METHODS = ("GET", "HEAD")


@dataclass
class Session:
    token: str
    user: str | None  # None: the console requires no login (no --http-users)
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    seen: float = field(default_factory=time.monotonic)


#: Where a request carries its Session (a typed key where aiohttp has them: 3.12 on).
SESSION: Any = web.RequestKey("session", Session) if hasattr(web, "RequestKey") else "metaq_console.session"


class Access:
    def __init__(self, users: HttpUsers | None, https: bool) -> None:
        self.users = users
        self.https = https
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()

    @property
    def logins_required(self) -> bool:
        return self.users is not None

    # --- sessions ----------------------------------------------------------------------------

    def _new_session(self, user: str | None) -> Session:
        session = Session(secrets.token_urlsafe(32), user)
        self._sessions[session.token] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session

    def session_of(self, request: web.Request) -> Session | None:
        token = request.cookies.get(COOKIE)
        session = self._sessions.get(token or "")
        if session is None:
            return None
        now = time.monotonic()
        if now - session.seen > SESSION_IDLE_S:
            del self._sessions[session.token]
            return None
        session.seen = now
        self._sessions.move_to_end(session.token)
        return session

    def set_cookie(self, response: web.StreamResponse, session: Session) -> None:
        response.set_cookie(COOKIE, session.token, httponly=True, samesite="Strict", secure=self.https, path="/")

    async def login(self, request: web.Request, user: str, password: str) -> Session | Refused | None:
        """A new session for ``user`` if ``password`` is theirs; Refused (429) or None (wrong)."""
        assert self.users is not None
        header = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        principal = await self.users.authenticate(header, request.remote or "")
        if principal is None or isinstance(principal, Refused):
            return principal
        old = self.session_of(request)
        if old is not None:  # a new login gets new tokens (no session fixation)
            self._sessions.pop(old.token, None)
        return self._new_session(principal.name)

    def logout(self, session: Session) -> None:
        self._sessions.pop(session.token, None)

    def anonymous(self) -> Session:
        """A session for a console without logins: still needed for its CSRF token."""
        return self._new_session(None)

    # --- rights --------------------------------------------------------------------------------

    def action_denial(self, session: Session) -> str | None:
        """Why ``session``'s user may not act (None: may): the admin permission, decided by the brokers' ACL rules."""
        if self.users is None:
            return None
        assert session.user is not None
        return self.users.authz.denial(Principal(session.user), Operation.ADMIN)

    def me(self, session: Session) -> dict[str, Any]:
        """What the page may know about its user: no secret but its own CSRF token."""
        return {"user": session.user, "logins": self.logins_required, "admin": self.action_denial(session) is None,
                "csrf": session.csrf}

    # --- the middleware ----------------------------------------------------------------------

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        @web.middleware
        async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
            session = self.session_of(request)
            is_open = request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIXES)
            if request.method not in SAFE_METHODS:
                refusal = self._forged(request, session)
                if refusal is not None:
                    return web.json_response({"error": refusal}, status=403)
            if session is None and not is_open:
                if self.logins_required:
                    return web.json_response({"error": "log in first (a user of the cluster's security file)"}, status=401)
                session = self.anonymous()
                request[SESSION] = session
                response = await handler(request)
                self.set_cookie(response, session)
                return response
            if session is not None:
                request[SESSION] = session
            return await handler(request)

        return check

    def _forged(self, request: web.Request, session: Session | None) -> str | None:
        """Why a state-changing request may be a cross-site forgery (None: it is not)."""
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"{request.scheme}://{request.host}":
            return f"cross-site request refused (Origin {origin} is not this console)"
        if request.path == "/api/login":
            return None  # no session yet; the Origin check above covers a login forged from elsewhere
        if session is None:
            return "log in first (a user of the cluster's security file)" if self.logins_required else "no session: load the page first"
        sent = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(sent.encode(), session.csrf.encode()):
            return f"missing or wrong {CSRF_HEADER} header (reload the page)"
        return None


def session_of(request: web.Request) -> Session:
    return request[SESSION]
