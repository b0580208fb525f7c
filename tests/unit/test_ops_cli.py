"""The operator surface without processes: every option explained, --version, log formats,
the ZooKeeper outage lines, and the group topic configuration's pure rules."""

from __future__ import annotations

import argparse
import json
import logging

import pytest
from kazoo.client import KazooState

from metaq import __version__
from metaq.cli import build_parser, main
from metaq.config import TopicConfig, parse_server_ini
from metaq.logsetup import JsonFormatter, configure
from metaq.server.group_topics import describe_change
from metaq.zk.monitor import OutageReporter
from metaq.zk.topic_config import GroupTopics, decode_group_topics, seed_with, serve_group_topics


def _options(parser: argparse.ArgumentParser, prefix: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{prefix} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield prefix, action


def test_every_option_of_every_command_has_help():
    missing = [f"{cmd} {a.option_strings or a.dest}" for cmd, a in _options(build_parser(), "metaq") if not a.help]
    assert missing == []


def test_version(capsys, root_logging):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"metaq-py {__version__}"


@pytest.fixture
def root_logging():
    """configure() changes the process's root logger: put it back for the next tests."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    ours = getattr(root, "_metaq_handler", None)
    if ours is not None:
        root.removeHandler(ours)
        ours.close()
        delattr(root, "_metaq_handler")
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_log_lines_and_rotating_file(tmp_path, root_logging):
    target = tmp_path / "broker.log"
    configure("INFO", str(target), "json", max_bytes=400, backup_count=2, force=True)
    for i in range(20):
        logging.getLogger("metaq.test").info("line %d", i)
    logging.getLogger("kazoo.client").warning("Connection dropped")  # muted: outages are reported once
    logging.getLogger().handlers[-1].flush()
    entries = [json.loads(line) for line in target.read_text().splitlines()]
    assert entries[-1]["msg"] == "line 19" and entries[-1]["level"] == "INFO" and entries[-1]["logger"] == "metaq.test"
    assert entries[-1]["ts"].endswith("Z")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broker.log", "broker.log.1", "broker.log.2"]
    assert not any("Connection dropped" in p.read_text() for p in tmp_path.iterdir())


def test_json_formatter_keeps_the_traceback():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, __import__("sys").exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert entry["msg"] == "failed" and "ValueError: boom" in entry["exc"]


def test_a_zookeeper_outage_ends_with_one_line(caplog):
    now = [100.0]
    reporter = OutageReporter(clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="metaq.zk.monitor"):
        reporter(KazooState.CONNECTED)  # not after an outage: silent
        reporter(KazooState.SUSPENDED)
        now[0] = 103.5
        reporter(KazooState.SUSPENDED)
        reporter(KazooState.LOST)
        now[0] = 104.0
        reporter(KazooState.CONNECTED)
        reporter(KazooState.CONNECTED)
    assert [r.getMessage() for r in caplog.records] == ["ZooKeeper reachable again after 4.0 s (a new session)"]


def test_seeding_adds_only_topics_the_group_lacks_and_no_operator_deleted():
    config = parse_server_ini(b"[system]\nbrokerId=0\n[topic=a]\nnumPartitions=2\n[topic=b]\n[topic=c]\n", "s.ini")
    group = GroupTopics({"a": {"numPartitions": "5"}}, frozenset({"c"}), version=3)
    seeded = seed_with(config.topics)(group)
    assert seeded is not None and set(seeded.topics) == {"a", "b"}
    assert seeded.topics["a"] == {"numPartitions": "5"}, "the group's settings win over server.ini"
    assert seed_with({"a": config.topics["a"]})(group) is None, "nothing to add: no write"
    fresh = seed_with(config.topics)(GroupTopics())
    assert fresh is not None and set(fresh.topics) == {"a", "b", "c"} and fresh.version == 0


def test_members_serve_the_groups_topics_on_their_own_disk():
    own = parse_server_ini(b"[system]\nbrokerId=0\ndataPath=/slave\nunflushThreshold=9\n[topic=a]\ndataPath=/fast\n", "s.ini")
    group = decode_group_topics(b'{"topics":{"a":{"numPartitions":"3"},"n":{"acceptPublish":false}},"deleted":[]}', 4)
    served = serve_group_topics(own, own.topics, group, "zk")
    assert served["a"].num_partitions == 3 and served["a"].data_path == "/fast" and served["a"].unflush_threshold == 9
    assert served["n"].accept_publish is False and served["n"].data_path == "/slave"
    assert GroupTopics.encode(group) == group.encode() and decode_group_topics(group.encode(), 4) == group


def test_describe_change_names_what_an_operator_sees():
    a, b = TopicConfig("a"), TopicConfig("b")
    after = {"a": TopicConfig("a", unflush_threshold=0), "c": TopicConfig("c")}
    assert describe_change({"a": a, "b": b}, after) == (
        "now serving c; changed a (unflushThreshold 1000 -> 0); no longer serving b (its files are deleted)"
    )
    assert describe_change({"a": a}, {"a": a}) == ""


def test_grafana_dashboard_uses_only_series_the_broker_exports():
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    dashboard = json.loads((repo / "docs" / "grafana-dashboard.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"] for name in re.findall(r"metaq_\w+", target["expr"])}
    exported = set(re.findall(r'"(metaq_\w+)"', (repo / "metaq" / "server" / "metrics.py").read_text()))
    suffixes = ("_total", "_bucket", "_count", "_sum")
    unknown = {n for n in used if n not in exported and not any(n.endswith(s) and n[: -len(s)] in exported for s in suffixes)}
    assert used and not unknown, unknown


def test_drill_shows_a_live_status_on_a_terminal_only(capsys):
    import asyncio
    import io
    import re

    from rich.console import Console

    from metaq.cli.drill import drill_status

    async def run(console):
        with drill_status("drill 1 of 1: kill", console=console):
            await asyncio.sleep(0.7)

    screen = io.StringIO()
    asyncio.run(run(Console(file=screen, force_terminal=True, width=120)))
    assert "drill 1 of 1: kill" in screen.getvalue()
    assert re.search(r"drill 1 of 1: kill \(\d+ s\)", screen.getvalue()), "the elapsed time ticks"
    asyncio.run(run(None))  # stderr is not a terminal under pytest: nothing
    assert capsys.readouterr().err == ""
