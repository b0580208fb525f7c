"""docs/chaos.md, "How to run": ``python -m chaos run`` and ``campaign`` refuse numbers that
make no run (exit 2, one line naming the flag) before any process starts."""

from __future__ import annotations

import pytest

from chaos.__main__ import main


@pytest.mark.parametrize("flags", [
    ["--seconds", "0"], ["--seconds", "-3"], ["--seconds", "inf"],
    # A rate of 0 divided by zero in every producer once the cluster was up; inf and a
    # negative rate made them put without pause.
    ["--rate", "0"], ["--rate", "-1"], ["--rate", "inf"], ["--rate", "nan"],
    ["--liveness-bound", "0"], ["--liveness-bound", "nan"],
])
def test_run_refuses_a_number_that_is_not_positive_before_starting_anything(flags, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--scenario", "kill-master", "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {flags[0]} must be a positive number" in err, err
    assert not out.exists()


@pytest.mark.parametrize("seconds", ["0", "nan", "inf"])
def test_campaign_refuses_seconds_that_are_not_a_positive_number(seconds, tmp_path, capsys):
    out = tmp_path / "campaign"
    assert main(["campaign", "--runs", "1", "--seconds", seconds, "--out", str(out)]) == 2
    assert "--seconds must be positive" in capsys.readouterr().err
    assert not out.exists()


def parse_run(argv: list[str]):
    import argparse

    from chaos import runner

    parser = argparse.ArgumentParser()
    runner.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["run", *argv])


@pytest.mark.parametrize("flags", [
    ["--scenario", "kill-master"],
    ["--scenario", "random", "--seed", "7"],
    ["--scenario", "random", "--insecure", "--no-topic-ops"],
    ["--scenario", "kill-slave", "--secure", "--rogue", "--rate", "5", "--mode", "async", "--groups", "2"],
    ["--scenario", "kill-master", "--zk-nodes", "1", "--consumer-group", "--transactions", "--idempotent"],
])
def test_the_reports_command_line_names_the_security_and_repeats_the_run(flags, tmp_path):
    """docs/chaos.md: "The report's command line names which (`--secure` or `--insecure`)";
    a single-fault run named neither, and a run's --rate was dropped."""
    from chaos.runner import run_of

    first = run_of(parse_run([*flags, "--out", str(tmp_path)]), tmp_path)
    line = first.command_line()
    words = line.split()
    assert ("--secure" in words) != ("--insecure" in words), line
    assert words[:4] == ["python", "-m", "chaos", "run"]
    again = run_of(parse_run(words[4:]), tmp_path)
    assert again.command_line() == line
    assert (again.rate, again.secure, again.history.meta) == (first.rate, first.secure, first.history.meta)


def test_a_run_clears_what_the_last_run_left_in_its_out_directory_and_nothing_else(tmp_path):
    """The default --out (/tmp/chaos-{scenario}-{seed}) is the same for the same command, so
    running it again met the last run's broker data: the second run of ``--scenario
    kill-master --seconds 8 --zk-nodes 1`` failed with 658 duplicates and 8 phantoms."""
    from chaos.runner import RUN_FILES, clear_previous_run

    for name in RUN_FILES:
        (tmp_path / name).write_text("old")
    segment = tmp_path / "cluster" / "g0-a" / "data" / "chaos-0" / "00000000000000000000.meta"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(b"old records")
    (tmp_path / "cluster" / "notes").write_text("old")
    (tmp_path / "consumers").mkdir()
    (tmp_path / "consumers" / "chaos-g0-c0.0.jsonl").write_text("{}\n")
    (tmp_path / "mine.txt").write_text("not the run's")
    (tmp_path / "elsewhere").mkdir()
    clear_previous_run(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster", "consumers", "elsewhere", "mine.txt"]
    assert not any((tmp_path / "cluster").iterdir()) and not any((tmp_path / "consumers").iterdir())
    clear_previous_run(tmp_path / "never-run")  # nothing there: nothing to do


def test_an_out_directory_that_cannot_be_made_is_one_line_exit_2(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert main(["run", "--scenario", "kill-master", "--out", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: cannot use --out {a_file}: "), err


def test_a_campaign_out_directory_that_cannot_be_made_is_one_line_exit_2(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert main(["campaign", "--runs", "1", "--seconds", "5", "--out", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: cannot use --out {a_file}: "), err
