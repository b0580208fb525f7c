"""tests/chaos/run_support.py: when the chaos runs start in the background (two at a time, never
two hostile ones, nothing beside an alone one or beside an unmarked chaos test), and that none
outlives its bound or the session.

Real child processes (a Python that sleeps, in place of ``python -m chaos run``), fake test items.
"""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.chaos import run_support
from tests.chaos.run_support import MARKER, ChaosRuns


@dataclass(frozen=True)
class SleepSpec:
    """Stands in for a RunSpec: a process that sleeps ``seconds``, then writes report.txt."""

    name: str
    seconds: float = 0.0
    alone: bool = False
    hostile: bool = False
    changes_interfaces: bool = False

    def command(self, out: Path) -> list[str]:
        script = (f"import pathlib, time; time.sleep({self.seconds}); p = pathlib.Path({str(out)!r}); "
                  "p.mkdir(parents=True); (p / 'report.txt').write_text('done')")
        return [sys.executable, "-c", script]


class Item:
    def __init__(self, spec: SleepSpec | None, path: Path = run_support.REPO / "tests" / "unit" / "test_x.py",
                 browser: bool = False) -> None:
        self.nodeid = spec.name if spec else f"unmarked-{id(self)}"
        self.spec = spec
        self.path = path
        self.browser = browser

    def get_closest_marker(self, name: str) -> SimpleNamespace | None:
        if name == "browser":
            return SimpleNamespace(args=()) if self.browser else None
        assert name == MARKER
        return SimpleNamespace(args=(self.spec,)) if self.spec else None


def make_runs(tmp_path: Path, *specs: SleepSpec | None, in_progress=lambda: None) -> tuple[ChaosRuns, list[Item]]:
    items = [Item(spec) for spec in specs]
    counter = iter(range(100))
    return ChaosRuns(items, lambda name: tmp_path / f"{name}{next(counter)}", in_progress), items  # type: ignore[arg-type]


def intervals(runs: ChaosRuns) -> dict[str, tuple[float, float]]:
    """When each run started and ended (its report written; the processes are short sleeps)."""
    spans = {}
    for name, run in runs.runs.items():
        run.finish()
        spans[name] = (run.started, (run.out / "report.txt").stat().st_mtime - time.time() + time.monotonic())
    return spans


def at_most_together(spans: dict[str, tuple[float, float]]) -> int:
    """The most runs whose spans overlap at one moment."""
    return max(sum(1 for s, e in spans.values() if s <= start < e) for start, _end in spans.values())


def test_runs_start_in_the_background_two_at_a_time_the_next_as_soon_as_one_ends(tmp_path: Path) -> None:
    runs, items = make_runs(tmp_path, SleepSpec("a", 3.0), SleepSpec("b", 0.2), SleepSpec("c", 0.2),
                            SleepSpec("d", 0.2), None)
    try:
        runs.start_ahead()
        wait_for(lambda: len(runs.runs) == 4, 10)
        spans = intervals(runs)
        assert at_most_together(spans) == 2
        # c and d each started when the run before them ended, while a still ran: none waited for a's test.
        assert spans["c"][0] < spans["a"][1] and spans["d"][0] < spans["a"][1]
        assert runs.outcome(items[0]).report == "done"
    finally:
        runs.close()


def test_two_hostile_runs_never_run_side_by_side_but_each_beside_a_plain_one(tmp_path: Path) -> None:
    runs, items = make_runs(tmp_path, SleepSpec("rogue1", 0.6, hostile=True), SleepSpec("rogue2", 0.6, hostile=True),
                            SleepSpec("plain", 0.3))
    try:
        runs.start_ahead()
        wait_for(lambda: len(runs.runs) == 3, 10)
        spans = intervals(runs)
        r1, r2, plain = spans["rogue1"], spans["rogue2"], spans["plain"]
        assert r2[0] >= r1[1] - 0.05  # rogue2 only once rogue1 ended
        assert plain[0] < r1[1]  # the plain one went beside rogue1 instead
    finally:
        runs.close()


def test_an_alone_run_has_nothing_beside_it(tmp_path: Path) -> None:
    runs, items = make_runs(tmp_path, SleepSpec("a", 0.3), SleepSpec("lone", 0.3, alone=True), SleepSpec("c", 0.3))
    try:
        runs.start_ahead()
        wait_for(lambda: len(runs.runs) == 3, 10)
        spans = intervals(runs)
        lone = spans["lone"]
        assert all(end <= lone[0] + 0.05 or start >= lone[1] - 0.05 for name, (start, end) in spans.items() if name != "lone")
    finally:
        runs.close()


def test_an_unmarked_chaos_test_in_progress_holds_one_of_the_two_places(tmp_path: Path) -> None:
    chaos_test = Item(None, run_support.CHAOS_TESTS / "test_chaos_cluster.py")
    current: list[Item | None] = [chaos_test]
    runs, items = make_runs(tmp_path, SleepSpec("a", 0.2), SleepSpec("b", 0.2), in_progress=lambda: current[0])
    try:
        runs.start_ahead()
        wait_for(lambda: len(runs.runs) == 2, 10)
        spans = intervals(runs)
        assert at_most_together(spans) == 1  # one place was the chaos test's
        current[0] = Item(None)  # an integration test, say: two runs at a time again
    finally:
        runs.close()
    runs, items = make_runs(tmp_path / "second", SleepSpec("a", 0.5), SleepSpec("b", 0.5),
                            in_progress=lambda: current[0])
    try:
        runs.start_ahead()
        wait_for(lambda: len(runs.runs) == 2, 10)
        assert at_most_together(intervals(runs)) == 2
    finally:
        runs.close()


def test_a_run_that_creates_network_namespaces_waits_until_the_browser_tests_are_over(tmp_path: Path) -> None:
    """Chromium drops the requests it has in flight when the machine's interfaces change
    (net::ERR_NETWORK_CHANGED): a ``--hosts netns`` run waits for the test after the last browser test."""
    assert run_support.RunSpec("silence-master", 1, options=("--hosts", "netns")).changes_interfaces
    assert not run_support.RunSpec("kill-master", 1, options=("--secure",)).changes_interfaces
    browser_tests = [Item(None, browser=True), Item(None, browser=True)]
    after = Item(None)
    netns, plain = SleepSpec("netns", 0.1, changes_interfaces=True), SleepSpec("plain", 0.1)
    items = [*browser_tests, after, Item(netns), Item(plain)]
    current: list[Item | None] = [browser_tests[0]]
    counter = iter(range(100))
    runs = ChaosRuns(items, lambda name: tmp_path / f"{name}{next(counter)}", lambda: current[0])  # type: ignore[arg-type]
    try:
        runs.start_ahead()
        wait_for(lambda: "plain" in runs.runs, 10)
        current[0] = browser_tests[1]
        time.sleep(0.5)
        current[0] = None  # between two tests: still not over
        time.sleep(0.3)
        assert "netns" not in runs.runs
        current[0] = after
        wait_for(lambda: "netns" in runs.runs, 10)
        current[0] = browser_tests[0]  # once over, over (a repeated test does not take it back)
        assert runs.browsers_done()
    finally:
        runs.close()


def test_output_directories_are_made_by_the_sessions_thread_only(tmp_path: Path) -> None:
    """pytest's ``mktemp`` is not for threads (a first call makes the session's base directory,
    which a test's ``tmp_path`` made at the same moment raced): the background thread never calls it."""
    callers: list[threading.Thread] = []

    def mktemp(name: str) -> Path:
        callers.append(threading.current_thread())
        return tmp_path / f"{name}{len(callers)}"

    items = [Item(SleepSpec(name, 0.1)) for name in "abc"]
    runs = ChaosRuns(items, mktemp)  # type: ignore[arg-type]
    try:
        runs.start_ahead()
        wait_for(lambda: len(runs.runs) == 3, 10)
        assert runs.outcome(items[2]).report == "done"
    finally:
        runs.close()
    assert len(callers) == 3 and set(callers) == {threading.current_thread()}


def test_a_test_waiting_for_its_run_has_it_started_before_the_runs_ahead_of_it(tmp_path: Path) -> None:
    runs, items = make_runs(tmp_path, SleepSpec("a", 0.5), SleepSpec("b", 0.5), SleepSpec("c"), SleepSpec("d"))
    try:
        runs.start_ahead()
        wait_for(lambda: len(runs.runs) == 2, 10)
        assert runs.outcome(items[3]).report == "done"  # d's test came first (a test order of its own)
        wait_for(lambda: "c" in runs.runs, 10)
        assert runs.runs["d"].started < runs.runs["c"].started
    finally:
        runs.close()


def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_run_started_ahead_is_killed_when_the_session_ends_first(tmp_path: Path) -> None:
    runs, items = make_runs(tmp_path, SleepSpec("a"), SleepSpec("b", 60.0))
    runs.outcome(items[0])
    wait_for(lambda: "b" in runs.runs, 10)
    ahead = runs.runs["b"].process
    assert ahead.poll() is None
    runs.close()
    assert ahead.returncode == -9


def test_a_run_past_its_bound_is_killed_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_support, "RUN_TIMEOUT_S", 1.0)
    runs, items = make_runs(tmp_path, SleepSpec("slow", 60.0))
    started = time.monotonic()
    try:
        outcome = runs.outcome(items[0])
    finally:
        runs.close()
    assert time.monotonic() - started < 30
    assert outcome.returncode == -9 and "killed: still running 1 s after its start" in outcome.stderr_tail
    assert outcome.report == "(no report.txt)"


def test_the_marked_tests_come_last_in_the_session_in_their_order() -> None:
    from tests.chaos.conftest import pytest_collection_modifyitems

    plain1, a, plain2, b, plain3, c = Item(None), Item(SleepSpec("a")), Item(None), Item(SleepSpec("b")), Item(None), \
        Item(SleepSpec("c"))
    items = [plain1, a, plain2, b, plain3, c]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert items == [plain1, plain2, plain3, a, b, c]
