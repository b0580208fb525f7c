"""``metaq http --zk Z [--host 127.0.0.1] [--port P] [--tls-cert PEM --tls-key PEM]``: the HTTP
gateway (docs/http.md), foreground; it logs in to brokers with --user/--password-file/--tls-ca."""

from __future__ import annotations

import argparse
import asyncio
import sys

from ..errors import MetaqError, UsageError
from . import numbers
from .produce import add_zk_arguments, client_config

DEFAULT_PORT = 8080


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("http", help="HTTP gateway: produce, fetch and list topics over HTTP/JSON")
    add_zk_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=numbers.port, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--max-message-size", type=numbers.positive_int, default=None, metavar="BYTES",
                        help="largest message accepted; keep it equal to the brokers' maxMessageSize (default 1048576)")
    parser.add_argument("--max-request-bytes", type=numbers.positive_int, default=None, metavar="BYTES",
                        help="largest request body (default 16 MiB)")
    parser.add_argument("--send-timeout", type=numbers.positive, default=15.0, help="seconds a produce may retry before it fails (default 15)")
    add_https_arguments(parser, "require HTTP Basic logins of this security file's users and apply their ACLs (needs --tls-cert)")
    parser.set_defaults(run=run)


def add_https_arguments(parser: argparse.ArgumentParser, users_help: str) -> None:
    """HTTPS and HTTP logins: ``--tls-cert``/``--tls-key``, ``--http-users`` and its failed-login
    limits (``metaq http`` and ``metaq console`` alike; read by ``https_context`` and ``http_users``)."""
    parser.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate chain (needs --tls-key)")
    parser.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument("--http-users", metavar="FILE", help=users_help)
    parser.add_argument("--login-failure-burst", type=numbers.positive_int, default=None, metavar="N",
                        help="failed logins one client address, or one user, may have in a row before 429 (default 10)")
    parser.add_argument("--login-failure-rate", type=numbers.positive, default=None, metavar="PER_S",
                        help="failed logins per second allowed after the burst, per address and per user (default 1)")


def http_users(args: argparse.Namespace, https: bool):
    """The users HTTP clients log in as (--http-users), or None; MetaqError on a bad file."""
    if args.http_users is None:
        return None
    if not https:
        raise UsageError("--http-users needs --tls-cert and --tls-key: Basic logins must not cross the network in the clear")
    from ..http.auth import DEFAULT_FAILURE_BURST, DEFAULT_FAILURE_RATE, HttpUsers
    from ..security.errors import SecurityError

    burst = DEFAULT_FAILURE_BURST if args.login_failure_burst is None else args.login_failure_burst
    rate = DEFAULT_FAILURE_RATE if args.login_failure_rate is None else args.login_failure_rate
    try:
        return HttpUsers.load(args.http_users, failure_burst=burst, failure_rate=rate)
    except SecurityError as exc:
        raise MetaqError(str(exc)) from None


def https_context(args: argparse.Namespace):
    """The listener's TLS context from --tls-cert/--tls-key (None: plain HTTP); MetaqError on a bad pair."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if args.tls_cert is None:
        return None
    from ..security.errors import SecurityError
    from ..security.tls import server_context

    try:
        return server_context(args.tls_cert, args.tls_key)
    except SecurityError as exc:
        raise MetaqError(str(exc)) from None


async def serve(args: argparse.Namespace) -> int:
    from ..http.app import DEFAULT_MAX_REQUEST_BYTES, serve
    from ..http.gateway import DEFAULT_MAX_MESSAGE_SIZE, Gateway

    # Not given: the defaults (argparse refused 0 and negative values, which mean nothing here).
    max_message_size = DEFAULT_MAX_MESSAGE_SIZE if args.max_message_size is None else args.max_message_size
    max_request_bytes = DEFAULT_MAX_REQUEST_BYTES if args.max_request_bytes is None else args.max_request_bytes
    ssl_context = https_context(args)
    users = http_users(args, ssl_context is not None)
    gateway = await Gateway(client_config(args, send_timeout_s=args.send_timeout), max_message_size).start()

    def ready(url: str) -> None:
        print(f"metaq http: serving {url} for the cluster at {args.zk}{args.zk_root}", flush=True)

    try:
        await serve(gateway, args.host, args.port, max_request_bytes, ready, ssl_context=ssl_context, users=users)
    except OSError as exc:
        raise MetaqError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    finally:
        await gateway.close()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(serve(args))
    except KeyboardInterrupt:
        print("metaq http: stopped", file=sys.stderr)
        return 0
