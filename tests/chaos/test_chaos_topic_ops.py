"""Topic operations in a random chaos run (chaos/topic_ops.py), security on, through a failover.

One short ``python -m chaos run --scenario random`` (seed 9: a kill-master first, then the
slave cut from its peers) with ``--topic-ops`` on: the side topic is created, grown, altered,
deleted and re-created smaller beside the faults and the workload, and every operation's
state is checked on every member. Required: 0 violations of every check (the workload topic
keeps its guarantees while the side topic churns), topic operations of every kind ran, and
at least one was checked on every member.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.chaos

REPO = Path(__file__).resolve().parents[2]


def test_random_run_with_topic_operations_has_no_violation(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "chaos", "run", "--scenario", "random", "--seconds", "10", "--seed", "9",
           "--zk-nodes", "1", "--no-consumer-group", "--no-transactions", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    report = (out / "report.txt").read_text() if (out / "report.txt").exists() else proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    summary = json.loads((out / "summary.json").read_text())
    assert summary["secure"] and summary["violations"] == 0, report
    assert summary["stats"]["anomalies"]["topic-ops"] == 0 and summary["stats"]["failovers"] >= 1, report
    ops = summary["topic_ops"]["ops"]
    # The cycle got past a delete and a re-create, each checked: nothing was skipped.
    assert {"topic-create", "topic-add-partitions", "topic-alter", "topic-delete", "topic-recreate"} <= set(ops), report
    checked = json.loads((out / "check.json").read_text())["checks"]["topic-ops"]["checked"]
    assert checked == sum(ops.values()) + 1, report  # every operation, and the final check
    assert summary["topic_ops"]["outcomes"].get("verified", 0) >= 1, report
