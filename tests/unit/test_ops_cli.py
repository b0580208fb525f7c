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
from metaq.config import TopicConfig, parse_server_ini, topic_settings
from metaq.logsetup import JsonFormatter, configure
from metaq.server.group_topics import describe_change
from metaq.zk.monitor import OutageReporter
from metaq.zk.topic_config import GroupTopics, decode_group_topics, publish_with, seed_with, serve_group_topics


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
    seeded = seed_with(config.topics, config.topic_defaults)(group)
    assert seeded is not None and set(seeded.topics) == {"a", "b"}
    assert seeded.topics["a"] == {"numPartitions": "5"}, "the group's settings win over server.ini"
    assert seed_with({"a": config.topics["a"]}, config.topic_defaults)(group) is None, "nothing to add: no write"
    fresh = seed_with(config.topics, config.topic_defaults)(GroupTopics())
    assert fresh is not None and set(fresh.topics) == {"a", "b", "c"} and fresh.version == 0


def test_a_system_default_edit_applies_to_every_topic_that_does_not_override_it():
    """Seeding and a SIGHUP'd edit store overrides only, never a pinned [system] value."""
    before = parse_server_ini(b"[system]\nbrokerId=0\nunflushInterval=10000\n[topic=s]\nunflushThreshold=7\n[topic=o]\nunflushInterval=50\n", "s.ini")
    seeded = seed_with(before.topics, before.topic_defaults)(GroupTopics())
    assert seeded is not None
    assert seeded.topics == {"s": {"numPartitions": "1", "unflushThreshold": "7"}, "o": {"numPartitions": "1", "unflushInterval": "50"}}
    # An operator's own override on s (metaq topics alter), and a topic created by the CLI.
    group = seeded.with_topic("s", {**seeded.topics["s"], "acceptSubscribe": "false"}).with_topic("made", {"numPartitions": "2"})
    after = parse_server_ini(b"[system]\nbrokerId=0\nunflushInterval=200\n[topic=s]\nunflushThreshold=7\n[topic=o]\nunflushInterval=50\n", "s.ini")
    edits = {name: (before.topics[name], after.topics[name]) for name in after.topics if before.topics[name] != after.topics[name]}
    assert set(edits) == {"s"}
    published = publish_with(edits, after.topic_defaults)(group)
    assert published is not None and published.topics["s"] == {"numPartitions": "1", "unflushThreshold": "7", "acceptSubscribe": "false"}
    served = serve_group_topics(after, after.topics, published, "zk")
    assert {name: t.unflush_interval_ms for name, t in served.items()} == {"s": 200, "made": 200, "o": 50}
    # A node seeded by an older version pins every key: the edit un-pins the key it changed.
    pinned = GroupTopics({"s": {**{k: v for k, v in topic_settings(before.topics["s"]).items()}}}, version=1)
    assert "unflushInterval" not in publish_with(edits, after.topic_defaults)(pinned).topics["s"]


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


def test_describe_filters_pick_under_replicated_and_unavailable_partitions():
    from metaq.cli.topics import _unavailable, _under_replicated

    rows = [
        (0, "master", "a", "up", 10, 10, None, "-"), (0, "slave1", "b", "up", 10, 10, 0, "yes"),
        (1, "master", "a", "up", 10, 10, None, "-"), (1, "slave1", "b", "up", 8, 8, 2, "no"),
        (2, "master", "a", "not served", None, None, None, "-"), (2, "slave1", "b", "unreachable", None, None, None, "yes"),
    ]
    assert _under_replicated(rows) == {1, 2}
    assert _unavailable(rows) == {2}
    async_rows = [(0, "master", "a", "up", 10, 10, None, "-"), (0, "slave0", "b", "up", 7, 7, 3, "-")]
    assert _under_replicated(async_rows) == {0}, "async: a slave behind its master"


def test_reset_offsets_parses_durations_and_offset_files(tmp_path):
    from metaq.cli.groups import _parse_duration, _read_offsets_file
    from metaq.errors import MetaqError

    assert _parse_duration("90s") == 90_000 and _parse_duration("2h") == 7_200_000 and _parse_duration("1d") == 86_400_000
    assert _parse_duration("PT1H30M") == 5_400_000 and _parse_duration("P1DT0.5S") == 86_400_500
    for bad in ("", "P", "PT", "5 minutes", "-3m"):
        with pytest.raises(MetaqError, match="--by-duration"):
            _parse_duration(bad)
    plan = tmp_path / "plan.csv"
    plan.write_text("# a backup\nfo,0-0,120\n\nfo, 1-2 ,0\n")
    assert _read_offsets_file(str(plan)) == {("fo", "0-0"): 120, ("fo", "1-2"): 0}
    plan.write_text("fo,0,120\n")
    with pytest.raises(MetaqError, match="line 1: expected TOPIC,BROKER-N,OFFSET"):
        _read_offsets_file(str(plan))


def test_cluster_names_every_problem_and_tables_become_json():
    from metaq.cli.admin import NEEDS_LOGIN, table_json
    from metaq.cli.cluster import NO_MASTER, Member, unhealthy

    members = [
        Member(0, "master", "meta://a:1", state="up"),
        Member(0, "slave1", "meta://b:1", state="1 partition(s) stopped", stopped={"t-0-0": "record at offset 40 fails its CRC check"}),
        Member(1, "master", "meta://c:1", state=NEEDS_LOGIN),
        Member(2, "master", "(none)", state=NO_MASTER),
    ]
    assert unhealthy(members) == [
        "UNHEALTHY broker group 0: slave1 (meta://b:1) stopped replicating 1 partition(s): t-0-0 (first: record at offset 40 fails its CRC check)",
        "UNKNOWN broker group 1: master needs login (meta://c:1): pass --user and --password-file, or --group-login 1=USER:PASSWORD_FILE",
        "UNHEALTHY broker group 2: master NO MASTER",
    ]
    assert table_json(("log end", "lag bytes", "settings (other than the defaults)"), [(5, None, "x")]) == [
        {"log_end": 5, "lag_bytes": None, "settings_other_than_the_defaults": "x"}]
