"""Fixtures of the chaos tests: the outcome of a test's ``@chaos_run(...)`` (tests/chaos/run_support.py)."""

from __future__ import annotations

import pytest

from tests.chaos.run_support import MARKER, ChaosRuns, Outcome


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(scenario, seed, seconds, mode, zk_nodes, *options, alone=False): "
                                       "the test checks this `python -m chaos run` (tests/chaos/run_support.py)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``@chaos_run`` last in the session, in their order: their runs start
    in the background from the session's first test on (tests/chaos/run_support.py), so by
    the time the marked tests come, most of their runs are over."""
    marked = [item for item in items if ChaosRuns.spec_of(item) is not None]
    items[:] = [item for item in items if ChaosRuns.spec_of(item) is None] + marked


@pytest.fixture
def chaos_outcome(request: pytest.FixtureRequest, chaos_runs: ChaosRuns) -> Outcome:
    """The finished run of this test's ``@chaos_run(...)`` (``chaos_runs``: tests/conftest.py);
    the test checks it (``checked``), so that a failed check is the test's failure, not an
    error of its set-up."""
    return chaos_runs.outcome(request.node)
