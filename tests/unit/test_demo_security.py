"""The demo's security files and its verdict on an outsider's attempts (no processes)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from metaq.cli.demo_security import DemoSecurity, Refusal, check_refused
from metaq.errors import MetaqError
from metaq.security.credentials import SecurityFile
from metaq.security.group import GroupSecret


def test_the_files_are_private_and_the_users_have_their_acls(tmp_path: Path) -> None:
    security = DemoSecurity.create(tmp_path / "security", "demo")
    users = SecurityFile.load(security.directory / "security.ini")
    assert users.acls()["app"].produce == ("demo",) and not users.acls()["app"].admin
    assert users.acls()["ops"].admin
    for name in ("group.secret", "security.ini", "app.password", "ops.password"):
        assert stat.S_IMODE((security.directory / name).stat().st_mode) == 0o600, name
    assert (security.directory / "ops.password").read_text().strip() == security.ops.password
    assert security.system["securityEnabled"] is True


def test_a_second_run_in_the_same_directory_keeps_the_group_secret(tmp_path: Path) -> None:
    first = DemoSecurity.create(tmp_path, "demo")
    secret = GroupSecret.load(first.directory / "group.secret", 0).zookeeper_password()
    second = DemoSecurity.create(tmp_path, "demo")
    assert GroupSecret.load(second.directory / "group.secret", 0).zookeeper_password() == secret
    assert second.app.password != first.app.password


def test_an_accepted_attempt_fails_the_demo() -> None:
    check_refused([Refusal("anonymous put", True, "403")])
    with pytest.raises(MetaqError, match=r"accepted: anonymous put \(200\)"):
        check_refused([Refusal("anonymous put", False, "200"), Refusal("other", True, "403")])
