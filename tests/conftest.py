"""Shared fixtures: one real ZooKeeper per test session, a private ZK root per test, brokers.

Tests under tests/integration, tests/chaos and tests/spark are marked ``integration`` /
``chaos`` / ``spark``
automatically; everything runs by default (deselect with ``-m "not integration"``).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import pytest
from kazoo.client import KazooClient

from metaq.zk.embedded import EmbeddedZooKeeper
from tests.chaos.run_support import ChaosRuns
from tests.harness import BrokerFactory, kazoo_client

TESTS_DIR = Path(__file__).resolve().parent
# Short ticks let tests use short sessions (the server's floor is 2 ticks).
TEST_TICK_MS = 200


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        relative = item.path.resolve().relative_to(TESTS_DIR).parts
        if relative and relative[0] in ("integration", "chaos", "spark"):
            item.add_marker(relative[0])


#: The test in progress, for the chaos runs in the background (an unmarked chaos test holds a place).
TEST_IN_PROGRESS = pytest.StashKey["pytest.Item | None"]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    item.config.stash[TEST_IN_PROGRESS] = item
    try:
        yield
    finally:
        item.config.stash[TEST_IN_PROGRESS] = None


@pytest.fixture(scope="session", autouse=True)
def chaos_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosRuns]:
    """The session's ``@chaos_run`` runs (tests/chaos/run_support.py), started in the background
    from the first test on, so that they go on beside the rest of the suite; the marked tests,
    last in the session (tests/chaos/conftest.py), check their outcomes."""
    runs = ChaosRuns(request.session.items, tmp_path_factory.mktemp,
                     in_progress=lambda: request.config.stash.get(TEST_IN_PROGRESS, None))
    runs.start_ahead()
    try:
        yield runs
    finally:
        runs.close()  # also a run started ahead for a test that never ran (-x, an interrupt)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    # Brokers are separate processes: their logs are the only way to see why a test failed.
    factory = getattr(item, "funcargs", {}).get("broker_factory")
    if report.failed and isinstance(factory, BrokerFactory) and factory.processes:
        report.sections.append(("broker logs", factory.log_report(last_lines=50)))


@pytest.fixture(scope="session")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedZooKeeper]:
    """A real standalone ZooKeeper on a free port, shared by the whole session.

    Tests that kill, pause or restart ZooKeeper should start their own EmbeddedZooKeeper.
    """
    server = EmbeddedZooKeeper(data_dir=tmp_path_factory.mktemp("zookeeper"), tick_ms=TEST_TICK_MS)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_root(zk: EmbeddedZooKeeper) -> Iterator[str]:
    """A root path of this test's own ("/meta-<hex>"), removed afterwards, so tests sharing
    one server never see each other's brokers."""
    if not zk.alive:
        # An earlier test crashed the shared server; its data dir survives, so restart it.
        zk.start()
    root = f"/meta-{uuid.uuid4().hex[:12]}"
    yield root
    if not zk.alive:
        return  # a test stopped or killed the shared server; nothing to clean
    client = KazooClient(hosts=zk.connect_string, timeout=5)
    try:
        client.start(timeout=5)
        client.delete(root, recursive=True)
    except Exception:
        pass  # best effort: a unique root never collides anyway
    finally:
        client.stop()
        client.close()


@pytest.fixture
def zk_client(zk: EmbeddedZooKeeper) -> Iterator[KazooClient]:
    """A connected kazoo client for inspecting ZooKeeper from the test."""
    with kazoo_client(zk.connect_string) as client:
        yield client


@pytest.fixture
def broker_factory(tmp_path: Path, zk: EmbeddedZooKeeper, zk_root: str) -> Iterator[BrokerFactory]:
    """``broker_factory(broker_id, topics, system=None, slave_props=None, start=True)``;
    every broker it made is stopped at teardown, also when the test failed."""
    factory = BrokerFactory(tmp_path, zk.connect_string, zk_root)
    try:
        yield factory
    finally:
        factory.stop_all()
