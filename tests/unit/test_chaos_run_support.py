"""tests/chaos/run_support.py: which chaos run starts ahead, and that none outlives its bound or the session.

Real child processes (a Python that sleeps, in place of ``python -m chaos run``), fake test items.
"""

from __future__ import annotations

import sys
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

    def command(self, out: Path) -> list[str]:
        script = (f"import pathlib, time; time.sleep({self.seconds}); p = pathlib.Path({str(out)!r}); "
                  "p.mkdir(parents=True); (p / 'report.txt').write_text('done')")
        return [sys.executable, "-c", script]


class Item:
    def __init__(self, spec: SleepSpec | None) -> None:
        self.nodeid = spec.name if spec else f"unmarked-{id(self)}"
        self.spec = spec

    def get_closest_marker(self, name: str) -> SimpleNamespace | None:
        assert name == MARKER
        return SimpleNamespace(args=(self.spec,)) if self.spec else None


def make_runs(tmp_path: Path, *specs: SleepSpec | None) -> tuple[ChaosRuns, list[Item]]:
    items = [Item(spec) for spec in specs]
    counter = iter(range(100))
    return ChaosRuns(items, lambda name: tmp_path / f"{name}{next(counter)}"), items  # type: ignore[arg-type]


def test_the_next_marked_test_starts_beside_the_current_one_unless_either_runs_alone(tmp_path: Path) -> None:
    runs, items = make_runs(tmp_path, SleepSpec("a", 1.0), SleepSpec("b"), SleepSpec("c", alone=True),
                            SleepSpec("d"), None, SleepSpec("e"))
    try:
        assert runs.outcome(items[0]).report == "done"
        assert set(runs.runs) == {"a", "b"}  # b was started while a ran
        assert runs.runs["b"].started < runs.runs["a"].started + 1.0
        runs.outcome(items[1])
        assert set(runs.runs) == {"a", "b"}  # c runs alone: not started ahead
        runs.outcome(items[2])
        assert set(runs.runs) == {"a", "b", "c"}  # nor does it start d beside it
        runs.outcome(items[3])
        assert "e" not in runs.runs  # the next test is not marked: nothing beside d
    finally:
        runs.close()


def test_two_hostile_runs_never_run_side_by_side_but_each_beside_a_plain_one(tmp_path: Path) -> None:
    runs, items = make_runs(tmp_path, SleepSpec("rogue1", hostile=True), SleepSpec("rogue2", hostile=True),
                            SleepSpec("plain"), SleepSpec("rogue3", hostile=True), SleepSpec("plain2"))
    try:
        runs.outcome(items[0])
        assert set(runs.runs) == {"rogue1"}  # the next run is hostile too: not beside it
        runs.outcome(items[1])
        assert set(runs.runs) == {"rogue1", "rogue2", "plain"}  # a plain run beside a hostile one
        runs.outcome(items[2])
        assert "rogue3" in runs.runs
        runs.outcome(items[3])
        assert "plain2" in runs.runs
    finally:
        runs.close()


def test_a_run_started_ahead_is_killed_when_the_session_ends_first(tmp_path: Path) -> None:
    runs, items = make_runs(tmp_path, SleepSpec("a"), SleepSpec("b", 60.0))
    runs.outcome(items[0])
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


def test_the_marked_tests_are_put_one_after_another_from_the_first_of_them() -> None:
    from tests.chaos.conftest import pytest_collection_modifyitems

    plain1, a, plain2, b, plain3, c = Item(None), Item(SleepSpec("a")), Item(None), Item(SleepSpec("b")), Item(None), \
        Item(SleepSpec("c"))
    items = [plain1, a, plain2, b, plain3, c]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert items == [plain1, a, b, c, plain2, plain3]
