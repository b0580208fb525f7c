"""`metaq produce` and `metaq consume` as a user runs them."""

from __future__ import annotations

import os
import socket
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

    # `metaq consume ... | head -3`: once the reader closes the pipe the command ends, with no
    # traceback and nothing moved to the recover store (it used to fail every later message).
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    recover = tmp_path / "piped-recover"
    piped = subprocess.Popen([sys.executable, "-m", "metaq", "consume", *zk_args, "--group", "piped", "--from-beginning",
                              "--recover-dir", str(recover)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT, env=env)
    try:
        assert piped.stdout is not None and piped.stderr is not None
        lines = [piped.stdout.readline() for _ in range(3)]
        piped.stdout.close()
        assert all(lines), lines
        # It may have written every message into the pipe already: one more meets the closed pipe.
        assert metaq("produce", *zk_args, stdin=b"after the reader left\n").returncode == 0
        assert piped.wait(timeout=30) == 0
        stderr = piped.stderr.read().decode()
    finally:
        if piped.poll() is None:
            piped.kill()
            piped.wait()
    assert "stopped: the reader closed standard output" in stderr and "Traceback" not in stderr, stderr
    assert "recover store" not in stderr and not any(recover.rglob("*")), stderr


def test_bad_input_is_one_line_without_traceback(zk, zk_root) -> None:
    done = metaq("consume", "--zk", zk.connect_string, "--zk-root", zk_root, "--topic", "t", "--group", "a/b", "--max", "1")
    assert done.returncode == 1
    assert done.stderr.decode().strip().startswith("metaq consume: error: consumer group must be") and b"Traceback" not in done.stderr
    done = metaq("produce", "--zk", "127.0.0.1:1", "--zk-connect-timeout", "1", "--topic", "t", "--count", "1")
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert done.stderr.decode().strip().splitlines() == ["metaq produce: error: cannot connect to ZooKeeper at 127.0.0.1:1: Connection time-out"]


def one_error_line(done: subprocess.CompletedProcess, usage: bool = False) -> str:
    """The one error line (after argparse's usage lines for a usage error), and no traceback."""
    lines = done.stderr.decode().strip().splitlines()
    assert b"Traceback" not in done.stderr and (usage or len(lines) == 1), done.stderr.decode()
    return lines[-1]


def test_bad_addresses_urls_rates_timeouts_and_logins_are_one_line_each(zk, zk_root, tmp_path) -> None:
    # A connect string kazoo cannot read: a usage error before anything connects.
    for command in (["produce", "--topic", "t", "--count", "1"], ["cluster"]):
        done = metaq(*command, "--zk", "bad:::")
        assert done.returncode == 2
        assert "argument --zk: expected HOST:PORT[,HOST:PORT...], got 'bad:::'" in one_error_line(done, usage=True)
        done = metaq(*command, "--zk", zk.connect_string, "--zk-root", "meta")
        assert done.returncode == 2
        assert "argument --zk-root: ZooKeeper root must start with '/', got 'meta'" in one_error_line(done, usage=True)
    ini = tmp_path / "server.ini"
    ini.write_text(f"[system]\nbrokerId=0\nserverPort=0\ndataPath={tmp_path / 'data'}\n[zookeeper]\nzk.zkConnect=h:1,\n")
    done = metaq("broker", "-c", str(ini))
    assert done.returncode == 1
    assert one_error_line(done).startswith(f"metaq broker: error: {ini}: [zookeeper] zk.zkConnect: expected HOST:PORT")
    # A hostName that does not resolve is named (the line said only "Name or service not known").
    ini.write_text(f"[system]\nbrokerId=0\nserverPort=0\nhostName=no-such-host.invalid\ndataPath={tmp_path / 'data'}\n"
                   f"[zookeeper]\nzk.zkConnect={zk.connect_string}\nzk.zkRoot={zk_root}\n")
    done = metaq("broker", "-c", str(ini))
    assert done.returncode == 1
    assert f"{ini}: [system] hostName: 'no-such-host.invalid' does not resolve" in one_error_line(done)
    # The SQL offset store's URL is checked when the consumer is made, with ZooKeeper reached.
    done = metaq("consume", "--zk", zk.connect_string, "--zk-root", zk_root, "--topic", "t", "--group", "g",
                 "--offset-url", "bogus://", "--max", "1", "--idle-timeout", "1")
    assert done.returncode == 1
    assert one_error_line(done).startswith("metaq consume: error: offset store url 'bogus://': ")
    done = metaq("produce", "--zk", zk.connect_string, "--topic", "t", "--count", "1", "--send-timeout", "-1")
    assert (done.returncode, one_error_line(done, usage=True)) == (2, "metaq produce: error: argument --send-timeout: must be > 0, got -1")
    done = metaq("consume", "--zk", zk.connect_string, "--topic", "t", "--group", "g", "--idle-timeout", "0")
    assert (done.returncode, one_error_line(done, usage=True)) == (2, "metaq consume: error: argument --idle-timeout: must be > 0, got 0")
    # --user without --password-file and no terminal to ask on (stdin is a pipe here).
    done = metaq("stats", zk.connect_string, "--user", "app")
    assert (done.returncode, one_error_line(done)) == (
        1, "metaq stats: error: no password for app: give --password-file (there is no terminal to ask on)")
    # A connect that times out says so: a listener whose accept queue is full (listen(0) and
    # one connection waiting) drops the next handshake, so the connect waits out --timeout.
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        with socket.create_connection(full.getsockname(), timeout=5):
            address = "%s:%d" % full.getsockname()
            done = metaq("stats", address, "--timeout", "1")
    assert (done.returncode, one_error_line(done)) == (1, f"metaq stats: error: cannot connect to {address}: timed out")
    done = metaq("drill", "--zk", zk.connect_string, "--zk-root", zk_root, "--broker-id", "0", "--rate", "0")
    assert (done.returncode, one_error_line(done, usage=True)) == (2, "metaq drill: error: argument --rate: must be > 0, got 0")
