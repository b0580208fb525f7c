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
    if config.security.enabled or config.security.tls_enabled:
        # Fail closed until the connection handlers enforce metaq/security: a broker that runs
        # open while its server.ini says otherwise is worse than one that does not start.
        raise MetaqError(
            f"{args.config}: securityEnabled/tlsCertFile are set, but this broker does not enforce "
            "them yet (see docs/security.md, 'What is wired today')"
        )
    from ..server.registry import RegistryError
    from ..store.log import LogCorruptError

    try:
        return run_broker(config, slave)
    except (ConfigError, RegistryError, LogCorruptError, OSError) as exc:
        # ZooKeeper unreachable, port taken, unusable data dir: one line, no traceback.
        raise MetaqError(f"broker {config.broker_id} ({args.config}) cannot run: {exc}") from None
