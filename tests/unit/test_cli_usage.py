"""Options that do not make a request (one an action needs is missing, two that go together
are given apart) are usage errors: exit 2 and one line naming them, before anything connects.

The ZooKeeper address is a port nothing listens on: a command that tried to connect first
would say it cannot reach ZooKeeper (exit 1) instead.
"""

from __future__ import annotations

import pytest

from metaq.cli import main

NOBODY = ["--zk", "127.0.0.1:1"]

USAGE = [
    (["verify"], "metaq verify: error: give --zk and --broker-id (a running group), or --data-dir"),
    (["verify", "--data-dir", ".", *NOBODY], "metaq verify: error: --data-dir checks files offline: give it without --zk"),
    (["cluster", "remove-group", *NOBODY], "metaq cluster: error: metaq cluster remove-group needs --broker-id ID"),
    (["cluster", "remove-slave", *NOBODY, "--broker-id", "0"], "metaq cluster: error: metaq cluster remove-slave needs --slave-id K"),
    (["drill", *NOBODY, "--broker-id", "0", "--proxy-url", "http://127.0.0.1:1"],
     "metaq drill: error: --proxy-url and --proxy-name go together"),
    (["drill", *NOBODY, "--broker-id", "0", "--fault", "partition"],
     "metaq drill: error: --fault partition needs --proxy-url and --proxy-name"),
    (["http", *NOBODY, "--tls-cert", "c.pem"], "metaq http: error: --tls-cert and --tls-key go together"),
    (["topics", "alter", *NOBODY, "--broker-id", "0", "--topic", "t"], "metaq topics: error: nothing to change: give --partitions N"),
    (["groups", "reset-offsets", *NOBODY, "--group", "g", "--to-earliest"],
     "metaq groups: error: give --topic T or --all-topics (or --from-file)"),
]


@pytest.mark.parametrize("argv, line", USAGE, ids=[" ".join(argv[:2]) for argv, _ in USAGE])
def test_options_that_make_no_request_are_a_usage_error_before_any_connection(argv, line, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err


def test_topics_alter_refuses_a_delete_policy_retention_cannot_run_before_connecting(capsys):
    """delete,5,true was written to the group's topic configuration ("applied by every live
    member") and then failed in every broker's retention scheduler."""
    assert main(["topics", "alter", *NOBODY, "--broker-id", "0", "--topic", "t", "--set", "deletePolicy=delete,5,true"]) == 1
    err = capsys.readouterr().err
    assert "deletePolicy" in err and "'delete,5,true'" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("root", ["/meta/.", "/../meta"])
def test_a_zk_root_kazoo_refuses_is_a_usage_error_not_a_traceback(root, capsys):
    """kazoo refuses a '.' or '..' component in every call: `metaq cluster --zk-root /meta/.` died
    with its ValueError's traceback after connecting."""
    with pytest.raises(SystemExit) as exited:
        main(["cluster", *NOBODY, "--zk-root", root])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"metaq cluster: error: argument --zk-root: ZooKeeper root must not have a '.' or '..' component, got {root!r}")
