"""``metaq broker -c server.ini [--slave async_slave.properties]``: one broker, foreground."""

from __future__ import annotations

import argparse

from ..config import ConfigError, load_server_ini, load_slave_properties
from ..errors import MetaqError


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("broker", help="run one broker in the foreground")
    parser.add_argument("-c", "--config", required=True, metavar="SERVER_INI", help="the broker's server.ini")
    parser.add_argument("--slave", metavar="PROPERTIES", help="async_slave.properties: start as a slave of the master with the same brokerId")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..server.broker import run_broker

    try:
        config = load_server_ini(args.config)
        slave = load_slave_properties(args.slave) if args.slave else None
    except ConfigError as exc:
        raise MetaqError(str(exc)) from None
    from ..security.errors import SecurityError
    from ..server.registry import RegistryError
    from ..store.log import LogCorruptError

    try:
        return run_broker(config, slave)
    except (ConfigError, RegistryError, LogCorruptError, SecurityError, OSError) as exc:
        # ZooKeeper unreachable, port taken, unusable data dir: one line, no traceback.
        raise MetaqError(f"broker {config.broker_id} ({args.config}) cannot run: {exc}") from None
