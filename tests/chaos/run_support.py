"""``python -m chaos run`` (and ``python -m chaos.transactions``) processes for the chaos
tests, the next one started ahead.

A chaos run is mostly waiting: fault holds, session timeouts, settles (the runner, its
brokers, ZooKeeper and proxy use about a fifth of one core). So a test marked
``@chaos_run(...)`` takes its run's outcome from the ``chaos_outcome`` fixture
(tests/chaos/conftest.py), and when the test right after it in the session is marked too,
that test's run is started at once, beside this one: at most two runs at a time, each with
its own cluster (own ports, data dirs, ZooKeeper, proxy). Nothing about a run changes (same
command, same seed, same checks), only when it starts.

A run marked ``alone=True`` neither starts early nor gets a neighbour (none is now). Two
``--rogue`` runs (``hostile``) never run side by side: each one's attackers load the machine,
which the other's put-latency check would pay for twice (chaos/hostile.py, latency_verdict);
beside a plain run they go like any other (that check bounds the attacked window against a
quiet one of the same run with margins for the machine's own load).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
#: Seconds one run may take from its start (the runner itself waits up to 120 s for the final settle).
RUN_TIMEOUT_S = 240.0
MARKER = "chaos_run"


@dataclass(frozen=True)
class RunSpec:
    """``python -m chaos run`` with these options (the runner's defaults for the rest)."""

    scenario: str
    seed: int
    seconds: float = 12
    mode: str = "sync"
    zk_nodes: int = 1
    options: tuple[str, ...] = ()
    alone: bool = False

    @property
    def name(self) -> str:
        return f"{self.scenario}-{self.mode}-{self.seed}"

    @property
    def hostile(self) -> bool:
        """A ``--rogue`` run: attackers on the machine for the whole run."""
        return "--rogue" in self.options

    def command(self, out: Path) -> list[str]:
        return [sys.executable, "-m", "chaos", "run", "--scenario", self.scenario, "--seconds", f"{self.seconds:g}",
                "--seed", str(self.seed), "--mode", self.mode, "--zk-nodes", str(self.zk_nodes), "--out", str(out),
                *self.options]


@dataclass(frozen=True)
class TransactionsRunSpec:
    """``python -m chaos.transactions``: transactional writers under one scenario's faults
    (chaos/transactions.py); its verdicts in ``transactions.json``."""

    scenario: str
    seed: int
    seconds: float = 15
    alone: bool = False
    hostile = False

    @property
    def name(self) -> str:
        return f"transactions-{self.scenario}-{self.seed}"

    def command(self, out: Path) -> list[str]:
        return [sys.executable, "-m", "chaos.transactions", "--scenario", self.scenario, "--seed", str(self.seed),
                "--seconds", f"{self.seconds:g}", "--out", str(out)]


def transactions_run(scenario: str, seed: int, seconds: float = 15) -> pytest.MarkDecorator:
    """Marks a test as checking ``python -m chaos.transactions --scenario SCENARIO ...`` (its
    outcome: the ``chaos_outcome`` fixture, as for ``chaos_run``)."""
    return getattr(pytest.mark, MARKER)(TransactionsRunSpec(scenario, seed, seconds))


def chaos_run(scenario: str, seed: int, seconds: float = 12, mode: str = "sync", zk_nodes: int = 1,
              *options: str, alone: bool = False) -> pytest.MarkDecorator:
    """Marks a test as checking ``python -m chaos run --scenario SCENARIO --seed SEED ...``;
    the test takes the outcome from the ``chaos_outcome`` fixture."""
    return getattr(pytest.mark, MARKER)(RunSpec(scenario, seed, seconds, mode, zk_nodes, tuple(options), alone))


@dataclass
class Outcome:
    """A finished run: its exit status, its output directory and its report."""

    spec: RunSpec | TransactionsRunSpec
    command: list[str]
    returncode: int
    out: Path
    stderr_tail: str

    @property
    def report(self) -> str:
        path = self.out / "report.txt"
        return path.read_text() if path.exists() else "(no report.txt)"

    def json(self, name: str) -> dict[str, Any]:
        return json.loads((self.out / name).read_text())


class StartedRun:
    """One ``python -m chaos run`` in a session of its own, its output in files beside ``out``
    (a pipe nobody reads yet could fill and stall a run started ahead). A timeout or an early
    end of the test session kills its process group: the runner, its brokers, proxy and
    consumers (its ZooKeeper JVMs die with the runner)."""

    def __init__(self, spec: RunSpec | TransactionsRunSpec, out: Path) -> None:
        self.spec, self.out = spec, out
        self.command = spec.command(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        self.stdout_path, self.stderr_path = out.parent / f"{out.name}.stdout", out.parent / f"{out.name}.stderr"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.started = time.monotonic()
        with open(self.stdout_path, "wb") as stdout, open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(self.command, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                            stdout=stdout, stderr=stderr, start_new_session=True)
        self._outcome: Outcome | None = None

    def finish(self) -> Outcome:
        if self._outcome is None:
            note = ""
            try:
                self.process.wait(max(1.0, self.started + RUN_TIMEOUT_S - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                note = f"\n(killed: still running {RUN_TIMEOUT_S:.0f} s after its start)"
            stderr = self.stderr_path.read_text(errors="replace")[-3000:] + note
            self._outcome = Outcome(self.spec, self.command, self.process.returncode, self.out, stderr)
        return self._outcome

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)  # the group of the process we started
            except ProcessLookupError:
                pass
        self.process.wait()


class ChaosRuns:
    """The session's chaos runs by test: each started once; the next test's run (when it is
    marked too) started beside the current one, unless either is ``alone`` or both are ``hostile``."""

    def __init__(self, items: list[pytest.Item], mktemp: Callable[[str], Path]) -> None:
        self.items = items
        self.mktemp = mktemp
        self.runs: dict[str, StartedRun] = {}

    @staticmethod
    def spec_of(item: pytest.Item) -> RunSpec | TransactionsRunSpec | None:
        marker = item.get_closest_marker(MARKER)
        return marker.args[0] if marker is not None else None

    def _start(self, item: pytest.Item, spec: RunSpec | TransactionsRunSpec) -> StartedRun:
        if item.nodeid not in self.runs:
            self.runs[item.nodeid] = StartedRun(spec, self.mktemp(spec.name) / "run")
        return self.runs[item.nodeid]

    def outcome(self, item: pytest.Item) -> Outcome:
        spec = self.spec_of(item)
        assert spec is not None, f"{item.nodeid} has no @chaos_run(...) marker"
        run = self._start(item, spec)
        position = self.items.index(item)
        following = self.items[position + 1] if position + 1 < len(self.items) else None
        ahead = self.spec_of(following) if following is not None else None
        if ahead is not None and not spec.alone and not ahead.alone and not (spec.hostile and ahead.hostile):
            self._start(following, ahead)
        return run.finish()

    def close(self) -> None:
        for run in self.runs.values():
            run.kill()


def checked(outcome: Outcome) -> dict[str, Any]:
    """What every scenario run must show: exit 0, the checker's verdict ok, the scenario's
    fault injected at least once, and a failover after every master fault. Returns
    ``check.json`` with the run's history under ``history``."""
    report = outcome.report
    assert outcome.returncode == 0, f"{' '.join(outcome.command)} failed:\n{report}\n{outcome.stderr_tail}"
    result = outcome.json("check.json")
    assert result["ok"], report
    history = outcome.json("history.json")
    scenario = outcome.spec.scenario
    faults = [f for f in history["faults"] if f["kind"] == scenario.split("/")[0]]
    assert faults, f"no {scenario} fault was injected:\n{report}"
    summary = outcome.json("summary.json")
    # Liveness: every master fault (kill -9, SIGSTOP, ZK partition) led to a failover
    # (test_regression_deposed_master_sync_set_publish_retry's end-to-end form).
    assert summary["master_faults_without_failover"] == [], report
    result["history"] = history
    return result


def run_chaos(tmp_path: Path, scenario: str, seed: int, seconds: float = 12, mode: str = "sync",
              zk_nodes: int = 1, *options: str) -> dict[str, Any]:
    """One run started now and waited for (for tests that do more around their run), ``checked``."""
    spec = RunSpec(scenario, seed, seconds, mode, zk_nodes, tuple(options))
    run = StartedRun(spec, tmp_path / spec.name)
    try:
        return checked(run.finish())
    finally:
        run.kill()
