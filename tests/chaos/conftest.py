"""Fixtures of the chaos tests: the outcome of a test's ``@chaos_run(...)`` (tests/chaos/run_support.py)."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.chaos.run_support import MARKER, ChaosRuns, Outcome


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(scenario, seed, seconds, mode, zk_nodes, *options, alone=False): "
                                       "the test checks this `python -m chaos run` (tests/chaos/run_support.py)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``@chaos_run`` one after another, from where the first of them is
    (otherwise in their order): a run starts beside the one before it only when its test comes
    right after that one (run_support.py), so a marked test between unmarked ones (the one of
    test_chaos_idempotent.py, between test_chaos_hosts.py and test_chaos_power_loss.py) ran
    its run with no neighbour."""
    marked = [item for item in items if ChaosRuns.spec_of(item) is not None]
    if marked:
        first = items.index(marked[0])  # every item before it is unmarked
        unmarked = [item for item in items if ChaosRuns.spec_of(item) is None]
        items[:] = unmarked[:first] + marked + unmarked[first:]


@pytest.fixture(scope="session")
def chaos_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosRuns]:
    runs = ChaosRuns(request.session.items, tmp_path_factory.mktemp)
    try:
        yield runs
    finally:
        runs.close()  # also a run started ahead for a test that never ran (-x, an interrupt)


@pytest.fixture
def chaos_outcome(request: pytest.FixtureRequest, chaos_runs: ChaosRuns) -> Outcome:
    """The finished run of this test's ``@chaos_run(...)``; the test checks it (``checked``), so
    that a failed check is the test's failure, not an error of its set-up."""
    return chaos_runs.outcome(request.node)

