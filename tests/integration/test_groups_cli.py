"""`metaq groups list|describe|reset-offsets` against a real broker and real consumers."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timezone

from metaq.record import HEADER_SIZE
from metaq.zk.paths import ZkPaths, parse_offset

from .replication_support import put
from .test_client_cli import metaq as metaq_process
from .test_topics_cli import metaq

TOPIC = "g"
SIZE = 100  # payload bytes of each message `put` sends
RECORD = HEADER_SIZE + SIZE


def consume(zk, zk_root, *extra: str) -> list[str]:
    done = metaq_process("consume", "--zk", zk.connect_string, "--zk-root", zk_root, "--topic", TOPIC,
                         "--group", "grp", "--commit-interval", "0.2", *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().splitlines()


def describe_rows(out: str) -> dict[str, list[str]]:
    return {cells[1]: cells for line in out.splitlines() if (cells := line.split()) and cells[0] == TOPIC}


def offsets(zk_client, zk_root) -> dict[str, int]:
    paths = ZkPaths(zk_root)
    return {p: parse_offset(zk_client.get(paths.offset("grp", TOPIC, p))[0])[1] for p in ("0-0", "0-1")}


def test_lag_is_exact_and_resets_move_the_group(broker_factory, zk, zk_root, zk_client, capsys):
    broker = broker_factory(0, {TOPIC: 2}, system={"unflushThreshold": 0})
    for partition in (0, 1):
        put(broker, TOPIC, partition, 30, size=SIZE)
    assert len(consume(zk, zk_root, "--from-beginning", "--max", "10")) == 10

    code, out = metaq(capsys, zk, zk_root, "groups", "list")
    assert code == 0 and "grp" in out and TOPIC in out
    code, out = metaq(capsys, zk, zk_root, "groups", "describe", "--group", "grp")
    assert code == 0, out
    rows = describe_rows(out)
    committed = offsets(zk_client, zk_root)
    for name in ("0-0", "0-1"):
        _, _, at, end, lag_bytes, lag_messages = rows[name]
        assert int(at) == committed[name] and int(end) == 30 * RECORD
        assert int(lag_bytes) == 30 * RECORD - committed[name] and int(lag_messages) * RECORD == int(lag_bytes)
    assert sum(int(rows[n][5]) for n in rows) == 50

    # A dry run writes nothing; --execute moves both partitions to the start.
    code, out = metaq(capsys, zk, zk_root, "groups", "reset-offsets", "--group", "grp", "--topic", TOPIC, "--to-earliest")
    assert code == 0 and "dry run" in out and offsets(zk_client, zk_root) == committed
    code, out = metaq(capsys, zk, zk_root, "groups", "reset-offsets", "--group", "grp", "--topic", TOPIC, "--to-earliest", "--execute")
    assert code == 0, out
    assert offsets(zk_client, zk_root) == {"0-0": 0, "0-1": 0}
    assert len(consume(zk, zk_root, "--idle-timeout", "3")) == 60

    # To a time: only what was appended after it.
    time.sleep(0.05)
    mark = datetime.now(timezone.utc).isoformat()
    time.sleep(0.05)
    put(broker, TOPIC, 1, 7, size=SIZE)
    code, out = metaq(capsys, zk, zk_root, "groups", "reset-offsets", "--group", "grp", "--topic", TOPIC, "--to-datetime", mark, "--execute")
    assert code == 0, out
    assert offsets(zk_client, zk_root) == {"0-0": 30 * RECORD, "0-1": 30 * RECORD}
    assert len(consume(zk, zk_root, "--idle-timeout", "3")) == 7

    # To an offset: a message boundary on one partition; anything else is refused.
    base = ["groups", "reset-offsets", "--group", "grp", "--topic", TOPIC, "--partition", "0-0", "--execute", "--to-offset"]
    code, out = metaq(capsys, zk, zk_root, *base, str(5 * RECORD + 1))
    assert code == 1 and "does not start a message" in out
    code, out = metaq(capsys, zk, zk_root, *base, str(25 * RECORD))
    assert code == 0 and offsets(zk_client, zk_root)["0-0"] == 25 * RECORD
    code, out = metaq(capsys, zk, zk_root, "groups", "describe", "--group", "grp")
    assert describe_rows(out)["0-0"][5] == "5" and describe_rows(out)["0-1"][5] == "0"

    # Refused while a consumer of the group is live, unless --force.
    live = subprocess.Popen(
        [sys.executable, "-m", "metaq", "consume", "--zk", zk.connect_string, "--zk-root", zk_root, "--topic", TOPIC,
         "--group", "grp", "--idle-timeout", "30"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        paths = ZkPaths(zk_root)
        deadline = time.monotonic() + 20
        while not (zk_client.exists(paths.consumer_ids("grp")) and zk_client.get_children(paths.consumer_ids("grp"))):
            assert time.monotonic() < deadline, "the consumer did not register"
            time.sleep(0.1)
        code, out = metaq(capsys, zk, zk_root, "groups", "reset-offsets", "--group", "grp", "--topic", TOPIC, "--to-latest", "--execute")
        assert code == 1 and "live member" in out and "--force" in out
        code, out = metaq(capsys, zk, zk_root, "groups", "reset-offsets", "--group", "grp", "--topic", TOPIC, "--to-latest", "--execute", "--force")
        assert code == 0, out
    finally:
        live.terminate()
        live.wait(20)
