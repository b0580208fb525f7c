"""Topic operations in a random chaos run (chaos/topic_ops.py), security on, through a failover.

One short ``python -m chaos run --scenario random`` (seed 9: a kill-master first, then the
slave cut from its peers) with ``--topic-ops`` on: the side topic is created, grown, altered,
deleted and re-created smaller beside the faults and the workload, and every operation's
state is checked on every member. Required: 0 violations of every check (the workload topic
keeps its guarantees while the side topic churns), topic operations of every kind ran, and
at least one was checked on every member.
"""

from __future__ import annotations

import pytest

from tests.chaos.run_support import Outcome, chaos_run

pytestmark = pytest.mark.chaos


@chaos_run("random", 9, 10, "sync", 1, "--no-consumer-group", "--no-transactions")
def test_random_run_with_topic_operations_has_no_violation(chaos_outcome: Outcome) -> None:
    report = chaos_outcome.report
    assert chaos_outcome.returncode == 0, f"{report}\n{chaos_outcome.stderr_tail}"
    summary = chaos_outcome.json("summary.json")
    assert summary["secure"] and summary["violations"] == 0, report
    assert summary["stats"]["anomalies"]["topic-ops"] == 0 and summary["stats"]["failovers"] >= 1, report
    ops = summary["topic_ops"]["ops"]
    # The cycle got past a delete and a re-create, each checked: nothing was skipped.
    assert {"topic-create", "topic-add-partitions", "topic-alter", "topic-delete", "topic-recreate"} <= set(ops), report
    checked = chaos_outcome.json("check.json")["checks"]["topic-ops"]["checked"]
    assert checked == sum(ops.values()) + 1, report  # every operation, and the final check
    assert summary["topic_ops"]["outcomes"].get("verified", 0) >= 1, report
