"""`metaq produce` and `metaq consume` as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.harness import REPO_ROOT

TOPIC = "lines"


def metaq(*args: str, stdin: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "metaq", *args], input=stdin, capture_output=True, timeout=timeout, cwd=REPO_ROOT, env=env)


def test_produce_stdin_and_generated_then_consume(broker_factory, zk, zk_root, tmp_path) -> None:
    broker_factory(0, {TOPIC: 2}, system={"unflushThreshold": 0})
    zk_args = ["--zk", zk.connect_string, "--zk-root", zk_root, "--topic", TOPIC]
    done = metaq("produce", *zk_args, stdin=b"alpha\nbeta\ngamma\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().startswith("sent 3 of 3 messages to lines")
    done = metaq("produce", *zk_args, "--count", "50", "--size", "20", "--sync")
    assert done.returncode == 0 and "sent 50 of 50" in done.stdout.decode(), done.stderr

    consume = ["consume", *zk_args, "--group", "cli", "--from-beginning", "--recover-dir", str(tmp_path / "r")]
    done = metaq(*consume, "--max", "40")
    assert done.returncode == 0, done.stderr
    first = done.stdout.decode().splitlines()
    assert len(first) == 40 and "consumed 40 messages" in done.stderr.decode()
    # The group's offsets sit right after the 40th message: the rest comes next time.
    done = metaq(*consume, "--idle-timeout", "4")
    rest = done.stdout.decode().splitlines()
    assert sorted(first + rest) == sorted(["alpha", "beta", "gamma"] + [f"{i:010d}".ljust(20, "x") for i in range(50)])


def test_bad_input_is_one_line_without_traceback(zk, zk_root) -> None:
    done = metaq("consume", "--zk", zk.connect_string, "--zk-root", zk_root, "--topic", "t", "--group", "a/b", "--max", "1")
    assert done.returncode == 1
    assert done.stderr.decode().strip().startswith("metaq consume: error: consumer group must be") and b"Traceback" not in done.stderr
    done = metaq("produce", "--zk", "127.0.0.1:1", "--zk-connect-timeout", "1", "--topic", "t", "--count", "1")
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert done.stderr.decode().strip().splitlines() == ["metaq produce: error: cannot connect to ZooKeeper at 127.0.0.1:1: Connection time-out"]
