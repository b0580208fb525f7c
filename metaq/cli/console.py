"""``metaq console --zk Z [--port 8081] [--tls-cert PEM --tls-key PEM --http-users FILE]``: the web
console for operators (docs/console.md), foreground.

It reads the cluster as ``metaq cluster``, ``topics`` and ``groups`` do, logged in to brokers
with --user/--password-file/--tls-ca (an admin user: the failover history reads the
brokers' epochs, a drill needs produce, consume and admin), and serves the pages to the
users of --http-users, each with their own rights.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from ..errors import MetaqError, UsageError
from . import numbers
from .http import add_https_arguments, http_users, https_context
from .login import add_login_arguments, credentials, zk_connect_arg, zk_root_arg

DEFAULT_PORT = 8081


def default_reports_dir() -> Path:
    """``$XDG_STATE_HOME/metaq/console-reports`` (``~/.local/state`` when unset)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "metaq" / "console-reports"


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("console", help="web console: cluster health, lag, failover history, drills with a live timeline")
    parser.add_argument("--zk", type=zk_connect_arg, required=True, metavar="HOST:PORT[,...]", help="ZooKeeper connect string")
    parser.add_argument("--zk-root", type=zk_root_arg, default="/meta", help="ZooKeeper root of the cluster (default /meta)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=numbers.port, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--interval", type=numbers.positive, default=1.0, metavar="S",
                        help="seconds between two readings of the cluster (default 1; a ZooKeeper change reads it at once)")
    parser.add_argument("--timeout", type=numbers.positive, default=2.0, metavar="S", help="seconds per broker request (default 2)")
    parser.add_argument("--reports", metavar="DIR", help=f"where drill reports are kept (default {default_reports_dir()})")
    parser.add_argument("--group-secret", action="append", default=[], metavar="ID=FILE",
                        help="broker group ID's secret file, for promote and topic changes when ZooKeeper ACLs are on; repeatable")
    add_login_arguments(parser)
    add_https_arguments(parser, "require logins of this security file's users (the cluster's): all may look, admins act "
                                "(needs --tls-cert unless --host is a loopback address)")
    parser.set_defaults(run=run)


def group_secrets(words: list[str]) -> tuple[tuple[int, str], ...]:
    secrets = []
    for word in words:
        group, sep, path = word.partition("=")
        if not sep or not group.strip().isdigit() or not path:
            raise UsageError(f"--group-secret expects ID=FILE, got {word!r}")
        if not Path(path).is_file():
            raise UsageError(f"--group-secret {word}: no such file")
        secrets.append((int(group), path))
    return tuple(secrets)


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None) -> int:
    from ..console.access import Access
    from ..console.actions import ClusterLogin
    from ..console.app import serve
    from ..console.collector import Collector
    from ..console.drills import Drills
    from ..zk.session import ZooKeeperUnreachable

    ssl_context = https_context(args)
    # Logins need HTTPS, as metaq http's do, except on a loopback address: the password then
    # never leaves this machine (and browsers count http://127.0.0.1 as a secure context).
    from ..config import is_loopback

    users = http_users(args, ssl_context is not None or is_loopback(args.host))
    creds = credentials(args)
    login = ClusterLogin(args.zk, args.zk_root, creds.user, creds.password, creds.tls_ca_file, group_secrets(args.group_secret))
    reports = Path(args.reports) if args.reports else default_reports_dir()
    try:
        collector = await Collector(args.zk, args.zk_root, creds, args.timeout, args.interval).start()
    except ZooKeeperUnreachable as exc:
        raise MetaqError(str(exc)) from None
    drills = Drills(reports, args.zk, args.zk_root, creds, dict(login.group_secrets))

    def ready(url: str) -> None:
        who = f"logins of {args.http_users}" if users is not None else "no login (anyone who reaches this address may act)"
        print(f"metaq console: serving {url} for the cluster at {args.zk}{args.zk_root}; {who}; drill reports in {reports}", flush=True)

    try:
        await serve(collector, Access(users, ssl_context is not None), drills, login, args.host, args.port, ready,
                    ssl_context=ssl_context, stop=stop)
    except OSError as exc:
        raise MetaqError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    finally:
        await drills.close()
        await collector.close()
        if users is not None:
            users.close()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(serve(args))
    except KeyboardInterrupt:
        print("metaq console: stopped", file=sys.stderr)
        return 0
