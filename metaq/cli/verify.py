"""``metaq verify --zk Z --broker-id ID [--topic T]``: are the slaves' logs prefixes of the master's?

Finds the group's master and slaves in ZooKeeper and compares, for every
topic-partition (or only ``--topic``), each slave's log with the master's by
CRC32 over byte ranges (the brokers compute them on their own disks; see
``metaq/tools/verify.py``). Prints one line per slave and partition: OK, or the
first differing byte range. Exit 0 if every slave holds an identical prefix,
1 otherwise (or if the group cannot be reached).
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from ..errors import MetaqError
from .login import add_login_arguments, credentials


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("verify", help="check that every slave's log is a byte-identical prefix of its master's")
    parser.add_argument("--zk", required=True, metavar="HOST:PORT[,...]", help="ZooKeeper connect string")
    parser.add_argument("--zk-root", default="/meta", help="ZooKeeper root of the cluster (default /meta)")
    parser.add_argument("--broker-id", type=int, required=True, help="the broker group (master's brokerId)")
    parser.add_argument("--topic", help="only this topic")
    parser.add_argument("--chunk-mib", type=int, default=4, help="CRC chunk size in MiB (default 4)")
    add_login_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # errors are reported as one line below
    from ..tools.verify import VerifyError, verify_group

    if args.chunk_mib <= 0:
        raise MetaqError("--chunk-mib must be positive")
    try:
        report = asyncio.run(
            verify_group(args.zk, args.broker_id, args.zk_root, args.topic, chunk=args.chunk_mib * 1024 * 1024, creds=credentials(args))
        )
    except VerifyError as exc:
        raise MetaqError(str(exc)) from None
    print(f"broker {report.broker_id}: master {report.master}")
    if not report.slaves:
        print("no slaves registered: nothing to compare")
        return 1
    for check in report.checks:
        print(f"  {check.slave} {check.topic}-{report.broker_id}-{check.partition}: {check.describe()}")
    bad = sum(1 for check in report.checks if not check.ok)
    total = len(report.checks)
    print(f"{total - bad}/{total} partition copies identical" + ("" if not bad else f", {bad} NOT"))
    return 0 if report.ok else 1
