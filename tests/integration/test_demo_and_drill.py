"""The two operator-facing showcases, end to end as a user runs them: ``metaq demo`` (the
README's first command, security on: every client and tool logs in, and an outsider's
attempts are refused) and ``metaq drill`` against a running sync pair."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from metaq.tools.launcher import LocalCluster
from metaq.process import stop_pid

REPO = Path(__file__).resolve().parents[2]


def metaq(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "metaq", *args], capture_output=True, text=True, timeout=timeout, env=env)


def row(output: str, label: str) -> str:
    """The value column of a row of the demo's summary table."""
    found = re.search(rf"{re.escape(label)}\s*│\s*(.*?)\s*│", output)
    assert found, f"no row {label!r} in:\n{output}"
    return found.group(1)


def test_demo_fails_over_and_loses_nothing() -> None:
    proc = metaq("demo")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert row(out, "security").startswith("on (logins, ACLs")
    for attempt in ("anonymous put", "stats config by app (not an admin)", "forged position by app", "ZooKeeper epoch write, no group secret"):
        assert row(out, attempt) == "refused"
    assert "anonymous put: refused (403 not authenticated" in out
    assert row(out, "messages produced (sync acks)") == row(out, "read back from the slave") == "5000"
    assert row(out, "acked messages lost") == "0"
    assert row(out, "logs identical before failover") == row(out, "logs identical after role swap") == "True"
    assert row(out, "epoch") == "1 -> 2"
    # The drill logged in as an admin, so it read the new master's epoch history.
    assert row(out, "failover: first acked write on new master").endswith("s")


def test_drill_repeated_against_a_sync_pair(tmp_path: Path) -> None:
    system = {"unflushThreshold": 0, "replicationMode": "sync", "onSyncSlaveLoss": "degrade", "syncSlaveTimeoutMs": 1000}
    cluster = LocalCluster(
        tmp_path, masters=1, slaves=1, topics={"drill": 2}, system=system, tick_ms=100,
        zookeeper={"zk.zkSessionTimeoutMs": 1500, "zk.zkSyncTimeMs": 0},
    )
    restarted: list[int] = []
    with cluster:
        try:
            proc = metaq("drill", "--zk", cluster.zk_connect, "--broker-id", "0", "--repeat", "2", "--rate", "100")
            out = proc.stdout
            # The drill restarts each killed master itself: those processes are ours to stop.
            restarted = [int(pid) for pid in re.findall(r"restarted the old master as pid (\d+)", out)]
            assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
        finally:
            for pid in restarted:
                stop_pid(pid)
    assert "drill 1: fault=kill mode=sync" in out and "drill 2: fault=kill mode=sync" in out
    assert len(re.findall(r"logs identical: True", out)) == 2
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("summary: 2 drills, 2 failovers;") and " lost 0;" in summary, summary
    # Lost and duplicates are reported apart; the drill's load is idempotent by default, so
    # its resends through the failover are never stored twice.
    assert len(re.findall(r"duplicates 0 \(idempotent producer\)", out)) == 2, out[-3000:]
    assert summary.endswith(" duplicates 0"), summary
