"""What the admin commands (``metaq topics``, ``metaq groups``, and ``metaq cluster`` and
``metaq promote`` for their broker questions) share: options, a ZooKeeper session, asking a
broker over the protocol, and a plain table."""

from __future__ import annotations

import argparse
import json
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

from ..errors import MetaqError
from . import numbers
from .login import add_login_arguments, zk_connect_arg, zk_root_arg, zk_security


def add_zk_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zk", type=zk_connect_arg, required=True, metavar="HOST:PORT[,...]", help="ZooKeeper connect string")
    parser.add_argument("--zk-root", type=zk_root_arg, default="/meta", metavar="PATH", help="ZooKeeper root of the cluster (default /meta)")
    parser.add_argument("--timeout", type=numbers.positive, default=5.0, metavar="S", help="seconds per ZooKeeper or broker request (default 5)")
    add_login_arguments(parser)


def add_actions(sub: argparse._SubParsersAction, command: str, helptext: str) -> argparse._SubParsersAction:
    """``metaq COMMAND ACTION ...``: the command's parser, returning its actions."""
    parser = sub.add_parser(command, help=helptext)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    return actions


def add_action(actions: argparse._SubParsersAction, name: str, helptext: str, run: Any) -> argparse.ArgumentParser:
    """One action, with the ZooKeeper options every action takes."""
    action = actions.add_parser(name, help=helptext)
    add_zk_options(action)
    action.set_defaults(run=run)
    return action


@contextmanager
def zk_client(args: argparse.Namespace) -> Iterator[tuple[Any, Any]]:
    """``(kazoo client, ZkPaths)`` for the command's ``--zk`` and ``--zk-root``."""
    from ..zk.paths import ZkPaths
    from ..zk.session import ZooKeeperUnreachable, zk_session

    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # failures are reported as one line
    try:
        paths = ZkPaths(args.zk_root)
    except ValueError as exc:
        raise MetaqError(str(exc)) from None
    from kazoo.exceptions import ConnectionLoss, KazooException, OperationTimeoutError, SessionExpiredError
    from kazoo.handlers.threading import KazooTimeoutError

    try:
        with zk_session(args.zk, args.timeout, security=zk_security(args, getattr(args, "broker_id", None))) as client:
            yield client, paths
    except ZooKeeperUnreachable as exc:
        raise MetaqError(str(exc)) from None
    except (ConnectionLoss, OperationTimeoutError, SessionExpiredError, KazooTimeoutError) as exc:
        # The request may have reached the server before the answer was lost: a write can be
        # applied even so (ZooKeeper applies it once its majority is back), so say so rather
        # than let "failed" read as "not written".
        raise MetaqError(f"ZooKeeper at {args.zk}: {exc!r} mid-command: {OUTCOME_UNKNOWN}") from None
    except (KazooException, RuntimeError) as exc:  # mid-command: one line, no traceback
        raise MetaqError(f"ZooKeeper at {args.zk}: {exc!r}") from None


#: What a command says when its connection to ZooKeeper was lost mid-command.
OUTCOME_UNKNOWN = ("if it was writing a change, the change may still be applied; read the state back "
                   "(metaq topics describe, metaq groups describe) before running it again")


#: Why a broker gave no answer (``Answer.problem``).
UNREACHABLE = "unreachable"
NEEDS_LOGIN = "needs login"
LOGIN_REFUSED = "login refused"
#: The broker speaks TLS and the tool connected in plaintext (no --tls-ca): not "unreachable",
#: which would send the operator looking for a dead broker.
NEEDS_TLS = "needs TLS (--tls-ca)"
#: TLS on one side only the other way round, or a certificate the --tls-ca CA did not sign.
TLS_REFUSED = "TLS mismatch"


@dataclass(frozen=True)
class Answer:
    """A broker's reply, or why there is none: ``UNREACHABLE``, ``NEEDS_LOGIN`` (security is
    on and no --user was given), ``LOGIN_REFUSED`` (wrong user or password), ``NEEDS_TLS`` /
    ``TLS_REFUSED`` (TLS on one side only, or an untrusted certificate) or the broker's
    refusal (``403 ...``: the user lacks a permission)."""

    reply: Any | None
    problem: str | None = None


async def ask_answer(url: str, header: dict[str, Any], timeout: float, creds: Any = None) -> Answer:
    """One request to the broker at ``url`` (``meta://host:port``), logged in as ``creds``
    (client Credentials; None: not logged in).

    A broker with security off refuses a login; it is then asked without one, so one call
    covers secured and plain groups alike.
    """
    from ..addresses import parse_broker_url
    from ..client.connection import AuthenticationFailed, ConnectionClosed, Credentials, TlsMismatch
    from ..protocol.codes import FORBIDDEN

    creds = creds or Credentials()
    tls_problem = TLS_REFUSED if creds.tls_ca_file else NEEDS_TLS
    try:
        conn = await creds.open(*parse_broker_url(url), timeout)
    except AuthenticationFailed as exc:
        if "security is not enabled" in str(exc):
            return await ask_answer(url, header, timeout, replace(creds, user=None, password=None))
        return Answer(None, LOGIN_REFUSED)
    except TlsMismatch:
        return Answer(None, tls_problem)
    except Exception:  # unreachable or closing
        return Answer(None, UNREACHABLE)
    try:
        reply = await conn.request(header, timeout=timeout)
    except ConnectionClosed as exc:
        # Not logged in, nothing was sent before the request: a TLS listener drops it unanswered.
        diagnosed = await conn.diagnose(exc, timeout)
        return Answer(None, tls_problem if isinstance(diagnosed, TlsMismatch) else UNREACHABLE)
    except Exception:
        return Answer(None, UNREACHABLE)
    finally:
        conn.close()
    if reply.ok:
        return Answer(reply)
    if reply.code == FORBIDDEN:
        return Answer(None, NEEDS_LOGIN if creds.user is None else f"403 {reply.message}")
    return Answer(None, f"{reply.code} {reply.message}")


async def ask(url: str, header: dict[str, Any], timeout: float, creds: Any = None) -> Any | None:
    """``ask_answer``'s reply; None if the broker cannot answer."""
    return (await ask_answer(url, header, timeout, creds)).reply


async def stats_answer(url: str, item: str, timeout: float, creds: Any = None) -> Answer:
    """A broker's stats for ``item``, the reply as a StatsReply."""
    from ..protocol.messages import StatsRequest
    from ..protocol.replies import StatsReply

    answer = await ask_answer(url, StatsRequest(item=item, format="map").to_header(), timeout, creds)
    return answer if answer.reply is None else Answer(StatsReply.of(answer.reply))


async def stats_map(url: str, item: str, timeout: float, creds: Any = None) -> Any | None:
    """A broker's stats for ``item`` as a StatsReply, or None if it cannot answer."""
    return (await stats_answer(url, item, timeout, creds)).reply


def render_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned plain text (what scripts and tests read; also fine on a terminal)."""
    table = [tuple(columns)] + [tuple("-" if cell is None else str(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table)


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (the table's rows as objects) instead of a table")


def json_key(column: str) -> str:
    """A table column as a JSON key: ``lag bytes`` -> ``lag_bytes``."""
    return re.sub(r"[^a-z0-9]+", "_", column.lower()).strip("_")


def table_json(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The rows of a table as JSON objects keyed by ``json_key`` (numbers stay numbers)."""
    keys = [json_key(column) for column in columns]
    return [dict(zip(keys, row)) for row in rows]


def sync_set_text(members: "frozenset[int] | set[int] | None") -> str:
    """A sync set as the tables show it: ``slave1,slave2``, ``(empty)``, or ``-`` (none: async)."""
    if members is None:
        return "-"
    return ",".join(f"slave{k}" for k in sorted(members)) or "(empty)"


def sync_set_json(text: str) -> list[str] | None:
    """The table's sync set (``sync_set_text``, or ``?`` when unreadable) as JSON: a list of
    slave names, ``[]`` for an empty set, ``null`` for none or unknown."""
    if text in ("-", "?"):
        return None
    return [] if text == "(empty)" else text.split(",")


def no_such_topic(topic: str, zk_root: str, wait_option: str | None = None) -> MetaqError:
    """The one line for a topic no broker group has: no group's topic configuration names it
    and no broker registered it (a typo, or a topic not created yet); ``wait_option``: the
    command's option that waits for it instead."""
    also = f"; {wait_option} waits for it" if wait_option else ""
    return MetaqError(f"no broker group has a topic {topic!r} under {zk_root} (see metaq topics list{also})")


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def parse_settings(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` words -> dict; MetaqError on a word without ``=``."""
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise MetaqError(f"--set expects KEY=VALUE, got {pair!r}")
        settings[key.strip()] = value.strip()
    return settings
