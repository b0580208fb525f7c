"""How a command reaches the cluster and logs in to brokers with ``securityEnabled=true``:
``--zk`` and ``--zk-root`` (checked as they are parsed), ``--user``, ``--password-file`` and ``--tls-ca``, shared
by produce/consume and the operator tools."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..addresses import check_zk_connect
from ..errors import MetaqError


def zk_connect_arg(text: str) -> str:
    """``--zk``'s type: a bad connect string is one usage line, not a traceback from the ZooKeeper client."""
    try:
        return check_zk_connect(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def zk_root_arg(text: str) -> str:
    """``--zk-root``'s type: checked by the rule of server.ini's zk.zkRoot (the brokers' roots), as one usage line."""
    from ..config import check_zk_root

    try:
        return check_zk_root(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"ZooKeeper root {exc}") from None


def add_login_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--user", help="log in as this user (brokers with securityEnabled=true)")
    parser.add_argument("--password-file", help="the user's password: first line of this file (default: prompt)")
    parser.add_argument("--tls-ca", metavar="CA_PEM", help="connect over TLS, verifying brokers with this CA bundle")


def credentials(args: argparse.Namespace):
    """--user/--password-file/--tls-ca as client Credentials (MetaqError naming a bad file)."""
    from ..client.connection import Credentials

    user = getattr(args, "user", None)
    password = None if user is None else _password(user, getattr(args, "password_file", None), "--password-file")
    ca = getattr(args, "tls_ca", None)
    if ca is not None and not Path(ca).is_file():
        raise MetaqError(f"--tls-ca {ca}: no such file")
    return Credentials(user, password, ca)


def _password(user: str, password_file: str | None, option: str) -> str:
    """The first line of ``password_file``; without one, asked for on the terminal."""
    if password_file:
        try:
            lines = Path(password_file).read_text().splitlines()
        except OSError as exc:
            raise MetaqError(f"{option} {password_file}: cannot read a password: {exc}") from None
        if not lines:
            raise MetaqError(f"{option} {password_file}: cannot read a password: empty file")
        return lines[0]
    # Never from a piped stdin: it carries produce's messages.
    if not sys.stdin.isatty():
        raise MetaqError(f"no password for {user}: give {option} (there is no terminal to ask on)")
    import getpass

    return getpass.getpass(f"password for {user}: ")


def add_group_login_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group-login", action="append", default=[], metavar="ID=USER:PASSWORD_FILE",
                        help="log in to broker group ID as USER (password: first line of PASSWORD_FILE) instead of --user; repeatable")


def group_credentials(args: argparse.Namespace) -> dict[int, object]:
    """broker id -> Credentials from ``--group-login ID=USER:PASSWORD_FILE`` (with --tls-ca)."""
    from dataclasses import replace

    base = credentials(args)
    logins: dict[int, object] = {}
    for word in getattr(args, "group_login", []):
        group, _, login = word.partition("=")
        user, _, password_file = login.partition(":")
        if not group.strip().isdigit() or not user or not password_file:
            raise MetaqError(f"--group-login expects ID=USER:PASSWORD_FILE, got {word!r}")
        logins[int(group)] = replace(base, user=user, password=_password(user, password_file, "--group-login"))
    return logins


def add_group_secret_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group-secret", metavar="FILE",
                        help="the group's secret file (groupSecretFile): log in to ZooKeeper as the group, to write its nodes when ACLs are on")


def zk_security(args: argparse.Namespace, broker_id: int | None):
    """The ZooKeeper login of group ``broker_id`` from ``--group-secret`` (None without it)."""
    secret_file = getattr(args, "group_secret", None)
    if secret_file is None or broker_id is None:
        return None
    from ..security.group import GroupSecret
    from ..zk.acl import ZkSecurity

    return ZkSecurity(args.zk_root, broker_id, GroupSecret.load(secret_file, broker_id).zookeeper_password())


def zk_write_refused(args: argparse.Namespace, what: str) -> MetaqError:
    """The one line for a write to group ``args.broker_id``'s ZooKeeper nodes that its ACL refused."""
    if getattr(args, "group_secret", None):
        return MetaqError(f"ZooKeeper refused {what}: {args.group_secret} is not broker group {args.broker_id}'s secret")
    return MetaqError(f"ZooKeeper refused {what}: broker group {args.broker_id} has ACLs on; pass --group-secret FILE (its groupSecretFile)")
