"""Who an HTTP client is and what it may do, when ``metaq http --http-users FILE`` is given.

The file is the brokers' security file (``securityConfig``): the same users, passwords and
ACLs. A request carries ``Authorization: Basic`` (the gateway serves HTTPS whenever users
are required, so the password never crosses the network in the clear); the password is
checked against the stored SCRAM secret, then the route's operation against the user's
ACL with the brokers' own Authorizer:

    GET  /topics, /topics/{topic}                         describe
    POST /topics/{topic}/messages                         produce on {topic}
    GET  /topics/{topic}/partitions/{p}/offsets|messages  consume on {topic}

An unknown user and a wrong password get the same 401 after the same work (a decoy secret
is checked for an unknown name). A verified password is remembered as a salted hash for
the life of the process, so each request does not pay the PBKDF2 again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from typing import Awaitable, Callable

from aiohttp import web

from ..security.acl import Authorizer, Operation
from ..security.credentials import SecurityFile
from ..security.principals import Principal
from ..security.scram import decoy_secret

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Verified (user, password) pairs remembered at most; past it the memory starts over.
MAX_REMEMBERED = 4096
_ROUTES = {
    "/topics": Operation.DESCRIBE,
    "/topics/{topic}": Operation.DESCRIBE,
    "/topics/{topic}/messages": Operation.PRODUCE,
    "/topics/{topic}/partitions/{partition}/offsets": Operation.CONSUME,
    "/topics/{topic}/partitions/{partition}/messages": Operation.CONSUME,
}
_CHALLENGE = {"WWW-Authenticate": 'Basic realm="metaq", charset="UTF-8"'}


class HttpUsers:
    def __init__(self, users: SecurityFile) -> None:
        self.users = users
        # Brokers are never HTTP users (their names are reserved): no group to name.
        self.authorizer = Authorizer(-1, users.acls())
        self._key = os.urandom(32)
        self._decoy = os.urandom(32)
        self._verified: set[bytes] = set()

    @classmethod
    def load(cls, path: str) -> "HttpUsers":
        return cls(SecurityFile.load(path))

    def authenticate(self, header: str | None) -> Principal | None:
        """The user an ``Authorization`` header proves, or None."""
        credentials = _basic(header)
        if credentials is None:
            return None
        name, password = credentials
        fingerprint = hmac.new(self._key, f"{name}\0{password}".encode(), hashlib.sha256).digest()
        if fingerprint in self._verified:
            return Principal(name)
        secret = self.users.secret_for(name) or decoy_secret(name, self._decoy)
        if name not in self.users.users or not secret.verifies(password):
            return None
        if len(self._verified) >= MAX_REMEMBERED:
            self._verified.clear()
        self._verified.add(fingerprint)
        return Principal(name)

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        @web.middleware
        async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
            principal = self.authenticate(request.headers.get("Authorization"))
            if principal is None:
                return web.json_response({"error": "authentication required: HTTP Basic with a user of the gateway's --http-users file"},
                                         status=401, headers=_CHALLENGE)
            route = request.match_info.route.resource
            operation = _ROUTES.get(route.canonical) if route is not None else None
            if operation is not None:
                reason = self.authorizer.denial(principal, operation, request.match_info.get("topic"))
                if reason is not None:
                    return web.json_response({"error": reason}, status=403)
            return await handler(request)

        return authorize


def _basic(header: str | None) -> tuple[str, str] | None:
    """``Basic base64(user:password)`` -> (user, password); None for anything else."""
    if not header or not header[:6].lower() == "basic ":
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    name, sep, password = decoded.partition(":")
    return (name, password) if sep and name else None
