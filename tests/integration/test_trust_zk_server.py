"""The embedded ZooKeeper (``metaq zk``) exposes no more than the project needs.

Against a real ``metaq zk`` process and its JVM: the super digest is on no command line
(``ps`` shows every user's), four-letter words outside the few the code sends are refused,
and one address cannot open connections without limit.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from kazoo.exceptions import NoAuthError

from metaq.security.files import write_private
from metaq.zk.acl import ZkSecurity, super_digest
from metaq.zk.embedded import DEFAULT_MAX_CLIENT_CONNECTIONS, SECRET_ARGS_FILE_NAME, four_letter_word
from tests.harness import REPO_ROOT, kazoo_client, metaq_zk_command

ADMIN_PASSWORD = "zk-admin-pw"


def every_command_line() -> dict[int, str]:
    """pid -> command line of every process this user can see, as ``ps`` would show it."""
    lines = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue  # exited meanwhile
    return lines


def refused(host: str, port: int) -> bool:
    """True when the server closes a new connection without answering ``ruok``."""
    try:
        return four_letter_word(host, port, "ruok", timeout=2) == ""
    except OSError:  # reset by the server
        return True


def test_metaq_zk_keeps_the_super_digest_off_command_lines_and_limits_4lw_and_connections(tmp_path: Path) -> None:
    digest = super_digest(ADMIN_PASSWORD)
    digest_file = tmp_path / "super.digest"
    write_private(digest_file, f"{digest}\n".encode())
    data_dir = tmp_path / "zk"
    with metaq_zk_command("--port", "0", "--data-dir", str(data_dir), "--tick-ms", "200",
                          "--super-digest-file", str(digest_file)) as process:
        line = process.stdout.readline()
        assert "serving on 127.0.0.1:" in line, line + process.stderr.read()
        port = int(line.split("127.0.0.1:")[1].split()[0])

        # The JVM is running (its command line names our data dir), yet no process shows the digest.
        command_lines = every_command_line()
        assert any("QuorumPeerMain" in cmd and str(data_dir) in cmd for cmd in command_lines.values())
        showing = {pid: cmd for pid, cmd in command_lines.items() if digest.split(":", 1)[1] in cmd}
        assert showing == {}
        # The options file the JVM read it from is gone once the server serves.
        assert not (data_dir / SECRET_ARGS_FILE_NAME).exists()

        # ... and the super login still passes every ACL.
        connect = f"127.0.0.1:{port}"
        security = ZkSecurity("/meta", 0, "group-pw")
        with (
            kazoo_client(connect, **security.client_kwargs()) as group,
            kazoo_client(connect, auth_data=[("digest", f"super:{ADMIN_PASSWORD}")]) as admin,
            kazoo_client(connect) as anonymous,
        ):
            security.ensure_tree(group)
            security.create(group, security.paths.epoch(0), b"1")
            try:
                anonymous.delete(security.paths.epoch(0))
            except NoAuthError:
                pass
            else:
                raise AssertionError("an anonymous client deleted the group's epoch node")
            admin.delete(security.paths.epoch(0))
            assert anonymous.exists(security.paths.epoch(0)) is None

        # Four-letter words: the ones the code uses answer, the ones that list sessions,
        # ephemeral paths, client addresses or the environment do not.
        assert four_letter_word("127.0.0.1", port, "ruok") == "imok"
        assert "Mode: standalone" in four_letter_word("127.0.0.1", port, "srvr")
        assert f"dataDir={data_dir}" in four_letter_word("127.0.0.1", port, "conf")
        for word in ("dump", "cons", "envi", "stat", "wchc", "mntr"):
            assert "not in the whitelist" in four_letter_word("127.0.0.1", port, word), word

        # Connections per address are capped: with the cap's worth held open, the next is refused.
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(DEFAULT_MAX_CLIENT_CONNECTIONS)]
        try:
            deadline = time.monotonic() + 10
            while not refused("127.0.0.1", port):  # the server registers accepted sockets asynchronously
                assert time.monotonic() < deadline, "connection beyond maxClientCnxns was served"
                time.sleep(0.1)
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 10
        while refused("127.0.0.1", port):  # the cap, not a dead server: freed slots serve again
            assert time.monotonic() < deadline, "ZooKeeper refuses connections after the held ones closed"
            time.sleep(0.1)


def test_metaq_zk_refuses_a_group_readable_super_digest_file_in_one_line(tmp_path: Path) -> None:
    digest_file = tmp_path / "super.digest"
    digest_file.write_text(super_digest(ADMIN_PASSWORD) + "\n")
    os.chmod(digest_file, 0o640)
    result = subprocess.run([sys.executable, "-m", "metaq", "zk", "--port", "0", "--ephemeral",
                             "--super-digest-file", str(digest_file)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith(f"metaq zk: --super-digest-file {digest_file}: readable by other users")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
