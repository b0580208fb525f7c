"""docs/chaos.md, "The checker": ``python -m chaos check FILE [--json]`` exits 0 (pass),
1 (violations), 2 (unreadable). A file that is JSON with the history's format tag but
broken entries is unreadable too: one line on stderr naming the entry, exit 2, never a
traceback and never exit 1 (which would claim the run lost data). And "The fault proxy":
``python -m chaos proxy`` on a port it cannot listen on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chaos.__main__ import main
from chaos.history import FORMAT

BROKEN = {
    "ops not an array": ({"ops": 5}, "'ops' is not a JSON array"),
    "op without type": ({"ops": [{"x": 1}]}, "ops[0] has type None"),
    "op with a text time": ({"ops": [{"id": 1, "type": "invoke", "f": "put", "time": "x"}]}, "ops[0] lacks"),
    "fault not an object": ({"faults": [1]}, "faults[0] is not a JSON object"),
    "failover without time": ({"failovers": [{"group": 0}]}, "failovers[0]"),
    "replica without group": ({"final": {"replicas": {"b0": {}}}}, "final.replicas['b0'] lacks"),
    "partition without records": (
        {"final": {"replicas": {"b0": {"group": 0, "role": "master", "partitions": {"t/0-0": {"end": 0}}}}}},
        "partitions['t/0-0'] lacks a 'records' array"),
    # Shaped right at the top, broken deeper (a record of one field): still exit 2.
    "record of one field": (
        {"final": {"replicas": {"b0": {"group": 0, "role": "master", "partitions": {"t/0-0": {"records": [[1]]}}}}}},
        "malformed entry"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_history_with_broken_entries_is_unreadable_exit_2_with_one_line_naming_it(name, tmp_path, capsys):
    doc, named = BROKEN[name]
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"format": FORMAT, **doc}))
    for extra in ([], ["--json"]):
        assert main(["check", str(path), *extra]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and err.startswith("error: cannot ") and named in err, err


def test_unreadable_files_exit_2_through_the_command_line(tmp_path):
    not_json = tmp_path / "not.json"
    not_json.write_text("not json")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"format": FORMAT, "ops": [{"x": 1}]}))
    for path in (tmp_path / "missing.json", not_json, broken, tmp_path):
        proc = subprocess.run([sys.executable, "-m", "chaos", "check", str(path)], capture_output=True, text=True)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.startswith("error: cannot"), proc.stderr


def test_proxy_on_a_port_it_cannot_listen_on_says_so_in_one_line(capsys):
    """``python -m chaos proxy --port 70000``: one line and exit 1, not an OverflowError traceback."""
    assert main(["proxy", "--port", "70000"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cannot listen on 127.0.0.1:70000"), err
