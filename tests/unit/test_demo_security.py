"""The demo's security files and its verdict on an outsider's attempts (no processes)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from metaq.cli.demo_security import DemoSecurity, Refusal, check_refused
from metaq.errors import MetaqError
from metaq.security.credentials import SecurityFile
from tests.harness import REPO_ROOT


def test_the_files_are_private_and_the_users_have_their_acls(tmp_path: Path) -> None:
    security = DemoSecurity.create(tmp_path / "security", "demo")
    users = SecurityFile.load(security.directory / "security.ini")
    assert users.acls()["app"].produce == ("demo",) and not users.acls()["app"].admin
    assert users.acls()["ops"].admin
    for name in ("group.secret", "security.ini", "app.password", "ops.password"):
        assert stat.S_IMODE((security.directory / name).stat().st_mode) == 0o600, name
    assert (security.directory / "ops.password").read_text().strip() == security.ops.password
    assert security.system["securityEnabled"] is True


def test_an_accepted_attempt_fails_the_demo() -> None:
    check_refused([Refusal("anonymous put", True, "403")])
    with pytest.raises(MetaqError, match=r"accepted: anonymous put \(200\)"):
        check_refused([Refusal("anonymous put", False, "200"), Refusal("other", True, "403")])


def test_a_used_work_directory_is_refused_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "left-over").write_text("a previous run")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "metaq", "demo", "--dir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=60)
    err = done.stderr.strip()
    assert done.returncode == 1 and "is not empty" in err and len(err.splitlines()) == 1, err
