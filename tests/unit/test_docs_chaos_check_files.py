"""docs/chaos.md, "The checker" and "The Kafka workload's anomalies", through the command a
user runs: ``python -m chaos check FILE [--json]`` on a saved history with one planted
anomaly exits 1, its report's ``anomalies:`` line and ``stats.anomalies`` of the JSON count
it under its Jepsen name; the clean history exits 0 with every count 0. (The verdicts
themselves are tests/unit/test_chaos_checker_anomalies.py's; this is the file round trip.)"""

from __future__ import annotations

import json

import pytest

from chaos import anomalies
from chaos.__main__ import main
from tests.unit.test_chaos_checker_anomalies import clean, cross_reads, writes


def lost_write():
    k = clean()
    offset = k.put("p0-lost")
    del k.logs["t/0-0"][offset:]
    return k


def aborted_read():
    k = writes()
    (aborted,) = [r for r in k.records["t/0-1"] if r[1] == "t2-a"]
    k.h.poll("g1-c0", "g1", 1, {"t/0-1": [aborted]})
    return k


def intermediate_read():
    k = writes()
    k.h.poll("g1-c0", "g1", 1, {"t/0-0": [r for r in k.visible("t/0-0") if r[1] != "t1-b"]})
    return k


PLANTED = {
    "lost-write": lost_write,
    "unseen": lambda: clean(polls=lambda p, vis: (vis[: len(vis) // 2],
                                                   vis[len(vis) // 2: -1] if p == "t/0-1" else vis[len(vis) // 2:])),
    "duplicate": lambda: clean(polls=lambda p, vis: (vis[:2], vis[1:])),
    "poll-skip": lambda: clean(drained=False, polls=lambda p, vis: (vis[:2], vis[3:]) if p == "t/0-0" else (vis,)),
    "nonmonotonic-poll": lambda: clean(polls=lambda p, vis: (vis[len(vis) // 2:], vis[: len(vis) // 2])),
    "aborted-read": aborted_read,
    "intermediate-read": intermediate_read,
    "G1c": lambda: cross_reads(both=True),
}


def run_check(tmp_path, capsys, k, *flags):
    path = tmp_path / "history.json"
    k.finish().save(path)
    code = main(["check", str(path), *flags])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_saved_history_with_a_planted_anomaly_fails_through_the_command(name, tmp_path, capsys):
    assert name in ["lost-write", *anomalies.CHECKS]
    code, text = run_check(tmp_path, capsys, PLANTED[name]())
    assert code == 1 and text.startswith("chaos check: FAIL (mode sync)")
    (line,) = [x for x in text.splitlines() if x.strip().startswith("anomalies:")]
    counts = dict(part.split()[:2] for part in line.split(":", 1)[1].split(","))  # "name n (+k expected)"
    assert int(counts[name]) >= 1
    code, out = run_check(tmp_path, capsys, PLANTED[name](), "--json")
    result = json.loads(out)
    assert code == 1 and result["ok"] is False and result["stats"]["anomalies"][name] >= 1


def test_the_clean_saved_history_passes_through_the_command_with_every_count_zero(tmp_path, capsys):
    code, out = run_check(tmp_path, capsys, clean(), "--json")
    result = json.loads(out)
    assert code == 0 and result["ok"] is True
    assert result["stats"]["anomalies"] == {name: 0 for name in ["lost-write", *anomalies.CHECKS]}
    assert set(result) == {"ok", "mode", "checks", "stats", "warnings"}
