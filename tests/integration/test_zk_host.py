"""``metaq zk --host``: the embedded ZooKeeper listens on the address asked for, not 127.0.0.1; bad options are one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from metaq.zk.embedded import four_letter_word
from tests.harness import REPO_ROOT, metaq_zk_command

#: Another loopback address (all of 127/8 is local on Linux): not the default 127.0.0.1.
OTHER_ADDRESS = "127.0.0.2"


def test_metaq_zk_listens_on_the_host_given_and_not_on_127_0_0_1(tmp_path: Path) -> None:
    with metaq_zk_command("--host", OTHER_ADDRESS, "--port", "0", "--data-dir", str(tmp_path / "zk"),
                          "--tick-ms", "200") as process:
        line = process.stdout.readline()
        assert f"serving on {OTHER_ADDRESS}:" in line, line + process.stderr.read()
        port = int(line.split(f"{OTHER_ADDRESS}:")[1].split()[0])
        assert "Mode: standalone" in four_letter_word(OTHER_ADDRESS, port, "srvr")
        # clientPortAddress: bound to that address only.
        try:
            four_letter_word("127.0.0.1", port, "srvr")
        except OSError:
            pass
        else:
            raise AssertionError(f"ZooKeeper also answers on 127.0.0.1:{port}")


def test_metaq_zk_refuses_a_host_that_does_not_resolve_in_one_line() -> None:
    result = subprocess.run([sys.executable, "-m", "metaq", "zk", "--host", "no-such-host.invalid", "--port", "0"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("metaq zk: --host 'no-such-host.invalid' is not an address of this machine")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_metaq_zk_refuses_a_bad_port_tick_or_data_dir_in_one_line(tmp_path: Path) -> None:
    # Before this was checked, the JVM started and refused with a page of its log (port, tick),
    # or the data directory's OSError was a traceback.
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    cases = [
        (["--port", "70000", "--ephemeral"], 2, "metaq zk: --port must be between 0 and 65535, got 70000"),
        (["--port", "0", "--ephemeral", "--tick-ms", "0"], 2, "metaq zk: --tick-ms must be >= 1, got 0"),
        (["--port", "0", "--data-dir", str(not_a_dir / "zk")], 1, f"metaq zk: data dir {not_a_dir / 'zk'}: Not a directory"),
    ]
    for args, code, line in cases:
        result = subprocess.run([sys.executable, "-m", "metaq", "zk", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=60)
        assert (result.returncode, result.stderr.strip().splitlines()) == (code, [line]), result.stderr
