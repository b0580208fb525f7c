"""``python -m chaos run`` (and ``python -m chaos.transactions``) processes for the chaos
tests, started in the background from the session's first test on.

A chaos run is mostly waiting: fault holds, session timeouts, settles (the runner, its
brokers, ZooKeeper and proxy use about a fifth of one core). So a test marked
``@chaos_run(...)`` takes its run's outcome from the ``chaos_outcome`` fixture
(tests/chaos/conftest.py), and the runs are not started by their tests: ``ChaosRuns``
starts them in the background from the session's first test on, in the tests' order,
two at a time (``PARALLEL_RUNS``), the next one as soon as one ends; each has its own
cluster (own ports, data dirs, ZooKeeper, proxy). The marked tests come last in the
session (tests/chaos/conftest.py), so their runs go on beside the rest of the suite, which
mostly waits too (brokers, session timeouts), and a marked test mostly finds its run
finished. Nothing about a run changes (same command, same seed, same checks), only when it
starts. An unmarked test under tests/chaos (its own cluster, or a run it starts itself)
takes one of the two places while it runs: no more than two chaos clusters at a time.

A run marked ``alone=True`` runs with no other run and no unmarked chaos test beside it
(none is marked so now). Two ``--rogue`` runs (``hostile``) never run side by side: each
one's attackers load the machine, which the other's put-latency check would pay for twice
(chaos/hostile.py, latency_verdict); beside a plain run they go like any other (that check
bounds the attacked window against a quiet one of the same run with margins for the
machine's own load). A ``--hosts netns`` run (``changes_interfaces``) waits until the
session's browser tests are over: the veth pairs and bridges it creates make Chromium drop
the requests it has in flight (``net::ERR_NETWORK_CHANGED``), a page's script among them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The unmarked tests under this directory run chaos clusters of their own.
CHAOS_TESTS = Path(__file__).resolve().parent
#: Seconds one run may take from its start (the runner itself waits up to 120 s for the final settle).
RUN_TIMEOUT_S = 240.0
#: Chaos clusters at a time: background runs plus an unmarked chaos test in progress.
PARALLEL_RUNS = 2
#: How often the background thread looks for a free place.
FILL_INTERVAL_S = 0.1
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

    @property
    def changes_interfaces(self) -> bool:
        """A ``--hosts netns`` run: creates network namespaces, veth pairs and a bridge."""
        return any(a == "--hosts" and b == "netns" for a, b in zip(self.options, self.options[1:]))

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
    changes_interfaces = False

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

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)  # the group of the process we started
            except ProcessLookupError:
                pass
        self.process.wait()


class ChaosRuns:
    """The session's chaos runs by test, each started once, in the tests' order, in the
    background (``start_ahead``) while fewer than ``PARALLEL_RUNS`` go on: never a second
    ``hostile`` run beside one, nothing beside an ``alone`` one, and an unmarked chaos test
    in progress (``foreground``) counts as a run. A test waiting for a run not started yet
    has it started first, as soon as it may start."""

    def __init__(self, items: list[pytest.Item], mktemp: Callable[[str], Path],
                 in_progress: Callable[[], pytest.Item | None] = lambda: None) -> None:
        self.items = items
        self.mktemp = mktemp
        #: The test in progress (tests/conftest.py): an unmarked chaos test holds a place.
        self.in_progress = in_progress
        #: The marked tests, in the session's order: the order their runs start in.
        self.marked = [(item, spec) for item in items if (spec := self.spec_of(item)) is not None]
        self.runs: dict[str, StartedRun] = {}
        #: Where the session's last browser test is (-1: none): no run changes the machine's
        #: network interfaces before the test after it is in progress.
        self._position = {item.nodeid: index for index, item in enumerate(items)}
        self._last_browser = max((index for index, item in enumerate(items) if item.get_closest_marker("browser")), default=-1)
        self._browsers_done = self._last_browser < 0
        self._outs: dict[str, Path] = {}
        self._lock = threading.RLock()
        self._wanted: str | None = None  # the run a test waits for: started before any other
        self._halt = threading.Event()
        self._filler: threading.Thread | None = None

    @staticmethod
    def spec_of(item: pytest.Item) -> RunSpec | TransactionsRunSpec | None:
        marker = item.get_closest_marker(MARKER)
        return marker.args[0] if marker is not None else None

    def start_ahead(self) -> None:
        """Start the runs in the background from now on (once). Call it from the test session's
        thread: every run's output directory is made here (``mktemp`` is not for threads)."""
        with self._lock:
            if self._filler is None and self.marked:
                for item, spec in self.marked:
                    self._out_of(item, spec)
                self._filler = threading.Thread(target=self._fill_loop, name="chaos-runs", daemon=True)
                self._filler.start()

    def _out_of(self, item: pytest.Item, spec: RunSpec | TransactionsRunSpec) -> Path:
        if item.nodeid not in self._outs:
            self._outs[item.nodeid] = self.mktemp(spec.name) / "run"
        return self._outs[item.nodeid]

    def _fill_loop(self) -> None:
        while not self._halt.is_set() and self._fill():
            self._halt.wait(FILL_INTERVAL_S)

    @property
    def foreground(self) -> int:
        """1 while an unmarked test under tests/chaos is in progress (it runs a cluster of its own)."""
        item = self.in_progress()
        return int(item is not None and self.spec_of(item) is None and CHAOS_TESTS in Path(str(item.path)).parents)

    def browsers_done(self) -> bool:
        """Whether the session's browser tests are over (a test after the last one is in progress)."""
        if not self._browsers_done:
            item = self.in_progress()
            self._browsers_done = item is not None and self._position.get(item.nodeid, len(self.items)) > self._last_browser
        return self._browsers_done

    def _may_start(self, spec: RunSpec | TransactionsRunSpec) -> bool:
        if spec.changes_interfaces and not self.browsers_done():
            return False
        running = [run.spec for run in self.runs.values() if run.running]
        busy = len(running) + self.foreground
        if busy >= PARALLEL_RUNS or any(other.alone for other in running):
            return False
        if spec.alone and busy:
            return False
        return not (spec.hostile and any(other.hostile for other in running))

    def _fill(self) -> bool:
        """Start what may start now; whether any run is still to start."""
        with self._lock:
            if self._halt.is_set():
                return False
            pending = [(item, spec) for item, spec in self.marked if item.nodeid not in self.runs]
            if self._wanted is not None:
                # A test waits for this one: no other run takes the place it needs.
                pending = [(item, spec) for item, spec in pending if item.nodeid == self._wanted]
            for item, spec in pending:
                if self._may_start(spec):
                    self.runs[item.nodeid] = StartedRun(spec, self._outs[item.nodeid])
            return any(item.nodeid not in self.runs for item, _spec in self.marked)

    def outcome(self, item: pytest.Item) -> Outcome:
        spec = self.spec_of(item)
        assert spec is not None, f"{item.nodeid} has no @chaos_run(...) marker"
        self.start_ahead()
        with self._lock:
            self._wanted = item.nodeid
            if all(item.nodeid != marked.nodeid for marked, _spec in self.marked):
                self.marked.append((item, spec))  # not in the session's list (a test calling it directly)
            self._out_of(item, spec)
        try:
            while item.nodeid not in self.runs:
                self._fill()
                time.sleep(FILL_INTERVAL_S)
        finally:
            with self._lock:
                self._wanted = None
        return self.runs[item.nodeid].finish()

    def close(self) -> None:
        self._halt.set()
        with self._lock:
            runs = list(self.runs.values())
        if self._filler is not None:
            self._filler.join(10)
        for run in runs:
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
    # Liveness: every master fault (kill -9, SIGSTOP, ZK partition) held at least the session
    # timeout led to a failover (the checker's failover check, so also result["ok"] above;
    # test_regression_deposed_master_sync_set_publish_retry's end-to-end form).
    assert summary["master_faults_without_failover"] == [], report
    result["history"] = history
    return result
