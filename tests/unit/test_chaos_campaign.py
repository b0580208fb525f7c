"""The campaign's pure logic (chaos/campaign.py): its plan, resuming, and its two tables.

The runs themselves are ``python -m chaos run`` processes, proved by the chaos tests;
here summaries are written by hand in the shape the runner writes them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from chaos import campaign
from chaos.campaign import ANOMALY_COLUMNS, Setup, plan


def fault(kind: str, write_max: float, write_after: float | None, read_max: float, read_after: float) -> dict:
    return {"kind": kind, "writes_expected": True, "write_unavailable_s": write_max, "write_recovery_s": write_after,
            "read_unavailable_s": read_max, "read_recovery_s": read_after}


def summary(ok: bool, anomalies: dict[str, int], violations: int, liveness_faults: list[dict], **extra) -> dict:
    return {"ok": ok, "violations": violations, "injected": {"kill-master": 2, "pause-slave": 1},
            "stats": {"anomalies": {name: anomalies.get(name, 0) for name in ANOMALY_COLUMNS}, "failovers": 2,
                      "puts_ok": 1234, "liveness_faults": liveness_faults}, **extra}


def write_result(out: Path, setup: Setup, result: dict) -> None:
    (out / setup.name).mkdir(parents=True)
    (out / setup.name / campaign.RESULT_FILE).write_text(json.dumps(result))


def test_plan_is_stable_and_any_16_runs_cover_every_setup() -> None:
    runs = plan(20, 7)
    assert runs == plan(20, 7)  # resuming relies on it
    assert [s.seed for s in runs] == list(range(7, 27))
    setups = {(s.mode, s.slaves, s.groups, s.secure) for s in runs[3:19]}
    assert len(setups) == 16  # sync/async x 1/2 slaves x 1/2 groups x secure or not
    assert [s.mode for s in plan(16, 8)] != [s.mode for s in runs[:16]]  # the shuffle follows the seed
    assert len({s.name for s in runs}) == 20
    command = runs[0].command(30, Path("/tmp/c"), 3)
    assert command[command.index("--seed") + 1] == "7" and ("--secure" in command) != ("--insecure" in command)


def test_finished_runs_are_skipped_and_crashed_ones_run_again(tmp_path: Path, monkeypatch) -> None:
    setups = plan(3, 1)
    write_result(tmp_path, setups[0], summary(True, {}, 0, []))
    (tmp_path / setups[1].name).mkdir()
    (tmp_path / setups[1].name / campaign.RESULT_FILE).write_text("{truncated")  # crashed mid-write
    ran = []

    def execute(setup, seconds, out, zk_nodes):
        ran.append(setup.seed)
        return summary(True, {}, 0, []), 0

    monkeypatch.setattr(campaign, "execute", execute)
    args = argparse.Namespace(runs=3, seconds=30.0, first_seed=1, zk_nodes=3, power_loss=False, corruption=False, hosts="local",
                              lane="1/1", out=str(tmp_path))
    assert campaign.main(args) == 0
    assert ran == [2, 3]
    text = (tmp_path / "campaign.md").read_text()
    assert "3 finished, 3 passed" in text and "--runs 3 --seconds 30 --first-seed 1" in text
    args.seconds = 60.0  # another campaign's settings into the same directory
    assert campaign.main(args) == 2


def test_lanes_partition_the_plan_and_each_lanes_table_covers_every_finished_run(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    setups = plan(5, 1)
    lanes = [campaign.lane_setups(setups, (k, 2)) for k in (1, 2)]
    assert [s.seed for s in lanes[0]] == [1, 3, 5] and [s.seed for s in lanes[1]] == [2, 4]
    ran: list[int] = []

    def execute(setup, seconds, out, zk_nodes):
        ran.append(setup.seed)
        write_result(out, setup, summary(True, {}, 0, []))  # as the run writes it
        return summary(True, {}, 0, []), 0

    monkeypatch.setattr(campaign, "execute", execute)
    args = argparse.Namespace(runs=5, seconds=30.0, first_seed=1, zk_nodes=3, power_loss=False, corruption=False,
                              hosts="local", lane="2/2", out=str(tmp_path))
    assert campaign.main(args) == 0 and ran == [2, 4]
    assert "5 random runs of 30 s each: 2 finished" in (tmp_path / "campaign.md").read_text()
    args.lane = "1/2"
    assert campaign.main(args) == 0 and ran == [2, 4, 1, 3, 5]
    assert "5 finished, 5 passed" in (tmp_path / "campaign.md").read_text()  # the other lane's runs too
    for bad in ("3/2", "0/2", "2", "a/b"):
        args.lane = bad
        assert campaign.main(args) == 2


def test_run_rows_count_every_anomaly_other_violations_and_the_verdict() -> None:
    setup = Setup(0, 5, "async", 2, 1, True)
    failed = summary(False, {"poll-skip": 3, "lost-write": 1}, 6, [], settle_failures=["final: no master"],
                     txn_problems=["transaction x1-t8 committed 5.8s after it began with a 1s timeout"])
    row = campaign.run_row(setup, failed)
    assert row[:2] == ["5", "async, 2 slaves, 1 group, secure"]
    counts = dict(zip(ANOMALY_COLUMNS, row[2:]))
    assert counts["poll-skip"] == "3" and counts["lost-write"] == "1" and counts["unseen"] == "0"
    # 6 violations, 4 of them anomalies, plus one settle failure and one commit past a timeout.
    assert row[2 + len(ANOMALY_COLUMNS):] == ["4", "3", "2", "1,234", "FAIL"]
    assert campaign.run_row(setup, summary(True, {}, 0, []))[-1] == "PASS"
    assert campaign.run_row(setup, None)[-1] == "not run"
    hung = campaign.run_row(setup, {"ok": False, "error": "no result after 990s"})
    assert hung[-1].startswith("ERROR") and len(hung) == len(campaign.runs_table([])[0].split("|")) - 2


def test_unavailability_is_aggregated_over_runs() -> None:
    setups = plan(3, 1)
    results = [(setups[0], summary(True, {}, 0, [fault("kill-master", 1.5, 0.1, 1.2, 0.2),
                                                 fault("zk-majority", 6.0, 0.9, 0.3, 0.2)])),
               (setups[1], summary(True, {}, 0, [fault("kill-master", 2.5, None, 0.8, 0.4)])),
               (setups[2], None)]
    rows = campaign.unavailability(results)
    assert rows["kill-master"]["faults"] == 2 and rows["kill-master"]["write_unavailable_s"] == 2.5
    assert rows["kill-master"]["write_recovery_s"] is None and rows["kill-master"]["read_recovery_s"] == 0.4
    lines = campaign.unavailability_table(rows)
    assert lines[2] == "| kill-master | 2 | 2.50 | never | 1.20 | 0.40 |"
    assert lines[3] == "| zk-majority | 1 | 6.00 | 0.90 | 0.30 | 0.20 |"
