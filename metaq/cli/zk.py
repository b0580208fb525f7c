"""``metaq zk``: an embedded standalone ZooKeeper (on 127.0.0.1 unless ``--host``), foreground."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..zk.tls import ZkServerTls


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("zk", help="run an embedded standalone ZooKeeper (on 127.0.0.1 unless --host)")
    parser.add_argument("--port", type=int, default=2181, help="client port (default 2181; 0 picks a free one)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--data-dir",
        help="data directory, kept across restarts (default: $XDG_DATA_HOME/metaq/zookeeper-PORT;"
        " without XDG_DATA_HOME, ~/.local/share/metaq/zookeeper-PORT)",
    )
    where.add_argument(
        "--ephemeral", action="store_true",
        help="keep the data in a temporary directory removed on exit (throwaway use: the brokers' groups lose their state)",
    )
    parser.add_argument("--tick-ms", type=int, default=500, help="ZooKeeper tickTime in ms (default 500)")
    digest = parser.add_mutually_exclusive_group()
    digest.add_argument(
        "--super-digest",
        help="admin login that passes every ACL, as printed by 'metaq security zk-super-digest' (super:HASH;"
        " visible in ps: prefer --super-digest-file)",
    )
    digest.add_argument(
        "--super-digest-file",
        help="read the super digest from this file (mode 0600, first line), kept out of every command line",
    )
    tls = parser.add_argument_group("TLS (then --port is ZooKeeper's secureClientPort and nothing listens in clear)")
    tls.add_argument("--tls-cert", help="server certificate chain (PEM); needs --tls-key")
    tls.add_argument("--tls-key", help="the certificate's private key (PEM, unencrypted)")
    tls.add_argument("--tls-client-ca", help="CA (PEM) that signed the clients' certificates: mutual TLS, clients"
                     " without such a certificate are refused (the server's own certificate must be signed by it too)")
    parser.set_defaults(run=run)


def read_super_digest_file(path: str) -> str | None:
    """The first line of a 0600 file, or None after printing why it cannot be used."""
    from ..security.errors import SecurityError
    from ..security.files import read_private

    try:
        lines = read_private(path, "--super-digest-file").decode("utf-8", "replace").splitlines()
    except SecurityError as exc:
        print(f"metaq zk: {exc}", file=sys.stderr)
        return None
    return lines[0].strip() if lines else ""


def run(args: argparse.Namespace) -> int:
    from ..zk.cli import run_zk

    super_digest = args.super_digest
    if args.super_digest_file is not None:
        super_digest = read_super_digest_file(args.super_digest_file)
        if super_digest is None:
            return 2
    from ..zk.tls import ZkTlsError

    try:
        tls = server_tls(args)
    except ZkTlsError as exc:
        print(f"metaq zk: {exc}", file=sys.stderr)
        return 2
    return run_zk(args.port, args.data_dir, args.tick_ms, super_digest=super_digest, ephemeral=args.ephemeral,
                  host=args.host, tls=tls)


def server_tls(args: argparse.Namespace) -> "ZkServerTls | None":
    """The TLS the server serves (None: plaintext); ZkTlsError when the flags or files do not fit."""
    from ..zk.tls import ZkServerTls, ZkTlsError

    if not (args.tls_cert or args.tls_key or args.tls_client_ca):
        return None
    if not (args.tls_cert and args.tls_key):
        raise ZkTlsError("--tls-cert and --tls-key go together")
    return ZkServerTls(args.tls_cert, args.tls_key, args.tls_client_ca)
