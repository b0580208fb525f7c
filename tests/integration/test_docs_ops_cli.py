"""docs/operations.md and docs/security.md, run as written: what the operator commands say.

Each case runs ``python -m metaq`` (a tool or a broker) as a real process; none needs a
ZooKeeper: they check what a command says (one line, no traceback) when a setting or its
output cannot be used.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO_ROOT

from .trust_support import metaq

#: Nothing listens on port 1: the connect fails at once and the command explains why.
NOWHERE = "127.0.0.1:1"


def test_a_zookeeper_tls_ca_file_that_is_no_certificate_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/security.md, "ZooKeeper over TLS": a client that cannot connect says why in one line.
    not_a_ca = tmp_path / "ca.pem"
    not_a_ca.write_bytes(b"not a certificate\n")
    why = f"ZooKeeper TLS handshake failed: cannot load the CA file {not_a_ca}"

    monkeypatch.setenv("METAQ_ZK_TLS_CA", str(not_a_ca))  # the tools' setting; metaq() passes the environment on
    tool = metaq("cluster", "--zk", NOWHERE, "--timeout", "1")
    lines = tool.stderr.decode().strip().splitlines()
    assert tool.returncode == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"metaq cluster: error: cannot reach ZooKeeper at {NOWHERE}: {why}"), lines
    monkeypatch.delenv("METAQ_ZK_TLS_CA")

    # The broker's own key (zk.zkTlsCaFile) goes the same way: exit 1, one line naming the file.
    ini = tmp_path / "server.ini"
    ini.write_text(f"[system]\nbrokerId=0\nserverPort=0\ndataPath={tmp_path / 'data'}\n[zookeeper]\n"
                   f"zk.zkConnect={NOWHERE}\nzk.zkConnectionTimeoutMs=1000\nzk.zkTlsCaFile={not_a_ca}\n")
    broker = metaq("broker", "-c", str(ini))
    stderr = broker.stderr.decode()
    assert broker.returncode == 1 and "Traceback" not in stderr and why in stderr.strip().splitlines()[-1], stderr


def test_a_reader_that_closed_stdout_ends_a_command_without_a_traceback(tmp_path: Path) -> None:
    # `metaq ... | head`: here the reader is gone before the command writes (a pipe whose read
    # end is closed), so its first line meets a broken pipe: exit 1, nothing on stderr.
    password = tmp_path / "admin.password"
    password.write_text("admin-password\n")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        printed = subprocess.run([sys.executable, "-m", "metaq", "security", "zk-super-digest", "--password-file", str(password)],
                                 stdout=write_end, stderr=subprocess.PIPE, cwd=REPO_ROOT,
                                 env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)), timeout=60)
    finally:
        os.close(write_end)
    assert printed.returncode == 1 and printed.stderr == b"", printed.stderr.decode()
