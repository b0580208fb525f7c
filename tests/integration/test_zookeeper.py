"""The embedded ZooKeeper is a real server: real sessions, real ephemeral nodes, real pids."""

import os
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from metaq.zk import embedded
from metaq.zk.embedded import EmbeddedZooKeeper, ZooKeeperError, find_zookeeper_classpath, four_letter_word
from tests.harness import REPO_ROOT, free_port, kazoo_client, metaq_zk_command


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A reaped child is gone; an unreaped zombie would still answer kill(0).
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def connect(server: EmbeddedZooKeeper, session_timeout: float = 10.0) -> KazooClient:
    client = KazooClient(hosts=server.connect_string, timeout=session_timeout)
    client.start(timeout=10)
    return client


def test_classpath_is_found() -> None:
    jars = find_zookeeper_classpath()
    assert any("zookeeper" in Path(jar).name for jar in jars)
    assert all(Path(jar).is_file() for jar in jars)


def test_falls_back_to_the_jars_inside_pyspark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    monkeypatch.setattr(embedded, "DEBIAN_JAR_DIR", tmp_path / "no-such-dir")
    monkeypatch.delenv(embedded.CLASSPATH_ENV, raising=False)
    jars = find_zookeeper_classpath()
    assert all("pyspark" in jar for jar in jars)
    with EmbeddedZooKeeper(data_dir=tmp_path / "zk", tick_ms=200) as server:
        client = connect(server)
        client.create("/from-pyspark-jars", b"ok")
        assert "Zookeeper version" in four_letter_word(server.host, server.port, "srvr")
        client.stop()
        client.close()


def test_no_jars_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "DEBIAN_JAR_DIR", tmp_path / "no-such-dir")
    monkeypatch.setattr(embedded, "_pyspark_jar_dir", lambda: None)
    monkeypatch.delenv(embedded.CLASSPATH_ENV, raising=False)
    with pytest.raises(ZooKeeperError, match="no ZooKeeper jars found"):
        find_zookeeper_classpath()


def test_shared_server_serves_nodes(zk: EmbeddedZooKeeper, zk_client: KazooClient, zk_root: str) -> None:
    assert zk.mode() == "standalone"
    assert four_letter_word(zk.host, zk.port, "ruok") == "imok"
    zk_client.create(f"{zk_root}/a/b", b"hello", makepath=True)
    assert zk_client.get(f"{zk_root}/a/b")[0] == b"hello"
    zk_client.create(f"{zk_root}/a/e", b"", ephemeral=True)
    assert sorted(zk_client.get_children(f"{zk_root}/a")) == ["b", "e"]


def test_start_stop_and_a_second_instance(tmp_path: Path, zk: EmbeddedZooKeeper) -> None:
    started = time.monotonic()
    with EmbeddedZooKeeper(data_dir=tmp_path / "zk2", tick_ms=200) as second:
        elapsed = time.monotonic() - started
        assert second.port != zk.port
        pid = second.pid
        assert pid is not None and pid_exists(pid)
        client = connect(second)
        client.create("/only-here", b"x")
        client.stop()
        client.close()
        # The shared server is a different one.
        assert four_letter_word(zk.host, zk.port, "srvr").count("Mode: standalone") == 1
        print(f"embedded ZooKeeper started in {elapsed:.2f}s")
    assert not second.alive
    assert not pid_exists(pid)
    assert (tmp_path / "zk2" / "zookeeper.log").stat().st_size > 0


def test_data_survives_kill_and_restart(tmp_path: Path) -> None:
    server = EmbeddedZooKeeper(data_dir=tmp_path / "zk", tick_ms=200).start()
    try:
        client = connect(server)
        client.create("/durable", b"v1")
        client.stop()
        client.close()
        pid = server.pid
        server.kill()
        assert not pid_exists(pid)
        server.start()
        client = connect(server)
        assert client.get("/durable")[0] == b"v1"
        client.stop()
        client.close()
    finally:
        server.stop()


def test_temporary_data_dir_is_removed_on_stop() -> None:
    server = EmbeddedZooKeeper(tick_ms=200).start()
    data_dir = server.data_dir
    assert data_dir is not None and data_dir.is_dir()
    server.stop()
    assert not data_dir.exists()


def test_port_in_use_is_a_clear_error(tmp_path: Path, zk: EmbeddedZooKeeper) -> None:
    clash = EmbeddedZooKeeper(port=zk.port, data_dir=tmp_path / "clash", tick_ms=200)
    with pytest.raises(ZooKeeperError, match="already in use"):
        clash.start(timeout=20)
    assert not clash.alive
    assert zk.is_serving()
    # The shared server does not pass for a server that never started.
    assert not clash.is_serving()


def test_foreground_server_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """What `metaq zk` runs: one line with the connect string, exit 0 on SIGTERM, no JVM left."""
    import signal
    import subprocess
    import sys

    port = free_port()
    code = f"import sys; from metaq.zk.cli import run_zk; sys.exit(run_zk({port}, {str(tmp_path / 'zk')!r}, 200))"
    process = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline()
        assert f"127.0.0.1:{port}" in line, line + process.stderr.read()
        jvm_pid = int(line.split("pid ")[1].split(",")[0])
        assert pid_exists(jvm_pid)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert not pid_exists(jvm_pid)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_metaq_zk_keeps_its_data_by_default_and_names_the_dir(tmp_path: Path) -> None:
    """`metaq zk` used a temporary dir, so every restart lost every group's epoch."""
    port = free_port()
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(REPO_ROOT))
    expected_dir = tmp_path / "xdg" / "metaq" / f"zookeeper-{port}"

    def serve_once(then) -> None:  # type: ignore[no-untyped-def]
        with metaq_zk_command("--port", str(port), "--tick-ms", "200", env=env) as process:
            line = process.stdout.readline()
            assert f"data {expected_dir}: kept across restarts" in line, line + process.stderr.read()
            with kazoo_client(f"127.0.0.1:{port}") as client:
                then(client)

    serve_once(lambda client: client.create("/kept", b"epoch 2"))
    serve_once(lambda client: None if client.get("/kept")[0] == b"epoch 2" else pytest.fail("the node did not survive"))
    assert expected_dir.is_dir()
