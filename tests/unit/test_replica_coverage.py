"""Which partitions a slave does not replicate: the master's check (``ReplicaCoverage``) and
``metaq cluster``'s comparison of the master's topics with the slave's replica rows."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from metaq.cli.admin import Answer
from metaq.cli.cluster import Member, apply_coverage, unhealthy
from metaq.ha.progress import ReplicationProgress
from metaq.server.replica_health import ReplicaCoverage


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _broker(progress: ReplicationProgress, ends: dict[tuple[str, int], int]) -> Any:
    logs = {key: SimpleNamespace(log_end=end) for key, end in ends.items()}
    return SimpleNamespace(
        registry=SimpleNamespace(slave_ids=frozenset({1})),
        ha=SimpleNamespace(acting_master=True, progress=progress),
        store=SimpleNamespace(logs=lambda: dict(logs)),
        config=SimpleNamespace(broker_id=0, not_replicating_after_ms=2000),
    )


def test_the_master_names_partitions_without_a_position_or_stuck_behind_only_after_the_grace(caplog) -> None:
    clock = Clock()
    progress = ReplicationProgress(clock=clock)
    broker = _broker(progress, {("t", 0): 100, ("t", 1): 100, ("t", 2): 100, ("t", 3): 0})
    coverage = ReplicaCoverage(broker, clock=clock)
    progress.fetched(1, "t", 0, 100, 1)  # caught up
    progress.fetched(1, "t", 1, 40, 1)  # behind, and it will not move
    coverage.check()
    assert coverage.missing == {}  # the slave just registered: not judged yet
    clock.now += 3
    progress.fetched(1, "t", 0, 100, 1)
    with caplog.at_level(logging.WARNING):
        coverage.check()
    # t-2: no position at all; t-1: behind and not moving; t-3: empty and never fetched is no
    # replica either; t-0 caught up.
    assert coverage.missing == {1: ["t-0-1", "t-0-2", "t-0-3"]}
    assert "slave1 is not replicating 3 of 4 partition(s): t-0-1, t-0-2, t-0-3" in caplog.text
    assert coverage.status_pairs() == [("not_replicated slave1", {"count": 3, "partitions": "t-0-1,t-0-2,t-0-3"})]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        coverage.check()
    assert caplog.text == ""  # said once per change
    for partition in (1, 2, 3):
        progress.fetched(1, "t", partition, 100 if partition < 3 else 0, 1)
    with caplog.at_level(logging.INFO):
        coverage.check()
    assert coverage.missing == {} and "slave1 replicates every partition again" in caplog.text
    broker.ha.acting_master = False
    coverage.check()
    assert coverage.status_pairs() == []


class _Reply:
    def __init__(self, rows: dict[str, dict[str, str]]) -> None:
        self.rows = rows

    def replica_rows(self) -> dict[str, dict[str, str]]:
        return self.rows


def test_cluster_names_the_partitions_a_slave_has_no_replica_of() -> None:
    members = [Member(0, "master", "meta://a:1", state="up"),
               Member(0, "slave1", "meta://b:1", state="up"),
               Member(0, "slave2", "meta://c:1", state="1 partition(s) stopped", stopped={"t-0-2": "CRC"})]
    answers = {
        "meta://b:1": Answer(_Reply({"t-0-0": {"state": "following"}})),  # type: ignore[arg-type]
        "meta://c:1": Answer(_Reply({"t-0-0": {"state": "following"}, "t-0-1": {"state": "following"},  # type: ignore[arg-type]
                                     "t-0-2": {"state": "stopped"}})),
    }
    apply_coverage(members, answers, {"meta://a:1": {"t": 3}})
    assert members[1].not_replicating == ["t-0-1", "t-0-2"] and members[1].state == "2 partition(s) not replicated"
    assert members[2].not_replicating == [] and members[2].state == "1 partition(s) stopped"
    assert unhealthy(members) == [
        "UNHEALTHY broker group 0: slave1 (meta://b:1) does not replicate 2 partition(s) its master serves: t-0-1, t-0-2",
        "UNHEALTHY broker group 0: slave2 (meta://c:1) stopped replicating 1 partition(s): t-0-2 (first: CRC)",
    ]
