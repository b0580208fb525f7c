"""``metaq stats HOST:PORT [ITEM]``: a broker's stats, as ``echo stats | nc`` shows them."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from ..addresses import parse_host_port
from ..errors import MetaqError
from . import numbers
from .login import add_login_arguments, credentials

if TYPE_CHECKING:
    from ..client.connection import Credentials


def address_arg(text: str) -> tuple[str, int]:
    """The broker address's type: a malformed one (or a port outside 1..65535) is a usage line, exit 2."""
    try:
        return parse_host_port(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (port 1..65535), got {text!r}") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("stats", help="print a broker's stats (metaq stats HOST:PORT help explains the items)")
    parser.add_argument("address", type=address_arg, metavar="HOST:PORT", help="the broker's address")
    parser.add_argument("item", nargs="?", default="", help="topics, offsets, realtime, config, help, reset or a topic name")
    parser.add_argument("--timeout", type=numbers.positive, default=5.0, help="seconds to wait for the answer (default 5)")
    add_login_arguments(parser)
    parser.set_defaults(run=run)


async def fetch_stats_text(host: str, port: int, item: str, timeout: float, creds: "Credentials | None" = None) -> str:
    """The text form, exactly as ``nc`` shows it (the data form is protocol.replies.fetch_stats)."""
    from ..client.connection import ConnectionClosed, Credentials
    from ..protocol.messages import StatsRequest

    try:
        conn = await (creds or Credentials()).open(host, port, timeout)
        try:
            reply = await conn.request(StatsRequest(item=item).to_header(), timeout=timeout)
        finally:
            conn.close()
    except (ConnectionClosed, asyncio.TimeoutError) as exc:
        raise MetaqError(str(exc) or f"no answer from {host}:{port} within {timeout}s") from None
    if not reply.ok:
        raise MetaqError(f"{host}:{port} answered {reply.code}: {reply.message}")
    return reply.body.decode("utf-8", "replace")


def run(args: argparse.Namespace) -> int:
    host, port = args.address
    text = asyncio.run(fetch_stats_text(host, port, args.item, args.timeout, credentials(args)))
    print(text, end="")
    return 1 if text.startswith("ERROR") else 0
