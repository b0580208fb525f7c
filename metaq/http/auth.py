"""Who an HTTP client is and what it may do, when ``metaq http --http-users FILE`` is given.

The file is the brokers' security file (``securityConfig``): the same users, passwords and
ACLs. A request carries ``Authorization: Basic`` (the gateway serves HTTPS whenever users
are required, so the password never crosses the network in the clear); the password is
checked against the stored SCRAM secret, then the route's operation against the user's
ACL by the brokers' own decider (metaq/server/authz.py, ``Authz.denial``):

    GET  /topics, /topics/{topic}                         describe
    POST /topics/{topic}/messages                         produce on {topic}
    GET  /topics/{topic}/partitions/{p}/offsets|messages  consume on {topic}

An unknown user and a wrong password get the same 401 after the same work: a decoy secret,
with the iteration count most of the file's users have, is checked for an unknown name. The
check (a PBKDF2, milliseconds on purpose) runs in a small thread pool, never on the event
loop, so a client hammering wrong passwords does not stall the other clients' requests.
A verified password is remembered as a keyed hash for the life of the process, so each
request does not pay the PBKDF2 again.

Password checks are rate-limited per client address and per user name (token buckets,
``LoginLimiter``): each check takes a token from both, a successful one gives them back,
so only failures use them up. With either bucket empty the request is refused with 429 and
``Retry-After`` before any work. A user whose password this process already verified is
never limited (its request costs no check): an attacker guessing at a user's password
cannot lock out that user's running clients.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import hashlib
import hmac
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiohttp import web

from ..protocol.messages import Operation
from ..security.acl import Authorizer
from ..security.credentials import SecurityFile
from ..security.principals import Principal
from ..security.scram import DEFAULT_ITERATIONS, decoy_secret
from ..server.authz import Authz, FixedRules

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Verified (user, password) pairs remembered at most; past it the memory starts over.
MAX_REMEMBERED = 4096
#: Failed logins one client address, or one user name, may have in a burst; then this many per second.
DEFAULT_FAILURE_BURST = 10
DEFAULT_FAILURE_RATE = 1.0
#: Threads checking passwords: PBKDF2 releases the GIL, so two use two cores and leave the loop free.
CHECK_THREADS = 2
#: Checks queued or running at most, all clients together; past it a login waits for a 429's Retry-After.
MAX_PENDING_CHECKS = 64
_ROUTES = {
    "/topics": Operation.DESCRIBE,
    "/topics/{topic}": Operation.DESCRIBE,
    "/topics/{topic}/messages": Operation.PRODUCE,
    "/topics/{topic}/partitions/{partition}/offsets": Operation.CONSUME,
    "/topics/{topic}/partitions/{partition}/messages": Operation.CONSUME,
}
_CHALLENGE = {"WWW-Authenticate": 'Basic realm="metaq", charset="UTF-8"'}


class LoginLimiter:
    """Token buckets by key (a client address, or a user name): ``burst`` tokens, ``rate`` back per second.

    At most ``max_keys`` buckets are kept (the oldest touched go first), so a flood of
    made-up user names cannot grow the table without bound; a bucket dropped that way
    starts full again, which the other limiter (by address) still covers.
    """

    def __init__(self, burst: int, rate: float, max_keys: int = 16384, clock: Callable[[], float] = time.monotonic) -> None:
        if burst < 1 or rate <= 0:
            raise ValueError(f"a login limit needs a burst >= 1 and a rate > 0, got {burst} and {rate}")
        self.burst, self.rate, self.max_keys, self._clock = burst, rate, max_keys, clock
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def _tokens(self, key: str) -> float:
        tokens, since = self._buckets.get(key, (float(self.burst), 0.0))
        return min(float(self.burst), tokens + (self._clock() - since) * self.rate)

    def _set(self, key: str, tokens: float) -> None:
        self._buckets[key] = (tokens, self._clock())
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)

    def wait_s(self, key: str) -> float:
        """Seconds until ``key`` has a token; 0 when it has one now."""
        tokens = self._tokens(key)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def take(self, key: str) -> None:
        self._set(key, self._tokens(key) - 1)

    def give_back(self, key: str) -> None:
        self._set(key, min(float(self.burst), self._tokens(key) + 1))


@dataclass(frozen=True)
class Refused:
    """A login not checked at all: too many recent failures (or checks pending); retry after ``retry_after_s``."""

    retry_after_s: int
    reason: str


class HttpUsers:
    def __init__(self, users: SecurityFile, *, failure_burst: int = DEFAULT_FAILURE_BURST,
                 failure_rate: float = DEFAULT_FAILURE_RATE) -> None:
        self.users = users
        # Brokers are never HTTP users (their names are reserved): no group to name.
        self.authz = Authz(FixedRules(Authorizer(-1, users.acls())))
        self._key = os.urandom(32)
        self._decoy = os.urandom(32)
        # The decoy costs what most users' checks cost: the iteration count they have.
        counts = collections.Counter(user.secret.iterations for user in users.users.values())
        self._decoy_iterations = counts.most_common(1)[0][0] if counts else DEFAULT_ITERATIONS
        self._verified: set[bytes] = set()
        self.by_address = LoginLimiter(failure_burst, failure_rate)
        self.by_user = LoginLimiter(failure_burst, failure_rate)
        self._checker = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="metaq-http-login")
        self._pending_checks = 0

    @classmethod
    def load(cls, path: str, **limits: float) -> "HttpUsers":
        return cls(SecurityFile.load(path), **limits)  # type: ignore[arg-type]

    def close(self) -> None:
        self._checker.shutdown(wait=False, cancel_futures=True)

    def _fingerprint(self, name: str, password: str) -> bytes:
        return hmac.new(self._key, f"{name}\0{password}".encode(), hashlib.sha256).digest()

    def check_password(self, name: str, password: str) -> bool:
        """The PBKDF2 check (slow, blocking): the same work whether ``name`` exists or not."""
        known = self.users.secret_for(name)
        secret = known or decoy_secret(name, self._decoy, self._decoy_iterations)
        # verifies() first, always: skipping it for an unknown name is what told names apart.
        return secret.verifies(password) and known is not None

    async def authenticate(self, header: str | None, address: str) -> Principal | Refused | None:
        """The user an ``Authorization`` header proves; Refused (429) before any check; or None (401)."""
        credentials = _basic(header)
        if credentials is None:
            return None
        name, password = credentials
        fingerprint = self._fingerprint(name, password)
        if fingerprint in self._verified:
            return Principal(name)
        wait = max(self.by_address.wait_s(address), self.by_user.wait_s(name))
        if wait > 0:
            return Refused(math.ceil(wait), "too many failed logins from this address or for this user")
        if self._pending_checks >= MAX_PENDING_CHECKS:
            return Refused(1, "too many logins being checked")
        # The tokens are taken before the check, so concurrent attempts cannot all pass the
        # test above before the first failure is counted; a success gives them back.
        self.by_address.take(address)
        self.by_user.take(name)
        self._pending_checks += 1
        try:
            verified = await asyncio.get_running_loop().run_in_executor(self._checker, self.check_password, name, password)
        finally:
            self._pending_checks -= 1
        if not verified:
            return None
        self.by_address.give_back(address)
        self.by_user.give_back(name)
        if len(self._verified) >= MAX_REMEMBERED:
            self._verified.clear()
        self._verified.add(fingerprint)
        return Principal(name)

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        @web.middleware
        async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
            principal = await self.authenticate(request.headers.get("Authorization"), request.remote or "")
            if isinstance(principal, Refused):
                return web.json_response({"error": f"{principal.reason}: retry after {principal.retry_after_s} s"},
                                         status=429, headers={"Retry-After": str(principal.retry_after_s)})
            if principal is None:
                return web.json_response({"error": "authentication required: HTTP Basic with a user of the gateway's --http-users file"},
                                         status=401, headers=_CHALLENGE)
            route = request.match_info.route.resource
            operation = _ROUTES.get(route.canonical) if route is not None else None
            if operation is not None:
                reason = self.authz.denial(principal, operation, request.match_info.get("topic"))
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
