"""The campaign's pure logic (chaos/campaign.py): its plan, resuming, the stored rows and the
table generated from them.

The runs themselves are ``python -m chaos run`` processes, proved by the chaos tests;
here ``execute`` is replaced by one that writes a run's files in the shape the runner
writes them."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import pytest

from chaos import campaign
from chaos.campaign import ANOMALY_COLUMNS, Row, Setup, plan


def fault(kind: str, write_max: float, write_after: float | None, read_max: float, read_after: float) -> dict:
    return {"kind": kind, "writes_expected": True, "write_unavailable_s": write_max, "write_recovery_s": write_after,
            "read_unavailable_s": read_max, "read_recovery_s": read_after}


def summary(ok: bool, anomalies: dict[str, int] | None = None, liveness_faults: list[dict] | None = None,
            **extra) -> dict:
    return {"ok": ok, "injected": {"kill-master": 2, "pause-slave": 1},
            "stats": {"anomalies": {name: (anomalies or {}).get(name, 0) for name in ANOMALY_COLUMNS}, "failovers": 2,
                      "puts_ok": 1234, "lost_acked": 0, "duplicates": 0, "liveness_faults": liveness_faults or [],
                      "workloads": {"polls": 40, "transactions_committed": 12, "topic_ops": 5}}, **extra}


def check_json(ok: bool, violations: dict[str, int] | None = None) -> dict:
    names = ["final_masters", "acked_lost", "liveness", "failover", "progress", "run", *ANOMALY_COLUMNS[1:]]
    return {"ok": ok, "checks": {name: {"ok": not (violations or {}).get(name),
                                        "violations": [{"why": "x"}] * (violations or {}).get(name, 0)}
                                 for name in names}}


def args_for(tmp_path: Path, runs: int = 3, **overrides) -> argparse.Namespace:
    return argparse.Namespace(**{"runs": runs, "seconds": 30.0, "first_seed": 1, "zk_nodes": 3, "power_loss": False,
                                 "corruption": False, "hosts": "local", "lane": "1/1", "rerun": [],
                                 "out": str(tmp_path), **overrides})


class FakeRuns:
    """``execute`` as the runner would leave a run: summary.json, check.json, history.json in
    its directory; ``outcomes`` maps a seed to the verdicts of its successive attempts."""

    def __init__(self, monkeypatch, outcomes: dict[int, list[str]] | None = None) -> None:
        self.ran: list[int] = []
        self.outcomes = outcomes or {}
        monkeypatch.setattr(campaign, "execute", self)
        monkeypatch.setattr(campaign, "current_commit", lambda: "c0ffee")

    def __call__(self, setup, seconds, out, zk_nodes):
        self.ran.append(setup.seed)
        outcome = self.outcomes.get(setup.seed, ["PASS"]).pop(0) if self.outcomes.get(setup.seed) else "PASS"
        if outcome == "CRASH":
            return {"ok": False, "seed": setup.seed, "error": "exit 1 without a summary: see campaign.log"}, 1
        ok = outcome == "PASS"
        run_dir = out / setup.name
        run_dir.mkdir(parents=True, exist_ok=True)
        result = summary(ok, {"poll-skip": 0 if ok else 2})
        (run_dir / "summary.json").write_text(json.dumps(result))
        (run_dir / "check.json").write_text(json.dumps(check_json(ok, None if ok else {"poll-skip": 2, "run": 1})))
        (run_dir / "history.json").write_text('{"format": "metaq-chaos-history/1"}')
        return result, 0 if ok else 1


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
    # Producers in turn, hostile peers in every fourth run, meeting every setup over 64 runs.
    long = plan(64, 7)
    assert {s.producers for s in long[:3]} == {"plain", "idempotent", "retry-unknown"}
    assert "--idempotent" in long[1].command(30, Path("/tmp/c"), 3) and "idempotent" in long[1].label
    rogue = [s for s in long if s.rogue]
    assert len(rogue) == 16 and len({(s.mode, s.slaves, s.groups, s.secure) for s in rogue}) == 16
    assert "--rogue" in rogue[0].command(30, Path("/tmp/c"), 3)


def test_every_run_is_stored_as_a_row_and_the_table_is_generated_from_the_rows(tmp_path: Path, monkeypatch) -> None:
    runs = FakeRuns(monkeypatch, {2: ["FAIL"], 3: ["CRASH"]})
    assert campaign.main(args_for(tmp_path)) == 1
    assert runs.ran == [1, 2, 3]
    stored = {r.meta["seed"]: r for r in campaign.stored_rows(tmp_path)}
    assert [stored[s].meta["attempt"] for s in (1, 2, 3)] == [1, 1, 1]
    assert all(r.meta["commit"] == "c0ffee" and r.meta["command"].startswith("python -m chaos run --scenario random")
               for r in stored.values())
    # The failed run's history is kept, compressed; the passing run's is not.
    assert json.loads(gzip.decompress((stored[2].path / "history.json.gz").read_bytes()))["format"]
    assert not (stored[1].path / "history.json.gz").exists()
    assert (stored[1].path / "check.json").exists()
    text = (tmp_path / "campaign.md").read_text()
    assert text.startswith("**First-attempt pass rate: 1 of 3 (33%).**") and "commit c0ffee" in text
    assert "--runs 3 --seconds 30 --first-seed 1" in text and f"campaign-table {tmp_path}" in text
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in text.splitlines()
            if line.startswith("| ") and line[2].isdigit()}
    assert rows["2"][4] == "FAIL" and rows["3"][4].startswith("ERROR (exit 1 without a summary")
    header = campaign.TABLE_HEADER
    assert rows["2"][header.index("poll-skip")] == "2" and rows["2"][header.index("other violations")] == "run 1"
    # campaign-table writes the same file from the stored rows alone.
    (tmp_path / "campaign.md").unlink()
    assert campaign.main_table(argparse.Namespace(dir=str(tmp_path))) == 0
    assert (tmp_path / "campaign.md").read_text() == text
    # Resuming runs nothing stored already, the crash included: a crash is a row, not a retry.
    assert campaign.main(args_for(tmp_path)) == 0 and runs.ran == [1, 2, 3]


def test_a_rerun_is_a_new_row_and_the_pass_rate_counts_first_attempts(tmp_path: Path, monkeypatch) -> None:
    runs = FakeRuns(monkeypatch, {2: ["FAIL", "PASS"]})
    campaign.main(args_for(tmp_path))
    assert campaign.main(args_for(tmp_path, rerun=[2])) == 0 and runs.ran == [1, 2, 3, 2]
    attempts = [(r.meta["seed"], r.meta["attempt"], campaign.verdict(r.summary)) for r in campaign.stored_rows(tmp_path)]
    assert attempts == [(1, 1, "PASS"), (2, 1, "FAIL"), (2, 2, "PASS"), (3, 1, "PASS")]
    text = (tmp_path / "campaign.md").read_text()
    assert text.startswith("**First-attempt pass rate: 2 of 3 (67%).** 4 stored runs (1 re-runs)")
    assert campaign.main(args_for(tmp_path, rerun=[99])) == 2  # not a seed of this campaign


def test_a_campaign_is_never_resumed_on_another_commit_or_with_other_settings(tmp_path: Path, monkeypatch) -> None:
    FakeRuns(monkeypatch)
    assert campaign.main(args_for(tmp_path, runs=1)) == 0
    assert campaign.main(args_for(tmp_path, runs=1, seconds=60.0)) == 2
    monkeypatch.setattr(campaign, "current_commit", lambda: "beef")
    assert campaign.main(args_for(tmp_path, runs=1)) == 2


def test_lanes_partition_the_plan_and_each_lanes_table_covers_every_stored_run(tmp_path: Path, monkeypatch) -> None:
    setups = plan(5, 1)
    lanes = [campaign.lane_setups(setups, (k, 2)) for k in (1, 2)]
    assert [s.seed for s in lanes[0]] == [1, 3, 5] and [s.seed for s in lanes[1]] == [2, 4]
    runs = FakeRuns(monkeypatch)
    assert campaign.main(args_for(tmp_path, runs=5, lane="2/2")) == 0 and runs.ran == [2, 4]
    assert "pass rate: 2 of 2" in (tmp_path / "campaign.md").read_text()
    assert campaign.main(args_for(tmp_path, runs=5, lane="1/2")) == 0 and runs.ran == [2, 4, 1, 3, 5]
    assert "pass rate: 5 of 5" in (tmp_path / "campaign.md").read_text()  # the other lane's runs too
    for bad in ("3/2", "0/2", "2", "a/b"):
        assert campaign.main(args_for(tmp_path, runs=5, lane=bad)) == 2


def test_campaign_table_of_a_directory_without_a_campaign_is_a_usage_error(tmp_path: Path, capsys) -> None:
    assert campaign.main_table(argparse.Namespace(dir=str(tmp_path))) == 2
    assert "holds no campaign" in capsys.readouterr().err


@pytest.mark.parametrize("stats", [True, False])
def test_run_rows_have_a_cell_for_every_column(stats: bool) -> None:
    meta = {"index": 0, "seed": 5, "attempt": 1, "setup": Setup(0, 5, "async", 2, 1, True).label, "commit": "abc"}
    result = summary(False, {"poll-skip": 3}) if stats else {"ok": False, "error": "no result after 990s"}
    row = campaign.run_row(Row(meta, result, check_json(False, {"poll-skip": 3, "liveness": 1, "progress": 1}),
                               Path("/nonexistent")))
    assert len(row) == len(campaign.TABLE_HEADER)
    assert row[:3] == ["5", "1", "async, 2 slaves, 1 group, secure"]
    if stats:
        cells = dict(zip(campaign.TABLE_HEADER, row))
        assert cells["poll-skip"] == "3" and cells["liveness"] == "1" and cells["other violations"] == "progress 1"
        assert cells["acked"] == "1,234" and cells["polls"] == "40" and cells["verdict"] == "FAIL"
    else:
        assert row[4].startswith("ERROR") and row[-1] == "-"


def test_unavailability_is_aggregated_over_runs() -> None:
    def row(faults):
        return Row({"index": 0, "seed": 1, "attempt": 1}, summary(True, liveness_faults=faults), None, Path("."))

    rows = campaign.unavailability([row([fault("kill-master", 1.5, 0.1, 1.2, 0.2), fault("zk-majority", 6.0, 0.9, 0.3, 0.2)]),
                                    row([fault("kill-master", 2.5, None, 0.8, 0.4)]),
                                    Row({"index": 2, "seed": 3, "attempt": 1}, {"ok": False, "error": "x"}, None, Path("."))])
    assert rows["kill-master"]["faults"] == 2 and rows["kill-master"]["write_unavailable_s"] == 2.5
    assert rows["kill-master"]["write_recovery_s"] is None and rows["kill-master"]["read_recovery_s"] == 0.4
    lines = campaign.unavailability_table(rows)
    assert lines[2] == "| kill-master | 2 | 2.50 | never | 1.20 | 0.40 |"
    assert lines[3] == "| zk-majority | 1 | 6.00 | 0.90 | 0.30 | 0.20 |"


class QuietStop(campaign.StopRequests):
    """The campaign's stop requests without signal handlers (pytest keeps its own)."""

    def install(self) -> None:
        pass


def test_a_stop_request_lets_the_run_in_progress_finish_and_be_stored_then_resume_continues(tmp_path: Path,
                                                                                          monkeypatch) -> None:
    stop = QuietStop()
    monkeypatch.setattr(campaign, "STOP", stop)
    runs = FakeRuns(monkeypatch)
    real_call = FakeRuns.__call__

    def asked_during_seed_2(self, setup, seconds, out, zk_nodes):
        if setup.seed == 2:
            stop._asked(15, None)  # SIGTERM while seed 2 runs
        return real_call(self, setup, seconds, out, zk_nodes)

    monkeypatch.setattr(FakeRuns, "__call__", asked_during_seed_2)
    campaign.main(args_for(tmp_path))
    assert runs.ran == [1, 2] and [r.meta["seed"] for r in campaign.stored_rows(tmp_path)] == [1, 2]
    monkeypatch.setattr(campaign, "STOP", QuietStop())
    campaign.main(args_for(tmp_path))
    assert runs.ran == [1, 2, 3]


def test_a_second_stop_request_stops_the_run_in_progress_as_an_error_row(tmp_path: Path, monkeypatch) -> None:
    import sys
    import threading

    stop = QuietStop()
    monkeypatch.setattr(campaign, "STOP", stop)
    monkeypatch.setattr(Setup, "command", lambda self, *_: [sys.executable, "-c", "import time; time.sleep(60)"])
    setup = plan(1, 5)[0]
    threading.Timer(0.5, lambda: (stop._asked(15, None), stop._asked(15, None))).start()
    result, rc = campaign.execute(setup, 30, tmp_path, 1)
    assert rc != 0 and result["error"].startswith("stopped by the operator")
    assert campaign.verdict(result) == "ERROR"
