"""docs/operations.md and docs/security.md, run as written: what the operator commands say.

Each case runs ``python -m metaq`` (a tool or a broker) as a real process; none needs a
ZooKeeper: they check the one line a command gives for a setting it cannot use.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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
