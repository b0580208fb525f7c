"""``python -m chaos campaign``: many random runs, each stored, one generated table.

A campaign is ``--runs N`` runs of the ``random`` scenario, each ``--seconds S`` long, run
one after the other as ``python -m chaos run`` child processes (each its own cluster, its
own logging, its own fault proxy) in ``{out}/{run name}/``. Run ``i`` has seed
``first_seed + i`` and the ``i``-th setup of a seeded shuffle of every combination of
sync/async, one/two slaves per group, one/two broker groups and security on/off, so that
any 16 consecutive runs cover every combination once and a short campaign is already varied.

**Stored results.** When a run ends, whatever its outcome, its evidence is stored as one
*row* in ``{out}/results/{run name}-attempt-{n}/``: ``row.json`` (seed, attempt, setup and
options, the commit the campaign runs on, the command, exit code, wall seconds), the run's
``summary.json`` and ``check.json`` (the checker's output), and for a run that did not pass
its ``history.json.gz`` (compressed), so anyone can check it again with ``python -m chaos
check``. A run that ends without a summary (crashed) or overruns its time limit (stopped:
its process group, SIGTERM then SIGKILL) is stored as an ``ERROR`` row: a hang or a crash
is a finding, not a retry.

**One commit.** ``{out}/campaign.json`` keeps the settings and the commit (``git rev-parse
HEAD``, ``+dirty`` when tracked files differ from it): a campaign is never resumed on
another commit or with other settings (one line, exit 2).

**Resumable, and re-runs are rows.** A setup with a stored first attempt is skipped, so the
same command continues an interrupted campaign. ``--rerun SEED`` runs that seed's setup
again: a new row (attempt 2, 3, ...), never a replacement.

**Stopping.** SIGTERM (or Ctrl-C) stops the campaign after the run in progress: that run
finishes and is stored like any other, no new one starts, and the same command resumes
later. A second signal stops the run in progress too; it is stored as an ``ERROR`` row
("stopped by the operator"), since it is a first attempt all the same.

Lanes: ``--lane K/N`` runs only the setups whose index is ``K - 1`` modulo ``N``, so ``N``
processes started with ``--lane 1/N`` ... ``--lane N/N`` on the same ``--out`` share one
campaign without ever running the same setup (each run has its own cluster and ports).

When done (or interrupted) it writes ``{out}/campaign.md`` from the stored rows alone
(``table_text``): the first-attempt pass rate at the top, the commit and command, one row
per stored run (seed, attempt, options, commit, verdict, faults, failovers, acked, lost,
duplicates, every anomaly count, liveness, the other violations by check, the workloads'
counts) and the unavailability per fault kind. ``python -m chaos campaign-table DIR``
writes the same file again from ``DIR``'s stored rows.
"""

from __future__ import annotations

import argparse
import gzip
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
CHECK_FILE = "check.json"
HISTORY_FILE = "history.json"
ROW_FILE = "row.json"
RESULTS_DIR = "results"
TABLE_FILE = "campaign.md"
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
    producers: str = "plain"  # "plain", "retry-unknown" (at least once) or "idempotent" (exactly once)
    rogue: bool = False  # hostile peers for the whole run (chaos/hostile.py)
    time_reads: bool = False  # the offset_for_time prober (chaos/time_reads.py); the default plan leaves it off

    @property
    def name(self) -> str:
        return (f"run-{self.index:03d}-seed-{self.seed}-{self.mode}-{self.slaves}s-{self.groups}g-"
                f"{'secure' if self.secure else 'insecure'}")

    @property
    def label(self) -> str:
        return ", ".join([f"{self.mode}", f"{self.slaves} slave{'s' if self.slaves > 1 else ''}",
                          f"{self.groups} group{'s' if self.groups > 1 else ''}",
                          "secure" if self.secure else "insecure",
                          *([self.producers] if self.producers != "plain" else []),
                          *(["rogue"] if self.rogue else []), *(["power loss"] if self.power_loss else []),
                          *(["corruption"] if self.corruption else []), *(["time reads"] if self.time_reads else []),
                          *([f"hosts {self.hosts}"] if self.hosts != "local" else [])])

    def command(self, seconds: float, out: Path, zk_nodes: int) -> list[str]:
        return [sys.executable, "-m", "chaos", "run", "--scenario", "random", "--seconds", f"{seconds:g}",
                "--seed", str(self.seed), "--mode", self.mode, "--slaves", str(self.slaves),
                "--groups", str(self.groups), "--zk-nodes", str(zk_nodes),
                "--secure" if self.secure else "--insecure",
                *([f"--{self.producers}"] if self.producers != "plain" else []), *(["--rogue"] if self.rogue else []),
                *(["--power-loss"] if self.power_loss else []), *(["--corruption"] if self.corruption else []),
                *(["--hosts", self.hosts] if self.hosts != "local" else []),
                *(["--time-reads"] if self.time_reads else []),
                "--out", str(out / self.name)]


#: The producers' settings, in turn: run ``i`` has ``PRODUCERS[i % 3]`` (3 and 16 are coprime,
#: so over 48 runs every setup meets each).
PRODUCERS = ("plain", "idempotent", "retry-unknown")


def plan(runs: int, first_seed: int, power_loss: bool = False, corruption: bool = False,
         hosts: str = "local") -> list[Setup]:
    """The campaign's runs: the same arguments always give the same plan (resuming relies on it).
    Hostile peers (``--rogue``) in every fourth run, shifted by one each 16 runs so that
    they meet every setup."""
    combos = list(itertools.product(("sync", "async"), (1, 2), (1, 2), (True, False)))
    random.Random(f"campaign/{first_seed}").shuffle(combos)
    return [Setup(i, first_seed + i, *combos[i % len(combos)], power_loss=power_loss, corruption=corruption,
                  hosts=hosts, producers=PRODUCERS[i % len(PRODUCERS)], rogue=(i + i // len(combos)) % 4 == 3)
            for i in range(runs)]


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


def current_commit() -> str:
    """The commit this code is at (``git rev-parse HEAD``), ``+dirty`` when tracked files
    differ from it; ``unknown`` outside a git checkout."""
    repo = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def check_settings(out: Path, seconds: float, first_seed: int, zk_nodes: int, power_loss: bool = False,
                   corruption: bool = False, hosts: str = "local", commit: str | None = None) -> str | None:
    """Resuming with other settings, or on another commit, would mix two campaigns in one
    table: the problem as one line, or None (and the settings recorded) when they match or
    are new. A campaign recorded before the commit was kept is on an unknown commit."""
    settings: dict[str, Any] = {"seconds": seconds, "first_seed": first_seed, "zk_nodes": zk_nodes,
                                "power_loss": power_loss, "corruption": corruption, "hosts": hosts}
    if commit is not None:
        settings["commit"] = commit
    path = out / SETTINGS_FILE
    try:
        known = {"power_loss": False, "corruption": False, "hosts": "local", "commit": "unknown",
                 **json.loads(path.read_text())}  # recorded before an option: without it
    except (OSError, ValueError):
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
        return None
    differs = [f"{'--' + k.replace('_', '-') if k != 'commit' else 'commit'} {known.get(k)} (now {v})"
               for k, v in settings.items() if known.get(k) != v]
    if differs:
        return f"{out} holds a campaign run with {', '.join(differs)}; use another --out or the same settings"
    return None


# --- running and storing --------------------------------------------------------------------


@dataclass
class Row:
    """One stored run: its ``row.json`` and what the run wrote (None: nothing)."""
    meta: dict[str, Any]
    summary: dict[str, Any]
    check: dict[str, Any] | None
    path: Path

    @property
    def key(self) -> tuple[int, int]:
        return int(self.meta["index"]), int(self.meta["attempt"])


def stored_rows(out: Path) -> list[Row]:
    """Every stored run under ``out/results``, by plan index then attempt."""
    rows = []
    for row_file in sorted((out / RESULTS_DIR).glob(f"*/{ROW_FILE}")):
        directory = row_file.parent
        try:
            meta = json.loads(row_file.read_text())
            summary = json.loads((directory / RESULT_FILE).read_text())
        except (OSError, ValueError):
            continue  # a row being written when the campaign was stopped: not stored
        try:
            checked = json.loads((directory / CHECK_FILE).read_text())
        except (OSError, ValueError):
            checked = None
        rows.append(Row(meta, summary, checked, directory))
    return sorted(rows, key=lambda r: r.key)


def execute(setup: Setup, seconds: float, out: Path, zk_nodes: int) -> tuple[dict[str, Any], int]:
    """Runs one setup as a child process (output in its directory's campaign.log); its
    summary (an ``error`` one when it wrote none or was stopped) and its exit code."""
    run_dir = out / setup.name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RESULT_FILE).unlink(missing_ok=True)  # a re-run's own summary, not the last attempt's
    # The run's own time plus cluster start, settling, the final drain and the checker;
    # past that it is hung.
    limit = 3 * seconds + 900
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    with open(run_dir / "campaign.log", "wb") as log:
        child = subprocess.Popen(setup.command(seconds, out, zk_nodes), stdout=log, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        deadline = time.monotonic() + limit
        while (rc := child.poll()) is None and time.monotonic() < deadline and not STOP.now:
            time.sleep(0.2)
        if rc is None:
            rc = stop_hung(child)
            why = "stopped by the operator" if STOP.now else f"no result after {limit:g}s: stopped"
            return {"ok": False, "seed": setup.seed, "error": f"{why} (exit {rc})"}, rc
    try:
        return json.loads((run_dir / RESULT_FILE).read_text()), rc
    except (OSError, ValueError):
        return {"ok": False, "seed": setup.seed, "error": f"exit {rc} without a summary: see campaign.log"}, rc


def store(out: Path, setup: Setup, attempt: int, summary: dict[str, Any], meta: dict[str, Any]) -> Path:
    """The run's evidence as a new row ``results/{run name}-attempt-{attempt}`` (module
    docstring); ``row.json`` last, so a row is stored whole or not at all."""
    run_dir, dest = out / setup.name, out / RESULTS_DIR / f"{setup.name}-attempt-{attempt}"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / RESULT_FILE).write_text(json.dumps(summary, indent=1))
    if (run_dir / CHECK_FILE).exists():
        (dest / CHECK_FILE).write_bytes((run_dir / CHECK_FILE).read_bytes())
    if verdict(summary) != "PASS" and (run_dir / HISTORY_FILE).exists():
        with open(run_dir / HISTORY_FILE, "rb") as src, gzip.open(dest / (HISTORY_FILE + ".gz"), "wb") as gz:
            gz.write(src.read())
    (dest / ROW_FILE).write_text(json.dumps({"index": setup.index, "seed": setup.seed, "attempt": attempt,
                                             "setup": setup.label, **meta}, indent=1))
    return dest


class StopRequests:
    """SIGTERM / SIGINT to the campaign: the first stops it after the run in progress
    (``after_run``), the second stops that run too (``now``)."""

    def __init__(self) -> None:
        self.after_run = False
        self.now = False

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._asked)

    def _asked(self, signum: int, _frame: Any) -> None:
        if self.after_run:
            self.now = True
            print(f"campaign: {signal.Signals(signum).name} again: stopping the run in progress", flush=True)
        else:
            self.after_run = True
            print(f"campaign: {signal.Signals(signum).name}: stopping after the run in progress "
                  "(again to stop it too)", flush=True)


STOP = StopRequests()


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
        return "ERROR"
    return "PASS" if result.get("ok") else "FAIL"


#: Checks counted in a column of their own (besides the anomalies): the rest are "other".
LIVENESS_CHECKS = ("liveness", "failover")


def violation_counts(row: Row) -> dict[str, int]:
    """check name -> violations, from the stored check.json (the checker's own output)."""
    checks = (row.check or {}).get("checks") or {}
    return {name: len(c.get("violations") or []) for name, c in checks.items()}


def run_row(row: Row) -> list[str]:
    """One markdown row of a stored run (``TABLE_HEADER``)."""
    summary, meta = row.summary, row.meta
    base = [str(meta["seed"]), str(meta["attempt"]), meta.get("setup", ""), str(meta.get("commit", "?"))[:12],
            verdict(summary) + (f" ({summary['error']})" if summary.get("error") else "")]
    stats = summary.get("stats")
    if not stats:
        return base + ["-"] * (len(TABLE_HEADER) - len(base))
    counts = violation_counts(row)
    anomalies = stats.get("anomalies", {})
    named = {"acked_lost", *ANOMALY_CHECKS, *LIVENESS_CHECKS}
    other = {name: n for name, n in counts.items() if n and name not in named}
    workloads = stats.get("workloads") or {}
    return base + [str(sum((summary.get("injected") or {}).values())), str(stats.get("failovers", 0)),
                   f"{stats.get('puts_ok', 0):,}", str(stats.get("lost_acked", 0)), str(stats.get("duplicates", 0)),
                   *(str(int(anomalies.get(name, 0))) for name in ANOMALY_COLUMNS),
                   str(sum(counts.get(name, 0) for name in LIVENESS_CHECKS)),
                   ", ".join(f"{name} {n}" for name, n in sorted(other.items())) or "0",
                   str(workloads.get("polls", "-")), str(workloads.get("transactions_committed", "-")),
                   str(workloads.get("topic_ops", "-"))]


TABLE_HEADER = ["seed", "attempt", "options", "commit", "verdict", "faults", "failovers", "acked", "lost",
                "duplicates", *ANOMALY_COLUMNS, "liveness", "other violations", "polls", "transactions",
                "topic ops"]


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def unavailability(rows: list[Row]) -> dict[str, dict[str, Any]]:
    """Per fault kind over every stored run: the liveness check's own per-fault records of all
    runs, aggregated as it aggregates one run's (count summed, the worst of each time; a
    write recovery that never came stays "never")."""
    return table([rec for row in rows for rec in (row.summary.get("stats") or {}).get("liveness_faults", [])])


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


def table_text(out: Path) -> str:
    """The campaign's markdown, from its stored rows alone."""
    rows = stored_rows(out)
    try:
        settings = json.loads((out / SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        settings = {}
    first = [r for r in rows if int(r.meta["attempt"]) == 1]
    passed = sum(verdict(r.summary) == "PASS" for r in first)
    commits = sorted({str(r.meta.get("commit")) for r in rows})
    rate = f"{passed} of {len(first)} ({100 * passed / len(first):.0f}%)" if first else "none yet"
    seconds = settings.get("seconds")
    lines = [f"**First-attempt pass rate: {rate}.** {len(rows)} stored runs ({len(rows) - len(first)} re-runs)"
             + (f" of {seconds:g} s each" if isinstance(seconds, (int, float)) else "")
             + f", on commit {', '.join(commits) if commits else settings.get('commit', '?')}.",
             "", "Made by:", "", "```", settings.get("command", "python -m chaos campaign ..."), "```",
             "", "Regenerated from the stored results by:", "", "```", f"python -m chaos campaign-table {out}", "```",
             "", "Each row's evidence: `results/<run>-attempt-<n>/` (`row.json`, `summary.json`, `check.json`; "
             "`history.json.gz` for a run that did not pass: `python -m chaos check` it after `gunzip`).", "",
             *markdown(TABLE_HEADER, [run_row(r) for r in rows]), "",
             "Unavailability per fault kind over every stored run (seconds; \"max\" = the longest time "
             "without a success around the fault, \"after end\" = from the heal to the first success):", "",
             *unavailability_table(unavailability(rows)), ""]
    return "\n".join(lines)


# --- the commands -----------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = sub.add_parser("campaign", help="many random runs (varied setups, resumable), each stored; the table "
                                        "generated from them")
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
    p.add_argument("--rerun", type=int, action="append", default=[], metavar="SEED",
                   help="run this seed's setup again (repeatable): a new row, the earlier attempts stay")
    p.add_argument("--out", default="/tmp/chaos-campaign",
                   help="directory of the runs, their stored results and campaign.md; run the same command "
                        "again to resume")
    t = sub.add_parser("campaign-table", help="write a campaign's campaign.md again from its stored results")
    t.add_argument("dir", help="the campaign's --out directory")


def main_table(args: argparse.Namespace) -> int:
    out = Path(args.dir)
    if not (out / SETTINGS_FILE).exists() and not (out / RESULTS_DIR).is_dir():
        print(f"error: {out} holds no campaign (no {SETTINGS_FILE}, no {RESULTS_DIR}/)", file=sys.stderr)
        return 2
    text = table_text(out)
    (out / TABLE_FILE).write_text(text)
    print(text)
    return 0


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
    setups = plan(args.runs, args.first_seed, args.power_loss, args.corruption, args.hosts)
    by_seed = {s.seed: s for s in setups}
    unknown = [seed for seed in getattr(args, "rerun", []) if seed not in by_seed]
    if unknown:
        print(f"error: --rerun {unknown[0]} is not a seed of this campaign ({setups[0].seed}..{setups[-1].seed})",
              file=sys.stderr)
        return 2
    commit = current_commit()
    command = command_line(args.runs, args.seconds, args.first_seed, args.zk_nodes, out, args.power_loss,
                           args.corruption, args.hosts)
    problem = check_settings(out, args.seconds, args.first_seed, args.zk_nodes, args.power_loss, args.corruption,
                             args.hosts, commit)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    settings = json.loads((out / SETTINGS_FILE).read_text())
    if settings.get("command") is None:
        (out / SETTINGS_FILE).write_text(json.dumps({**settings, "command": command}))
    attempts = {}
    for row in stored_rows(out):
        attempts[row.meta["seed"]] = max(attempts.get(row.meta["seed"], 0), int(row.meta["attempt"]))
    todo = [s for s in lane_setups(setups, lane) if s.seed not in attempts]
    todo += [by_seed[seed] for seed in getattr(args, "rerun", [])]
    verdicts: list[str] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    STOP.install()
    try:
        with Progress(*columns) as progress:
            task = progress.add_task("campaign", total=len(todo))
            for setup in todo:
                if STOP.after_run:
                    progress.console.print(f"campaign: stopped before seed {setup.seed}; the same command resumes it")
                    break
                attempt = attempts.get(setup.seed, 0) + 1
                progress.update(task, description=f"seed {setup.seed} ({setup.label}), attempt {attempt}")
                started = time.monotonic()
                summary, rc = execute(setup, args.seconds, out, args.zk_nodes)
                wall = round(time.monotonic() - started, 1)
                store(out, setup, attempt, summary, {"commit": commit, "exit": rc, "wall_s": wall,
                                                     "command": " ".join(["python", *setup.command(
                                                         args.seconds, out, args.zk_nodes)[1:]])})
                attempts[setup.seed] = attempt
                verdicts.append(verdict(summary))
                progress.console.print(f"seed {setup.seed} ({setup.label}), attempt {attempt}: {verdicts[-1]} "
                                       f"in {wall:.0f}s")
                progress.advance(task)
    finally:
        # Every stored row, whichever lane or invocation ran it.
        text = table_text(out)
        (out / TABLE_FILE).write_text(text)
        print(text)
    return 0 if all(v == "PASS" for v in verdicts) else 1  # this invocation's runs
