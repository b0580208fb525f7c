"""Numeric options: a value that means nothing for the option is a usage error naming it
(exit 2, argparse's usage then one line), decided while parsing, before anything connects."""

from __future__ import annotations

import pytest

from metaq.cli import build_parser

ZK = ["--zk", "127.0.0.1:2181"]

REFUSED = [
    (["http", *ZK, "--max-message-size", "0"], "metaq http: error: argument --max-message-size: must be >= 1, got 0"),
    (["http", *ZK, "--max-request-bytes", "0"], "metaq http: error: argument --max-request-bytes: must be >= 1, got 0"),
    (["http", *ZK, "--port", "-1"], "metaq http: error: argument --port: must be >= 0, got -1"),
    (["http", *ZK, "--send-timeout", "-5"], "metaq http: error: argument --send-timeout: must be > 0, got -5"),
    (["http", *ZK, "--login-failure-burst", "0"], "metaq http: error: argument --login-failure-burst: must be >= 1, got 0"),
    (["http", *ZK, "--login-failure-rate", "0"], "metaq http: error: argument --login-failure-rate: must be > 0, got 0"),
    (["http", *ZK, "--zk-connect-timeout", "0"], "metaq http: error: argument --zk-connect-timeout: must be > 0, got 0"),
    (["produce", *ZK, "--topic", "t", "--count", "0"], "metaq produce: error: argument --count: must be >= 1, got 0"),
    (["produce", *ZK, "--topic", "t", "--size", "0"], "metaq produce: error: argument --size: must be >= 1, got 0"),
    (["produce", *ZK, "--topic", "t", "--batch", "-3"], "metaq produce: error: argument --batch: must be >= 1, got -3"),
    (["produce", *ZK, "--topic", "t", "--in-flight", "0"], "metaq produce: error: argument --in-flight: must be >= 1, got 0"),
    (["produce", *ZK, "--topic", "t", "--send-timeout", "inf"], "metaq produce: error: argument --send-timeout: must be a finite number, got 'inf'"),
    (["consume", *ZK, "--topic", "t", "--group", "g", "--max", "0"], "metaq consume: error: argument --max: must be >= 1, got 0"),
    (["consume", *ZK, "--topic", "t", "--group", "g", "--offset", "-1"], "metaq consume: error: argument --offset: must be >= 0, got -1"),
    (["consume", *ZK, "--topic", "t", "--group", "g", "--commit-interval", "0"],
     "metaq consume: error: argument --commit-interval: must be > 0, got 0"),
    (["consume", *ZK, "--topic", "t", "--group", "g", "--idle-timeout", "nan"],
     "metaq consume: error: argument --idle-timeout: must be a finite number, got 'nan'"),
    (["drill", *ZK, "--broker-id", "-1"], "metaq drill: error: argument --broker-id: must be >= 0, got -1"),
    (["drill", *ZK, "--broker-id", "1024"], "metaq drill: error: argument --broker-id: must be <= 1023, got 1024"),
    (["drill", *ZK, "--broker-id", "0", "--rate", "0"], "metaq drill: error: argument --rate: must be > 0, got 0"),
    (["drill", *ZK, "--broker-id", "0", "--repeat", "0"], "metaq drill: error: argument --repeat: must be >= 1, got 0"),
    (["drill", *ZK, "--broker-id", "x"], "metaq drill: error: argument --broker-id: expected an integer, got 'x'"),
    (["topics", "create", *ZK, "--broker-id", "0", "--topic", "t", "--partitions", "0"],
     "metaq topics create: error: argument --partitions: must be >= 1, got 0"),
    (["topics", "delete", *ZK, "--broker-id", "0", "--topic", "t", "--wait", "-1"],
     "metaq topics delete: error: argument --wait: must be >= 0, got -1"),
    (["topics", "list", *ZK, "--timeout", "0"], "metaq topics list: error: argument --timeout: must be > 0, got 0"),
    (["topics", "get", *ZK, "--topic", "t", "--partition", "0-0", "--offset", "-1"],
     "metaq topics get: error: argument --offset: must be >= 0, got -1"),
    (["topics", "get", *ZK, "--topic", "t", "--partition", "x", "--offset", "0"],
     "metaq topics get: error: argument --partition: expected BROKER-N (e.g. 0-1), got 'x'"),
    (["topics", "get", *ZK, "--topic", "t", "--partition", "1024-0", "--offset", "0"],
     "metaq topics get: error: argument --partition: the broker id must be <= 1023, got 1024"),
    (["groups", "reset-offsets", *ZK, "--group", "g", "--topic", "t", "--partition", "0-x", "--to-earliest"],
     "metaq groups reset-offsets: error: argument --partition: expected BROKER-N (e.g. 0-1), got '0-x'"),
    (["groups", "reset-offsets", *ZK, "--group", "g", "--topic", "t", "--to-offset", "-1"],
     "metaq groups reset-offsets: error: argument --to-offset: must be >= 0, got -1"),
    (["cluster", *ZK, "--timeout", "-1"], "metaq cluster: error: argument --timeout: must be > 0, got -1"),
    (["cluster", "remove-slave", *ZK, "--broker-id", "0", "--slave-id", "-1"],
     "metaq cluster: error: argument --slave-id: must be >= 0, got -1"),
    (["verify", *ZK, "--broker-id", "0", "--chunk-mib", "0"], "metaq verify: error: argument --chunk-mib: must be >= 1, got 0"),
    (["promote", *ZK, "--broker-id", "0", "--slave", "-1"], "metaq promote: error: argument --slave: must be >= 0, got -1"),
    (["stats", "127.0.0.1:8123", "--timeout", "0"], "metaq stats: error: argument --timeout: must be > 0, got 0"),
    (["stats", "127.0.0.1:70000"], "metaq stats: error: argument HOST:PORT: expected HOST:PORT (port 1..65535), got '127.0.0.1:70000'"),
    (["stats", "localhost"], "metaq stats: error: argument HOST:PORT: expected HOST:PORT (port 1..65535), got 'localhost'"),
    (["demo", "--messages", "0"], "metaq demo: error: argument --messages: must be >= 1, got 0"),
]


@pytest.mark.parametrize("argv, line", REFUSED, ids=[" ".join(argv[:1] + argv[-2:]) for argv, _ in REFUSED])
def test_a_meaningless_number_is_a_usage_error_naming_the_option(argv, line, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == line


def test_the_numbers_that_mean_something_pass():
    parser = build_parser()
    args = parser.parse_args(["http", *ZK, "--port", "0", "--max-message-size", "1", "--send-timeout", "0.5"])
    assert (args.port, args.max_message_size, args.send_timeout) == (0, 1, 0.5)
    assert parser.parse_args(["http", *ZK]).max_message_size is None  # the default: the gateway's own
    assert parser.parse_args(["topics", "delete", *ZK, "--broker-id", "0", "--topic", "t", "--wait", "0"]).wait == 0
    assert parser.parse_args(["groups", "reset-offsets", *ZK, "--group", "g", "--topic", "t", "--shift-by", "-2"]).shift_by == -2
    assert parser.parse_args(["consume", *ZK, "--topic", "t", "--group", "g", "--offset", "0"]).offset == 0
    assert parser.parse_args(["drill", *ZK, "--broker-id", "1023"]).broker_id == 1023
    # A partition as the tables and ZooKeeper name it, whatever zeros it was written with.
    assert parser.parse_args(["topics", "get", *ZK, "--topic", "t", "--partition", "00-01", "--offset", "0"]).partition == "0-1"
    assert parser.parse_args(["groups", "reset-offsets", *ZK, "--group", "g", "--topic", "t", "--partition", "1023-7",
                              "--to-earliest"]).partition == "1023-7"


def test_a_zookeeper_wait_under_a_millisecond_is_rounded_up_not_to_nothing():
    from metaq.cli.produce import client_config

    for command in (["produce", *ZK, "--topic", "t"], ["consume", *ZK, "--topic", "t", "--group", "g"]):
        args = build_parser().parse_args([*command, "--zk-connect-timeout", "0.0001"])
        assert client_config(args).zk_connection_timeout_ms == 1
        args = build_parser().parse_args([*command, "--zk-connect-timeout", "2.5"])
        assert client_config(args).zk_connection_timeout_ms == 2500
