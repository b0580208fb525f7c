"""HTTP logins at the gateway (``--http-users``): Basic credentials checked against the security
file's SCRAM secrets, then the route's operation against the user's ACL (a stub gateway)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from metaq.http.app import build_app
from metaq.http.auth import _ROUTES, HttpUsers, LoginLimiter
from metaq.security.credentials import SecurityFile
from metaq.security.scram import make_secret


class _Gateway:
    max_message_size = 1024

    async def topic_names(self) -> list[str]:
        return ["orders"]

    async def produce(self, topic: str, messages: list[Any]) -> list[Any]:
        raise AssertionError("a denied produce reached the gateway")


def users() -> HttpUsers:
    security = SecurityFile({})
    security.add_user("app", "app-pw", produce="orders", consume="orders")
    security.add_user("reader", "reader-pw", consume="*")
    return HttpUsers(security)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_passwords_are_checked_and_unknown_users_look_like_wrong_passwords() -> None:
    http = users()
    login = lambda header: asyncio.run(http.authenticate(header, "10.0.0.1"))  # noqa: E731
    assert login(basic("app", "app-pw")["Authorization"]).name == "app"  # type: ignore[union-attr]
    assert login(basic("app", "app-pw")["Authorization"]).name == "app"  # type: ignore[union-attr]  # remembered
    for header in (basic("app", "guess"), basic("nobody", "app-pw"), basic("app", ""), {"Authorization": "Bearer x"},
                   {"Authorization": "Basic !!!"}, {"Authorization": "Basic " + base64.b64encode(b"no-colon").decode()}):
        assert login(header["Authorization"]) is None, header
    assert login(None) is None
    http.close()


def test_login_limiter_buckets_refill_at_the_rate_and_forget_the_oldest_keys() -> None:
    now = [0.0]
    limiter = LoginLimiter(burst=3, rate=0.5, max_keys=2, clock=lambda: now[0])
    for _ in range(3):
        assert limiter.wait_s("a") == 0
        limiter.take("a")
    assert limiter.wait_s("a") == 2.0  # one token at 0.5/s
    now[0] = 1.0
    assert limiter.wait_s("a") == 1.0
    limiter.give_back("a")  # a success returns its token
    assert limiter.wait_s("a") == 0
    now[0] = 100.0
    limiter.take("a")
    assert limiter._tokens("a") == 2  # refilled to the burst, never above
    limiter.take("b")
    limiter.take("c")  # a third key: the oldest ("a") goes, and starts full again
    assert limiter._tokens("a") == 3 and limiter._tokens("c") == 2


def test_a_secret_verifies_only_its_own_password() -> None:
    secret = make_secret("right", 4096)
    assert secret.verifies("right") and not secret.verifies("wrong") and not secret.verifies("")


def test_every_route_has_an_operation() -> None:
    served = {r.resource.canonical for r in build_app(_Gateway()).router.routes()}  # type: ignore[arg-type]
    assert served == set(_ROUTES)


def test_requests_need_a_login_and_an_acl() -> None:
    async def scenario() -> None:
        async with TestClient(TestServer(build_app(_Gateway(), users=users()))) as client:  # type: ignore[arg-type]
            anonymous = await client.get("/topics")
            assert anonymous.status == 401 and anonymous.headers["WWW-Authenticate"].startswith("Basic")
            assert (await client.get("/topics", headers=basic("app", "guess"))).status == 401
            listed = await client.get("/topics", headers=basic("reader", "reader-pw"))
            assert listed.status == 200 and (await listed.json())["topics"] == ["orders"]
            denied = await client.post("/topics/orders/messages", json={"data": "x"}, headers=basic("reader", "reader-pw"))
            assert denied.status == 403 and "may not produce topic 'orders'" in (await denied.json())["error"]

    asyncio.run(scenario())
