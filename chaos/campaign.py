"""``python -m chaos campaign``: many random runs, one table.

A campaign is ``--runs N`` runs of the ``random`` scenario, each ``--seconds S`` long, run
one after the other as ``python -m chaos run`` child processes (each its own cluster, its
own logging, its own fault proxy). Run ``i`` has seed ``first_seed + i`` and the ``i``-th
setup of a seeded shuffle of every combination of sync/async, one/two slaves per group,
one/two broker groups and security on/off, so that any 16 consecutive runs cover every
combination once and a short campaign is already varied.

Resumable: each run writes ``{out}/{run name}/summary.json`` when it ends (passed or
failed); a run whose summary exists is skipped, so the same command continues where an
interrupted campaign stopped. A run that ends without a summary (crashed) is run again
next time; one that overruns its time limit is stopped (its process group, SIGTERM then
SIGKILL) and recorded as failed, so a hang is a finding, not a retry loop.

Lanes: ``--lane K/N`` runs only the setups whose index is ``K - 1`` modulo ``N``, so ``N``
processes started with ``--lane 1/N`` ... ``--lane N/N`` on the same ``--out`` share one
campaign without ever running the same setup (each run has its own cluster and ports);
every lane's ``campaign.md`` covers every run finished so far, whichever lane ran it.

When done (or interrupted) it writes ``{out}/campaign.md``: the campaign's size and
command, one row per run (seed, setup, every anomaly count of the checker, other
violations, faults, failovers, acked puts, verdict) and the unavailability per fault
kind over every run, ready to paste into docs/chaos.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checker import JEPSEN_NAMES
from .anomalies import CHECKS as ANOMALY_CHECKS
from .liveness import table

#: The anomaly columns, in the checker's order (``lost-write`` is its ``acked_lost``).
ANOMALY_COLUMNS = [JEPSEN_NAMES["acked_lost"], *ANOMALY_CHECKS]
RESULT_FILE = "summary.json"
SETTINGS_FILE = "campaign.json"


@dataclass(frozen=True)
class Setup:
    """One run of a campaign: its seed and the cluster it runs on."""
    index: int
    seed: int
    mode: str
    slaves: int
    groups: int
    secure: bool
    power_loss: bool = False  # brokers under the power-loss shim: random also draws power-loss faults
    corruption: bool = False  # small segments and a fast scrub: random also draws corrupt-* faults
    hosts: str = "local"  # "netns": every process on a host of its own (chaos/hosts.py)

    @property
    def name(self) -> str:
        return (f"run-{self.index:03d}-seed-{self.seed}-{self.mode}-{self.slaves}s-{self.groups}g-"
                f"{'secure' if self.secure else 'insecure'}")

    @property
    def label(self) -> str:
        return (f"{self.mode}, {self.slaves} slave{'s' if self.slaves > 1 else ''}, "
                f"{self.groups} group{'s' if self.groups > 1 else ''}, {'secure' if self.secure else 'insecure'}")

    def command(self, seconds: float, out: Path, zk_nodes: int) -> list[str]:
        return [sys.executable, "-m", "chaos", "run", "--scenario", "random", "--seconds", f"{seconds:g}",
                "--seed", str(self.seed), "--mode", self.mode, "--slaves", str(self.slaves),
                "--groups", str(self.groups), "--zk-nodes", str(zk_nodes),
                "--secure" if self.secure else "--insecure", *(["--power-loss"] if self.power_loss else []),
                *(["--corruption"] if self.corruption else []),
                *(["--hosts", self.hosts] if self.hosts != "local" else []),
                "--out", str(out / self.name)]


def plan(runs: int, first_seed: int, power_loss: bool = False, corruption: bool = False,
         hosts: str = "local") -> list[Setup]:
    """The campaign's runs: the same arguments always give the same plan (resuming relies on it)."""
    combos = list(itertools.product(("sync", "async"), (1, 2), (1, 2), (True, False)))
    random.Random(f"campaign/{first_seed}").shuffle(combos)
    return [Setup(i, first_seed + i, *combos[i % len(combos)], power_loss=power_loss, corruption=corruption, hosts=hosts)
            for i in range(runs)]


def load_result(out: Path, setup: Setup) -> dict[str, Any] | None:
    """The run's summary, or None if it has not finished (never started, crashed, unreadable)."""
    try:
        return json.loads((out / setup.name / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None


def parse_lane(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N) with 1 <= K <= N; ValueError naming the problem otherwise."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--lane wants K/N (e.g. 1/2), got {text!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"--lane K/N needs 1 <= K <= N, got {text!r}")
    return k, n


def lane_setups(setups: list[Setup], lane: tuple[int, int]) -> list[Setup]:
    """The setups lane ``K/N`` runs: every N-th, from the (K-1)-th; the lanes partition the plan."""
    k, n = lane
    return [s for s in setups if s.index % n == k - 1]


def check_settings(out: Path, seconds: float, first_seed: int, zk_nodes: int, power_loss: bool = False,
                   corruption: bool = False, hosts: str = "local") -> str | None:
    """Resuming with other settings would mix runs of two campaigns in one table: the
    problem as one line, or None (and the settings recorded) when they match or are new."""
    path = out / SETTINGS_FILE
    wanted = {"seconds": seconds, "first_seed": first_seed, "zk_nodes": zk_nodes, "power_loss": power_loss,
              "corruption": corruption, "hosts": hosts}
    try:
        known = {"power_loss": False, "corruption": False, "hosts": "local", **json.loads(path.read_text())}  # recorded before the option: without
    except (OSError, ValueError):
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(wanted))
        return None
    differs = [f"--{k.replace('_', '-')} {known.get(k)} (now {v})" for k, v in wanted.items() if known.get(k) != v]
    if differs:
        return f"{out} holds a campaign run with {', '.join(differs)}; use another --out or the same settings"
    return None


def execute(setup: Setup, seconds: float, out: Path, zk_nodes: int) -> tuple[dict[str, Any] | None, int]:
    """Runs one setup as a child process (output in its directory's campaign.log); its
    summary (None if it wrote none) and its exit code."""
    run_dir = out / setup.name
    run_dir.mkdir(parents=True, exist_ok=True)
    # The run's own time plus cluster start, settling, the final drain and the checker;
    # past that it is hung.
    limit = 3 * seconds + 900
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    with open(run_dir / "campaign.log", "wb") as log:
        child = subprocess.Popen(setup.command(seconds, out, zk_nodes), stdout=log, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        try:
            rc = child.wait(limit)
        except subprocess.TimeoutExpired:
            rc = stop_hung(child)
            hung = {"ok": False, "seed": setup.seed, "error": f"no result after {limit:g}s: stopped (exit {rc})"}
            (run_dir / RESULT_FILE).write_text(json.dumps(hung))
    return load_result(out, setup), rc


def stop_hung(child: subprocess.Popen) -> int:
    """SIGTERM to the run's own process group (it started its brokers and ZooKeeper in
    it), SIGKILL if it is still there 30 s later."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            break
        try:
            return child.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    return child.wait()


# --- the tables -------------------------------------------------------------------------


def verdict(result: dict[str, Any] | None) -> str:
    if result is None:
        return "not run"
    if result.get("error"):
        return f"ERROR ({result['error']})"
    return "PASS" if result.get("ok") else "FAIL"


def run_row(setup: Setup, result: dict[str, Any] | None) -> list[str]:
    """One markdown row: seed, setup, every anomaly count, other violations (safety and
    liveness checks outside the anomaly set, settle failures, accepted forgeries, commits
    the broker should have refused), faults,
    failovers, acked puts, verdict."""
    stats = (result or {}).get("stats")
    if not stats:
        return [str(setup.seed), setup.label, *["-"] * (len(ANOMALY_COLUMNS) + 4), verdict(result)]
    anomalies = stats.get("anomalies", {})
    counts = [int(anomalies.get(name, 0)) for name in ANOMALY_COLUMNS]
    other = int(result.get("violations", 0)) - sum(counts)
    other += sum(len(result.get(key) or []) for key in ("settle_failures", "hostile_problems", "txn_problems"))
    injected = result.get("injected") or {}
    return [str(setup.seed), setup.label, *map(str, counts), str(other), str(sum(injected.values())),
            str(stats.get("failovers", 0)), f"{stats.get('puts_ok', 0):,}", verdict(result)]


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def runs_table(results: list[tuple[Setup, dict[str, Any] | None]]) -> list[str]:
    header = ["seed", "setup", *ANOMALY_COLUMNS, "other violations", "faults", "failovers", "acked", "verdict"]
    return markdown(header, [run_row(setup, result) for setup, result in results])


def unavailability(results: list[tuple[Setup, dict[str, Any] | None]]) -> dict[str, dict[str, Any]]:
    """Per fault kind over every finished run: the liveness check's own per-fault records
    of all runs, aggregated as it aggregates one run's (count summed, the worst of each
    time; a write recovery that never came stays "never")."""
    records = [rec for _setup, result in results
               for rec in ((result or {}).get("stats") or {}).get("liveness_faults", [])]
    return table(records)


def unavailability_table(rows: dict[str, dict[str, Any]]) -> list[str]:
    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:.2f}"

    return markdown(["fault", "n", "writes max", "writes after end", "reads max", "reads after end"],
                    [[kind, str(row["faults"]), seconds(row["write_unavailable_s"]), seconds(row["write_recovery_s"]),
                      seconds(row["read_unavailable_s"]), seconds(row["read_recovery_s"])]
                     for kind, row in sorted(rows.items())])


def command_line(runs: int, seconds: float, first_seed: int, zk_nodes: int, out: Path, power_loss: bool = False,
                 corruption: bool = False, hosts: str = "local") -> str:
    return (f"python -m chaos campaign --runs {runs} --seconds {seconds:g} --first-seed {first_seed} "
            f"--zk-nodes {zk_nodes}{' --power-loss' if power_loss else ''}{' --corruption' if corruption else ''}"
            f"{f' --hosts {hosts}' if hosts != 'local' else ''} --out {out}")


def report(results: list[tuple[Setup, dict[str, Any] | None]], seconds: float, command: str) -> str:
    finished = [r for _s, r in results if r is not None]
    passed = sum(1 for r in finished if verdict(r) == "PASS")
    lines = [f"Campaign of {len(results)} random runs of {seconds:g} s each: {len(finished)} finished, "
             f"{passed} passed.", "", "```", command, "```", "", *runs_table(results), "",
             "Unavailability per fault kind over every finished run (seconds; \"max\" = the longest time "
             "without a success around the fault, \"after end\" = from the heal to the first success):", "",
             *unavailability_table(unavailability(results)), ""]
    return "\n".join(lines)


# --- the command ------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = sub.add_parser("campaign", help="many random runs (varied setups, resumable), then one markdown table")
    p.add_argument("--runs", type=int, required=True, help="how many runs")
    p.add_argument("--seconds", type=float, default=300.0, help="how long faults are injected in each run")
    p.add_argument("--first-seed", type=int, default=1000, help="run i has seed first-seed + i")
    p.add_argument("--zk-nodes", type=int, default=3, choices=(1, 3))
    p.add_argument("--power-loss", action="store_true",
                   help="every run with --power-loss: brokers under the power-loss shim, random also draws "
                        "power-loss-master and power-loss-slave")
    p.add_argument("--corruption", action="store_true",
                   help="every run with --corruption: small segments and a fast scrub, random also draws "
                        "corrupt-master, corrupt-slave, truncate-master and truncate-slave")
    p.add_argument("--hosts", choices=("local", "netns"), default="local",
                   help="every run with --hosts: netns puts each process on a host of its own (needs root)")
    p.add_argument("--lane", default="1/1", metavar="K/N",
                   help="run only every N-th setup, from the K-th: N processes with lanes 1/N..N/N share one "
                        "--out (default 1/1: every setup)")
    p.add_argument("--out", default="/tmp/chaos-campaign",
                   help="directory of the runs and of campaign.md; run the same command again to resume")


def main(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if args.runs < 1 or not (math.isfinite(args.seconds) and args.seconds > 0):  # nan and inf compare as no error
        print(f"error: --runs and --seconds must be positive, got {args.runs} and {args.seconds:g}", file=sys.stderr)
        return 2
    try:
        lane = parse_lane(args.lane)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: cannot use --out {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    problem = check_settings(out, args.seconds, args.first_seed, args.zk_nodes, args.power_loss, args.corruption,
                             args.hosts)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    setups = plan(args.runs, args.first_seed, args.power_loss, args.corruption, args.hosts)
    mine = lane_setups(setups, lane)
    results = {s: load_result(out, s) for s in setups}
    command = command_line(args.runs, args.seconds, args.first_seed, args.zk_nodes, out, args.power_loss, args.corruption,
                           args.hosts)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns) as progress:
            task = progress.add_task("campaign", total=len(mine),
                                     completed=sum(results[s] is not None for s in mine))
            for setup in mine:
                if results[setup] is not None:
                    continue  # finished in an earlier invocation
                progress.update(task, description=f"seed {setup.seed} ({setup.label})")
                started = time.monotonic()
                results[setup], rc = execute(setup, args.seconds, out, args.zk_nodes)
                progress.console.print(f"seed {setup.seed} ({setup.label}): {verdict(results[setup])}"
                                       f" in {time.monotonic() - started:.0f}s"
                                       + ("" if results[setup] is not None else f", exit {rc}, no summary: "
                                          f"see {out / setup.name / 'campaign.log'}"))
                if results[setup] is not None:
                    progress.advance(task)
    finally:
        # Other lanes' runs finished meanwhile are read again: the table covers them too.
        results = {s: results[s] if s in mine else load_result(out, s) for s in setups}
        text = report(list(results.items()), args.seconds, command)
        (out / "campaign.md").write_text(text)
        print(text)
    return 0 if all(verdict(results[s]) == "PASS" for s in mine) else 1  # this lane's runs
