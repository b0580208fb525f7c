"""The web console's parts that need no cluster: forms to CLI words, sessions and CSRF on a real
aiohttp server, the admin check by the ACL rules, the drill timeline's buckets, the command's
usage errors. The console against a real cluster, in a real browser: tests/browser."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from metaq.console.access import CSRF_HEADER, Access
from metaq.console.actions import ActionError, ClusterLogin, CommandResult, promote_words, reset_words, topic_words
from metaq.console.drills import BUCKET_S, _timeline
from metaq.http.auth import HttpUsers
from metaq.security.credentials import SecurityFile

REPO = Path(__file__).resolve().parents[2]


def test_a_form_value_never_passes_for_an_option() -> None:
    words, broker_id = topic_words("create", {"broker_id": 0, "topic": "--execute", "partitions": "2", "settings": ["a=1"], "confirm": "--execute"})
    assert broker_id == 0
    assert words == ["topics", "create", "--broker-id=0", "--topic=--execute", "--partitions=2", "--set=a=1"]


@pytest.mark.parametrize("form, why", [
    ({"broker_id": 0, "topic": "t"}, "type the topic 't' to confirm"),
    ({"broker_id": 0, "topic": "t", "confirm": "u"}, "type the topic 't' to confirm"),
    ({"broker_id": "x", "topic": "t", "confirm": "t"}, "'broker_id' must be a whole number"),
    ({"broker_id": 0, "topic": "t", "confirm": "t", "settings": "a=1"}, "'settings' must be a list"),
])
def test_a_topic_form_without_its_confirmation_or_with_a_bad_field_is_refused(form: dict, why: str) -> None:
    with pytest.raises(ActionError, match=why):
        topic_words("alter", form)


def test_promote_and_reset_confirm_by_name() -> None:
    with pytest.raises(ActionError, match="type the broker group id '0'"):
        promote_words({"broker_id": 0, "slave": 1, "confirm": "1"})
    assert promote_words({"broker_id": 0, "slave": 1, "confirm": "0", "unclean": True})[0] == [
        "promote", "--broker-id=0", "--slave=1", "--unclean"]
    # A dry run needs no confirmation; executing names the consumer group.
    assert reset_words({"group": "billing", "topic": "orders", "target": "latest"}) == [
        "groups", "reset-offsets", "--group=billing", "--topic=orders", "--to-latest"]
    with pytest.raises(ActionError, match="type the consumer group 'billing'"):
        reset_words({"group": "billing", "topic": "*", "target": "shift", "value": "-5", "execute": True})
    assert reset_words({"group": "billing", "topic": "*", "target": "shift", "value": "-5", "execute": True, "confirm": "billing"}) == [
        "groups", "reset-offsets", "--group=billing", "--all-topics", "--shift-by=-5", "--execute"]
    with pytest.raises(ActionError, match="unknown target"):
        reset_words({"group": "billing", "target": "yesterday"})


def test_the_password_goes_on_stdin_and_never_into_the_command_shown() -> None:
    login = ClusterLogin("127.0.0.1:2181", "/meta", "ops", "s3cret", None, ((0, "/etc/group.secret"),))
    words = login.argv(0)
    assert "--password-file=/dev/stdin" in words and "--group-secret=/etc/group.secret" in words
    assert not any("s3cret" in w for w in words)
    assert "--group-secret=/etc/group.secret" not in login.argv(1)
    shown = CommandResult(["promote", "--broker-id=0", "--user=ops"], 1, "", "metaq promote: error: ...").json()
    assert shown["command"] == "metaq promote --broker-id=0 --user=ops"
    assert CommandResult([], 1, "", "").http_status == 409 and CommandResult([], 2, "", "").http_status == 400


def _users(tmp_path: Path) -> HttpUsers:
    security = SecurityFile({}, str(tmp_path / "security.ini"))
    security.add_user("ops", "ops-password", admin=True)
    security.add_user("viewer", "viewer-password")
    security.save()
    return HttpUsers.load(str(tmp_path / "security.ini"))


async def _client(access: Access) -> TestClient:
    async def me(request: web.Request) -> web.Response:
        from metaq.console.access import session_of

        return web.json_response(access.me(session_of(request)))

    async def act(request: web.Request) -> web.Response:
        from metaq.console.access import session_of

        reason = access.action_denial(session_of(request))
        return web.json_response({"error": reason}, status=403) if reason else web.json_response({"done": True})

    async def login(request: web.Request) -> web.Response:
        form = await request.json()
        session = await access.login(request, form["user"], form["password"])
        if session is None:
            return web.json_response({"error": "wrong"}, status=401)
        response = web.json_response(access.me(session))
        access.set_cookie(response, session)
        return response

    app = web.Application(middlewares=[access.middleware()])
    app.router.add_get("/api/me", me)
    app.router.add_post("/api/act", act)
    app.router.add_post("/api/login", login)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


def test_without_logins_an_action_still_needs_the_sessions_csrf_token() -> None:
    async def scenario() -> None:
        client = await _client(Access(None, https=False))
        try:
            assert (await client.post("/api/act")).status == 403  # no session at all
            me = await (await client.get("/api/me")).json()
            assert me["admin"] is True and me["user"] is None and len(me["csrf"]) > 20
            refused = await client.post("/api/act")
            assert refused.status == 403 and "X-CSRF-Token" in (await refused.json())["error"]
            assert (await client.post("/api/act", headers={CSRF_HEADER: "wrong"})).status == 403
            foreign = await client.post("/api/act", headers={CSRF_HEADER: me["csrf"], "Origin": "https://evil.example"})
            assert foreign.status == 403 and "cross-site" in (await foreign.json())["error"]
            assert (await client.post("/api/act", headers={CSRF_HEADER: me["csrf"]})).status == 200
        finally:
            await client.close()

    asyncio.run(scenario())


def test_with_logins_the_acl_decides_who_acts(tmp_path: Path) -> None:
    users = _users(tmp_path)

    async def scenario() -> None:
        client = await _client(Access(users, https=False))
        try:
            assert (await client.get("/api/me")).status == 401
            assert (await client.post("/api/login", json={"user": "ops", "password": "nope"})).status == 401
            viewer = await (await client.post("/api/login", json={"user": "viewer", "password": "viewer-password"})).json()
            assert viewer["admin"] is False
            denied = await client.post("/api/act", headers={CSRF_HEADER: viewer["csrf"]})
            assert denied.status == 403 and "lacks the admin permission" in (await denied.json())["error"]
            ops = await (await client.post("/api/login", json={"user": "ops", "password": "ops-password"})).json()
            assert ops["admin"] is True and ops["csrf"] != viewer["csrf"]  # a new login, new tokens
            assert (await client.post("/api/act", headers={CSRF_HEADER: viewer["csrf"]})).status == 403  # the old session's token
            assert (await client.post("/api/act", headers={CSRF_HEADER: ops["csrf"]})).status == 200
        finally:
            await client.close()
            users.close()

    asyncio.run(scenario())


@dataclass
class _Ack:
    at: float
    sent_at: float


def test_the_timeline_buckets_acks_by_arrival_with_their_latency() -> None:
    acks = [_Ack(10.05, 10.0), _Ack(10.10, 10.0), _Ack(10.8, 10.2)]  # two in the first bucket, one in the fourth
    timeline = _timeline(acks, 10.0)
    assert timeline["t"] == [0.0, 0.25, 0.5, 0.75]
    assert timeline["rate"] == [2 / BUCKET_S, 0.0, 0.0, 1 / BUCKET_S]
    assert timeline["latency_p50"][0] == pytest.approx(75.0) and timeline["latency_max"][0] == pytest.approx(100.0)
    assert timeline["latency_p50"][1] is None and timeline["latency_max"][3] == pytest.approx(600.0)
    assert _timeline([], 0.0) == {"t": [], "rate": [], "latency_p50": [], "latency_max": []}


@pytest.mark.parametrize("args, line", [
    (["--group-secret", "zero=/x"], "--group-secret expects ID=FILE"),
    (["--group-secret", "0=/no/such/file"], "no such file"),
    (["--host", "0.0.0.0", "--http-users", "/no/such/file"], "--http-users needs --tls-cert and --tls-key"),
    (["--tls-cert", "/x.pem"], "--tls-cert and --tls-key go together"),
    (["--port", "70000"], "--port"),
])
def test_console_usage_errors_are_one_line_and_exit_2(args: list[str], line: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "metaq", "console", "--zk", "127.0.0.1:1", *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert line in proc.stderr and "Traceback" not in proc.stderr


def test_a_takeover_record_that_disagrees_with_the_groups_epochs_is_flagged_not_hidden() -> None:
    from metaq.console.collector import _reported

    def entry(**record: object) -> dict:
        return {"record": {"epoch": 3, "url": "meta://b:1", "why": "w", "previous_epoch": 2, **record},
                "truncated": {0: {"partitions": {"t-0-0": 7}}}, "malformed": []}

    node = (3, "meta://b:1", 0)
    good = _reported(3, entry(), {1, 2, 3}, node)
    assert good["doubt"] is None and good["reported"] and good["truncated_bytes"] == 7 and good["master"] == "meta://b:1"
    assert "names epoch 4" in _reported(3, entry(epoch=4), {3}, node)["doubt"]
    assert "is not older" in _reported(3, entry(previous_epoch=3), {3}, node)["doubt"]
    assert "epoch node names meta://a:1" in _reported(3, entry(), {3}, (3, "meta://a:1", 0))["doubt"]
    assert "epoch node is at 2" in _reported(3, entry(), {3}, (2, "meta://b:1", 0))["doubt"]
    assert "not in the master's epoch history" in _reported(2, entry(epoch=2, previous_epoch=1), {1, 3}, node)["doubt"]
    flagged = _reported(3, {"record": {}, "truncated": {}, "malformed": ["/x"]}, {3}, node)
    assert "unreadable: /x" in flagged["doubt"] and not flagged.get("reported")


def test_the_login_form_never_puts_a_password_in_a_url_and_hides_without_the_stylesheet() -> None:
    """Seen in a browser test: the page loaded but its stylesheet and script did not (the
    browser dropped them on a network change), so the login form showed without its script
    and a native submit sent the password in a GET query string (history, access logs)."""
    from html.parser import HTMLParser

    page = (REPO / "metaq" / "console" / "static" / "index.html").read_text()

    class Forms(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.login: dict[str, str | None] = {}
            self.inline_styles: list[str] = []
            self.in_style = False

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "form" and dict(attrs).get("id") == "login-form":
                self.login = dict(attrs)
            self.in_style = tag == "style"

        def handle_data(self, data: str) -> None:
            if self.in_style:
                self.inline_styles.append(data)

    forms = Forms()
    forms.feed(page)
    assert (forms.login.get("method") or "").lower() == "post"
    assert forms.login.get("action") == "/api/login"
    assert any(".hidden" in style and "display: none" in style for style in forms.inline_styles)
