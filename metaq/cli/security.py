"""``metaq security``: write the security file and the group secret a broker's keys point at.

    metaq security add-user  -f security.ini --user alice [--produce P] [--consume P] [--admin]
    metaq security passwd    -f security.ini --user alice
    metaq security remove-user -f security.ini --user alice
    metaq security list      -f security.ini
    metaq security new-group-secret group.secret
    metaq security zk-super-digest

The file's directory must exist (a typo'd path is an error naming it; nothing is created
but the file). Passwords come from ``--password-file``, from standard input when it is not a terminal,
or from a prompt; never from the command line, where other users could see them in ps.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import MetaqError
from .files import check_parent_directory

if TYPE_CHECKING:
    from ..security.credentials import SecurityFile


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("security", help="manage users, ACLs and the group secret")
    commands = parser.add_subparsers(dest="security_command", metavar="ACTION")
    commands.required = True

    def with_file(name: str, help_text: str) -> argparse.ArgumentParser:
        action = commands.add_parser(name, help=help_text)
        action.add_argument("-f", "--file", required=True, help="the security file (securityConfig in server.ini)")
        return action

    def with_password(action: argparse.ArgumentParser) -> None:
        action.add_argument("--user", required=True, help="user name")
        action.add_argument("--password-file", help="read the password from this file (first line)")

    add = with_file("add-user", "add a user (or replace one) with a password and ACLs")
    with_password(add)
    add.add_argument("--produce", default="", help="topic patterns the user may produce to, comma-separated ('*' wildcard)")
    add.add_argument("--consume", default="", help="topic patterns the user may consume from")
    add.add_argument("--admin", action="store_true", help="may reset stats, read the config and run admin commands")
    add.set_defaults(run=run_add_user)

    passwd = with_file("passwd", "change a user's password")
    with_password(passwd)
    passwd.set_defaults(run=run_passwd)

    remove = with_file("remove-user", "remove a user")
    remove.add_argument("--user", required=True, help="user name")
    remove.set_defaults(run=run_remove_user)

    listing = with_file("list", "list users and their ACLs (never secrets)")
    listing.set_defaults(run=run_list)

    secret = commands.add_parser("new-group-secret", help="write a new random group secret (mode 0600)")
    secret.add_argument("path", help="file to create (groupSecretFile in server.ini); never overwritten")
    secret.set_defaults(run=run_new_group_secret)

    digest = commands.add_parser("zk-super-digest", help="print the ZooKeeper superDigest for an admin password")
    digest.add_argument("--password-file", help="read the password from this file (first line)")
    digest.set_defaults(run=run_zk_super_digest)


def read_password(password_file: str | None, prompt: str = "password: ") -> str:
    if password_file is not None:
        try:
            lines = Path(password_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise MetaqError(f"{password_file}: cannot read: {exc.strerror}") from None
        password = lines[0] if lines else ""
    elif not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(prompt)
        if getpass.getpass("again: ") != password:
            raise MetaqError("the passwords do not match")
    if not password:
        raise MetaqError("the password must not be empty")
    return password


def run_add_user(args: argparse.Namespace) -> int:
    from ..security.credentials import load_or_new

    check_parent_directory(args.file, "-f")  # before the password is asked for
    security_file = load_or_new(args.file)
    user = security_file.add_user(
        args.user, read_password(args.password_file), produce=args.produce, consume=args.consume, admin=args.admin
    )
    security_file.save()
    print(f"{args.file}: user {user.name!r} saved ({_describe(user.acl)})")
    return 0


def load_existing(path: str) -> "SecurityFile":
    """The security file at ``path``; a missing one is named with the way to make it."""
    from ..security.credentials import SecurityFile

    if not Path(path).exists():
        check_parent_directory(path, "-f")
        raise MetaqError(f"-f {path}: no such security file (metaq security add-user creates one)")
    return SecurityFile.load(path)


def run_passwd(args: argparse.Namespace) -> int:
    security_file = load_existing(args.file)
    security_file.set_password(args.user, read_password(args.password_file))
    security_file.save()
    print(f"{args.file}: password of {args.user!r} changed")
    return 0


def run_remove_user(args: argparse.Namespace) -> int:
    security_file = load_existing(args.file)
    security_file.remove_user(args.user)
    security_file.save()
    print(f"{args.file}: user {args.user!r} removed")
    return 0


def run_list(args: argparse.Namespace) -> int:
    security_file = load_existing(args.file)
    for user in security_file.users.values():
        print(f"{user.name}\t{_describe(user.acl)}")
    return 0


def _describe(acl) -> str:  # type: ignore[no-untyped-def]
    produce = ",".join(acl.produce) or "-"
    consume = ",".join(acl.consume) or "-"
    return f"produce={produce} consume={consume} admin={'yes' if acl.admin else 'no'}"


def run_new_group_secret(args: argparse.Namespace) -> int:
    from ..security.group import write_group_secret

    check_parent_directory(args.path, "new-group-secret")
    write_group_secret(args.path)
    print(f"{args.path}: new group secret written (mode 0600); copy it to every broker of the group")
    return 0


def run_zk_super_digest(args: argparse.Namespace) -> int:
    from ..zk.acl import super_digest

    print(super_digest(read_password(args.password_file)))
    return 0
