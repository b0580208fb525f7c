"""The web console in a real browser: Playwright driving Debian's chromium (/usr/bin/chromium,
installed by ``scripts/setup.sh --test``; no browser is downloaded) against real processes:
an embedded ZooKeeper, a sync master/slave pair with security on, and ``metaq console``
serving HTTPS with the cluster's users.

One cluster and one console for the module (they take seconds to start); the tests run in
file order and each leaves the cluster healthy for the next. Run them alone with
``python -m pytest -q -m browser tests/browser``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from metaq.cli.demo_security import DemoSecurity
from metaq.process import stop_pid
from metaq.tools.launcher import LocalCluster, wait_until

playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python: scripts/setup.sh --test")
CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip("Debian's chromium package is not installed: scripts/setup.sh --test", allow_module_level=True)

from tests.security_support import TestCA  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.integration]
expect = playwright_api.expect
# Every expectation here waits for the page to show a state, it does not time it (speed is
# measured in benchmarks): Playwright's default 5 s was too short for a login's salted-hash
# check while the suite's first tests run beside the background chaos runs starting (seen
# twice in fresh-clone runs, once for a right password and once for a wrong one).
expect.set_options(timeout=30_000)

REPO = Path(__file__).resolve().parents[2]
TOPIC = "orders"
#: The read-only user: logged in, no permission but to look.
VIEWER = "viewer"


def metaq(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "metaq", *args], capture_output=True, text=True, timeout=timeout, env=env)


class Env:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.security = DemoSecurity.create(work / "security", TOPIC)
        self.viewer_password = secrets.token_urlsafe(12)
        from metaq.security.credentials import SecurityFile

        users = SecurityFile.load(str(self.security.directory / "security.ini"))
        users.add_user(VIEWER, self.viewer_password)
        users.save()
        ca = TestCA.create(work / "ca")
        self.cert, self.key = ca.issue("console")
        system = {"unflushThreshold": 0, "replicationMode": "sync", "onSyncSlaveLoss": "degrade", "syncSlaveTimeoutMs": 1000,
                  **self.security.system}
        self.cluster = LocalCluster(work / "cluster", masters=1, slaves=1, topics={TOPIC: 2}, system=system, tick_ms=100,
                                    zookeeper={"zk.zkSessionTimeoutMs": 1500, "zk.zkSyncTimeMs": 0})
        self.reports = work / "reports"
        self.console: subprocess.Popen[str] | None = None
        self.url = ""

    def login_args(self, user: str = "ops") -> list[str]:
        return ["--zk", self.cluster.zk_connect, "--user", user, "--password-file", str(self.security.directory / f"{user}.password")]

    def start(self) -> None:
        self.cluster.start()
        self.console = subprocess.Popen(
            [sys.executable, "-m", "metaq", "console", "--port", "0", "--tls-cert", str(self.cert), "--tls-key", str(self.key),
             "--http-users", str(self.security.directory / "security.ini"), "--reports", str(self.reports),
             "--group-secret", f"0={self.security.directory / 'group.secret'}", *self.login_args()],
            stdout=subprocess.PIPE, stderr=open(self.work / "console.log", "w"), text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        line = self.console.stdout.readline() if self.console.stdout else ""
        found = re.search(r"serving (https://\S+)", line)
        assert found, f"the console did not start: {line}{(self.work / 'console.log').read_text()}"
        self.url = found.group(1)

    def restarted_pids(self) -> list[int]:
        pids = []
        for path in self.reports.glob("*.json"):
            report = json.loads(path.read_text()).get("report") or {}
            if report.get("restarted_pid"):
                pids.append(int(report["restarted_pid"]))
        return pids

    def stop(self) -> None:
        if self.console is not None and self.console.poll() is None:
            self.console.send_signal(signal.SIGTERM)
            try:
                self.console.wait(15)
            except subprocess.TimeoutExpired:
                self.console.kill()
                self.console.wait()
        for pid in self.restarted_pids():  # brokers a drill restarted: ours to stop
            stop_pid(pid)
        self.cluster.stop()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    environment = Env(tmp_path_factory.mktemp("console"))
    try:
        environment.start()
        yield environment
    finally:
        environment.stop()


@pytest.fixture(scope="module")
def browser(env: Env) -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def logged_in(browser: Any, env: Env, user: str, password: str) -> Any:
    """A page of a fresh browser context (its own cookies), logged in as ``user`` on the cluster page."""
    context = browser.new_context(ignore_https_errors=True, viewport={"width": 1360, "height": 900})
    page = context.new_page()
    seen = watch(page)
    page.goto(env.url)
    page.fill("input[name=user]", user)
    page.fill("input[name=password]", password)
    page.click("#login-form button[type=submit]")
    try:
        expect(page.locator("#who")).to_contain_text(user)
    except AssertionError as error:
        raise AssertionError(f"{error}\nwhat the page saw:\n  " + "\n  ".join(seen) + "\nthe console's log, last lines:\n"
                             + "".join((env.work / "console.log").read_text().splitlines(keepends=True)[-30:])) from None
    return page


def watch(page: Any) -> list[str]:
    """What a page requests and logs, kept to explain a failed expectation (a login that never showed its user)."""
    seen: list[str] = []
    start = time.monotonic()

    def note(line: str) -> None:
        seen.append(f"{time.monotonic() - start:6.2f} s {line}")

    page.on("response", lambda r: note(f"{r.request.method} {r.url} -> {r.status}"))
    page.on("requestfailed", lambda r: note(f"{r.method} {r.url} failed: {r.failure}"))
    page.on("console", lambda m: note(f"console {m.type}: {m.text}"))
    page.on("pageerror", lambda e: note(f"page error: {e}"))
    return seen


def ops_page(browser: Any, env: Env) -> Any:
    return logged_in(browser, env, "ops", env.security.ops.password or "")


def group_card(page: Any) -> Any:
    return page.locator("[data-testid=group-0]")


def test_the_cluster_page_shows_master_and_slave(browser: Any, env: Env) -> None:
    page = ops_page(browser, env)
    master, slave = env.cluster.masters[0], env.cluster.slaves[0][0]
    card = group_card(page)
    expect(card.locator("[data-testid=master]")).to_have_text(master.url.removeprefix("meta://"))
    expect(card.locator("tr[data-role=slave0] .addr")).to_have_text(slave.url.removeprefix("meta://"))
    expect(card.locator("tr[data-role=slave0]")).to_contain_text("in sync set")
    expect(card.locator("[data-testid=epoch]")).to_have_text("1")
    # The verdict is metaq cluster's: healthy, exit 0.
    expect(page.locator("[data-testid=verdict]")).to_contain_text("exits 0")
    expect(page.locator("#health")).to_have_attribute("data-exit-code", "0")
    page.context.close()


def test_without_a_login_nothing_is_shown_and_a_wrong_password_is_refused(browser: Any, env: Env) -> None:
    context = browser.new_context(ignore_https_errors=True)
    page = context.new_page()
    page.goto(env.url)
    expect(page.locator("#login")).to_be_visible()
    assert page.request.get(env.url + "api/snapshot").status == 401
    page.fill("input[name=user]", "ops")
    page.fill("input[name=password]", "not-the-password")
    page.click("#login-form button[type=submit]")
    expect(page.locator("#login-error")).to_have_text("wrong user or password")
    context.close()


def test_a_read_only_user_cannot_start_a_drill(browser: Any, env: Env) -> None:
    page = logged_in(browser, env, VIEWER, env.viewer_password)
    expect(page.locator("#who")).to_contain_text("read-only")
    expect(group_card(page).locator("[data-testid=master]")).not_to_have_text("")
    assert group_card(page).locator("button", has_text="Promote").count() == 0
    page.goto(env.url + "#/drills")
    expect(page.locator("#page")).to_contain_text("Only users with the admin permission may start drills")
    assert page.locator("#start-drill").count() == 0
    # The action itself, with the session's own CSRF token, is refused by the ACL: 403.
    status = page.evaluate("""async () => {
        const me = await (await fetch('/api/me')).json();
        const r = await fetch('/api/drills', {method: 'POST', headers: {'Content-Type': 'application/json', 'X-CSRF-Token': me.csrf},
                                              body: JSON.stringify({broker_id: 0, fault: 'kill', confirm: '0'})});
        return [r.status, (await r.json()).error];
    }""")
    assert status[0] == 403 and "lacks the admin permission" in status[1], status
    # Without the CSRF token even an admin's session may not act.
    admin = ops_page(browser, env)
    forged = admin.evaluate("""async () => (await fetch('/api/drills', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                    body: JSON.stringify({broker_id: 0, fault: 'kill', confirm: '0'})})).status""")
    assert forged == 403
    admin.context.close()
    page.context.close()


def test_a_topic_created_from_the_cli_appears_without_a_reload(browser: Any, env: Env) -> None:
    page = ops_page(browser, env)
    page.goto(env.url + "#/topics")
    expect(page.locator(f"tr[data-topic={TOPIC}]")).to_be_visible()
    page.evaluate("window.__notReloaded = true")
    created = metaq("topics", "create", "--broker-id", "0", "--topic", "fresh", "--partitions", "3",
                    "--group-secret", str(env.security.directory / "group.secret"), *env.login_args())
    assert created.returncode == 0, created.stdout + created.stderr
    row = page.locator("tr[data-topic=fresh]")
    expect(row).to_be_visible(timeout=10_000)
    expect(row.locator("td").nth(2)).to_have_text("3")
    assert page.evaluate("window.__notReloaded") is True
    # Altered from the page: the CLI's own check refuses fewer partitions, with its line; more are applied.
    row.locator("button", has_text="Alter").click()
    page.fill("#dialog-body input[name=partitions]", "2")
    page.click("#dialog-ok")
    output = page.locator("#dialog-output")
    expect(output).to_contain_text("(exit 1)", timeout=30_000)
    expect(output).to_contain_text("metaq topics alter --broker-id=0 --topic=fresh --partitions=2")
    assert "partitions" in output.inner_text().split("\n", 1)[1]
    page.fill("#dialog-body input[name=partitions]", "5")
    page.click("#dialog-ok")
    expect(output).to_contain_text("(exit 0)", timeout=30_000)
    assert "password" not in output.inner_text().replace("--password-file", "")
    page.click("#dialog-cancel")
    expect(row.locator("td").nth(2)).to_have_text("5", timeout=10_000)
    page.context.close()


def _lag(page: Any) -> int | None:
    value = page.locator(f"[data-testid=lag-billing-{TOPIC}]").get_attribute("data-bytes")
    return None if value in (None, "null") else int(value)


def test_lag_rises_while_a_consumer_group_is_stopped_and_falls_when_it_resumes(browser: Any, env: Env) -> None:
    app = env.login_args("app")
    assert metaq("produce", "--topic", TOPIC, "--count", "200", *app).returncode == 0
    consumed = metaq("consume", "--topic", TOPIC, "--group", "billing", "--max", "200", *app)
    assert consumed.returncode == 0, consumed.stderr
    page = ops_page(browser, env)
    page.goto(env.url + "#/groups")
    expect(page.locator(f"[data-testid=lag-billing-{TOPIC}]")).to_have_attribute("data-bytes", "0", timeout=10_000)
    # The group is stopped (no consumer runs) while 300 more messages arrive: its lag rises on the page.
    assert metaq("produce", "--topic", TOPIC, "--count", "300", *app).returncode == 0
    wait_until(lambda: (_lag(page) or 0) > 0, 10, message="the lag to rise on the page")
    risen = _lag(page)
    # It resumes and reads them: the lag falls back to 0, and the sparkline drew both.
    consumed = metaq("consume", "--topic", TOPIC, "--group", "billing", "--max", "300", *app)
    assert consumed.returncode == 0, consumed.stderr
    wait_until(lambda: _lag(page) == 0, 10, message="the lag to fall on the page")
    assert risen and risen > 0
    expect(page.locator("[data-spark] canvas").first).to_be_visible()
    # Reset from the page (metaq groups reset-offsets): a dry run, then executed once the group's name is typed.
    page.locator("[data-testid=consumer-billing] button", has_text="Reset offsets").click()
    page.select_option("#dialog-body select[name=topic]", TOPIC)
    page.select_option("#dialog-body select[name=target]", "earliest")
    page.click("#dialog-ok")
    output = page.locator("#dialog-output")
    expect(output).to_contain_text("dry run: nothing written", timeout=30_000)
    page.check("#dialog-body input[name=execute]")
    expect(page.locator("#dialog-ok")).to_be_disabled()
    page.fill("#dialog-confirm", "billing")
    page.click("#dialog-ok")
    expect(output).to_contain_text("offset(s) written", timeout=30_000)
    page.click("#dialog-cancel")
    wait_until(lambda: (_lag(page) or 0) > risen, 10, message="the lag to be the whole topic after the reset")
    page.context.close()


def test_after_kill_9_of_the_master_the_page_shows_the_new_master_and_epoch_within_3_s(browser: Any, env: Env) -> None:
    page = ops_page(browser, env)
    card = group_card(page)
    master, slave = env.cluster.masters[0], env.cluster.slaves[0][0]
    expect(card.locator("[data-testid=master]")).to_have_text(master.url.removeprefix("meta://"))
    expect(card.locator("[data-testid=epoch]")).to_have_text("1")
    page.evaluate("window.__notReloaded = true")
    killed_at = time.monotonic()
    master.kill()  # SIGKILL
    expect(card.locator("[data-testid=master]")).to_have_text(slave.url.removeprefix("meta://"), timeout=3_000)
    expect(card.locator("[data-testid=epoch]")).to_have_text("2", timeout=max(1, 3_000 - int((time.monotonic() - killed_at) * 1000)))
    took = time.monotonic() - killed_at
    assert took <= 3.0, f"the page showed the new master {took:.2f} s after the kill"
    assert page.evaluate("window.__notReloaded") is True
    # The old master comes back as the new master's slave (and into its sync set) for the drill below.
    master.start(wait_zk=False)  # it registers as a slave now, not as the master it was
    expect(card.locator("tr[data-role=slave0]")).to_contain_text("in sync set", timeout=30_000)
    expect(page.locator("#health")).to_have_attribute("data-exit-code", "0")
    # The failover history shows why epoch 2 began, as the new master recorded it in ZooKeeper.
    page.click("nav a[data-page=failovers]")
    expect(page.locator("[data-testid=why-0-2]")).to_contain_text(
        re.compile("process died|session expired"), timeout=10_000)
    expect(page.locator("[data-testid=why-0-2]")).to_contain_text("as the broker reported it")
    page.context.close()


def test_a_promote_from_the_page_is_metaq_promote_behind_a_confirmation(browser: Any, env: Env) -> None:
    page = ops_page(browser, env)
    card = group_card(page)
    old_master = env.cluster.masters[0]  # back as slave0 since the kill above
    expect(card.locator("tr[data-role=slave0] .addr")).to_have_text(old_master.url.removeprefix("meta://"))
    card.locator("tr[data-role=slave0] button", has_text="Promote").click()
    expect(page.locator("#dialog-title")).to_have_text("Promote slave0 of broker group 0")
    expect(page.locator("#dialog-ok")).to_be_disabled()
    page.fill("#dialog-confirm", "1")  # not the group's id
    expect(page.locator("#dialog-ok")).to_be_disabled()
    page.fill("#dialog-confirm", "0")
    page.click("#dialog-ok")
    output = page.locator("#dialog-output")
    expect(output).to_contain_text("(exit 0)", timeout=30_000)
    expect(output).to_contain_text("leads broker group 0 in epoch 3")
    page.click("#dialog-cancel")
    expect(card.locator("[data-testid=master]")).to_have_text(old_master.url.removeprefix("meta://"))
    expect(card.locator("[data-testid=epoch]")).to_have_text("3")
    expect(card.locator("tr[data-role=slave0]")).to_contain_text("in sync set", timeout=30_000)
    page.context.close()


def test_a_drill_started_from_the_page_draws_its_timeline(browser: Any, env: Env, tmp_path: Path) -> None:
    page = ops_page(browser, env)
    page.goto(env.url + "#/drills")
    page.select_option("#drill-form select[name=fault]", "kill")
    page.fill("#drill-form input[name=topic]", TOPIC)  # not "fresh": ops may not produce to it
    page.fill("#drill-form input[name=rate]", "200")
    page.click("#start-drill")
    # The confirmation names the group: the button stays disabled until it is typed.
    expect(page.locator("#dialog-title")).to_contain_text("broker group 0")
    expect(page.locator("#dialog-ok")).to_be_disabled()
    page.fill("#dialog-confirm", "0")
    page.click("#dialog-ok")
    expect(page).to_have_url(re.compile(r"#/drills/\d{8}-\d{6}-g0"))
    drill_id = page.url.rsplit("/", 1)[1]
    result = page.locator("[data-testid=drill-result]")
    expect(result).to_be_visible(timeout=120_000)
    page.screenshot(path=str(tmp_path / "drill.png"), full_page=True)  # the test's artifact
    expect(result.locator("[data-testid=lost]")).to_have_text("0")
    expect(result.locator("[data-testid=logs-identical]")).to_have_text("true")
    for name in ("fault", "detection", "first acked write", "first read"):
        expect(page.locator(f"#drill-markers [data-marker='{name}']")).to_be_visible()
    chart = page.evaluate("""() => ({data: window.metaqConsole.drillChart.data, markers: window.metaqConsole.drillMarkers})""")
    t, rate, latency = chart["data"][0], chart["data"][1], chart["data"][2]
    markers = {m["name"]: m["t"] for m in chart["markers"]}
    assert len(t) == len(rate) > 10
    # Acked writes before the fault, none stored while no master takes them, and again after
    # the first acked write on the new master; latencies where writes were acked.
    before = [r for x, r in zip(t, rate) if x < markers["fault"] - 0.25]
    after = [r for x, r in zip(t, rate) if x >= markers["first acked write"]]
    assert before and all(r > 0 for r in before[1:]), before
    assert sum(after) > 0, after
    assert markers["fault"] < markers["detection"] <= markers["first acked write"] <= markers["first read"], markers
    assert any(v is not None and v > 0 for v in latency)
    # The report is kept: its JSON, and the chart as an image the page sent.
    assert page.request.get(env.url + f"api/drills/{drill_id}").json()["report"]["lost"] == 0
    wait_until(lambda: (env.reports / f"{drill_id}.png").is_file(), 10, message="the chart image to be kept")
    assert (env.reports / f"{drill_id}.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((env.reports / f"{drill_id}.json").read_text())["timeline"]["rate"] == rate
    page.context.close()


def test_a_promote_drill_hands_the_master_over_under_load_and_loses_nothing(browser: Any, env: Env) -> None:
    page = ops_page(browser, env)
    old_master = page.locator("[data-testid=group-0] [data-testid=master]").inner_text()
    page.goto(env.url + "#/drills")
    page.select_option("#drill-form select[name=fault]", "promote")
    page.fill("#drill-form input[name=topic]", TOPIC)
    page.click("#start-drill")
    expect(page.locator("#dialog-title")).to_have_text("Drill broker group 0: hand its master over to a sync slave")
    page.fill("#dialog-confirm", "0")
    page.click("#dialog-ok")
    result = page.locator("[data-testid=drill-result]")
    expect(result).to_be_visible(timeout=120_000)
    expect(result.locator("[data-testid=lost]")).to_have_text("0")
    expect(result.locator("[data-testid=logs-identical]")).to_have_text("true")
    expect(result).to_contain_text(f"{old_master} →")
    for name in ("fault", "detection", "first acked write"):
        expect(page.locator(f"#drill-markers [data-marker='{name}']")).to_be_visible()
    # The hand-over node is gone once the new master leads: no later election is bound to it.
    from metaq.zk.paths import ZkPaths
    from tests.harness import kazoo_client

    with kazoo_client(env.cluster.zk_connect) as zk:
        assert zk.exists(ZkPaths("/meta").handover(0)) is None
    page.context.close()
