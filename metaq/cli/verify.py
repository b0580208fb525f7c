"""``metaq verify``: are a group's logs whole and are the slaves' logs prefixes of the master's?

Two forms:

* ``metaq verify --zk Z --broker-id ID [--topic T]`` asks the running group: finds its master
  and slaves in ZooKeeper and compares, for every topic-partition (or only ``--topic``),
  each slave's log with the master's by CRC32 over byte ranges (the brokers compute them on
  their own disks; see ``metaq/tools/verify.py``), and reports corrupt bytes a broker's scrub
  or recovery found (``corrupt``: they are not served). One line per slave and partition.
* ``metaq verify --data-dir D [--topic T]`` checks a stopped broker's data directory
  (offline, read-only): every segment of every partition is CRC-scanned
  (``metaq/store/scrub.py``); one line per partition with the segments checked and every bad
  range (its offsets and segment file). A torn tail of the last segment (a crash cut a
  write; recovery cuts it at start) is listed but is not corruption.

``--json`` prints the report as one JSON object instead. Exit 0 if everything is whole and
identical, 1 otherwise (corruption, a difference, or a group that cannot be reached).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from dataclasses import asdict
from pathlib import Path

from ..errors import MetaqError, UsageError
from . import numbers
from .login import add_login_arguments, credentials, zk_connect_arg, zk_root_arg


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "verify", help="check a group's logs for corruption and that every slave's log is a byte-identical prefix of its master's"
    )
    parser.add_argument("--zk", type=zk_connect_arg, metavar="HOST:PORT[,...]", help="ZooKeeper connect string (a running group)")
    parser.add_argument("--zk-root", type=zk_root_arg, default="/meta", help="ZooKeeper root of the cluster (default /meta)")
    parser.add_argument("--broker-id", type=numbers.broker_id, help="the broker group (master's brokerId), with --zk")
    parser.add_argument("--data-dir", type=Path, metavar="DIR",
                        help="check a stopped broker's dataPath offline instead (every segment's CRCs)")
    parser.add_argument("--topic", help="only this topic")
    parser.add_argument("--chunk-mib", type=numbers.positive_int, default=4, help="CRC chunk size in MiB (default 4)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_login_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.data_dir is not None:
        if args.zk is not None or args.broker_id is not None:
            raise UsageError("--data-dir checks files offline: give it without --zk and --broker-id")
        return run_offline(args.data_dir, args.topic, args.json)
    if args.zk is None or args.broker_id is None:
        raise UsageError("give --zk and --broker-id (a running group), or --data-dir (a stopped broker's files)")
    return run_group(args)


def run_offline(data_dir: Path, topic: str | None, as_json: bool) -> int:
    from ..store.scrub import check_data_dir

    try:
        reports = check_data_dir(data_dir, topic)
    except OSError as exc:
        raise MetaqError(f"--data-dir {data_dir}: {exc.strerror or exc}") from None
    ok = bool(reports) and all(report.ok for report in reports)
    if as_json:
        print(json.dumps({"data_dir": str(data_dir), "ok": ok, "partitions": [r.to_json() for r in reports]}))
        return 0 if ok else 1
    if not reports:
        print(f"{data_dir}: no partition logs" + (f" of topic {topic}" if topic else ""))
        return 1
    for report in reports:
        findings = [f"NOT A LOG: {report.error}"] if report.error is not None else []
        findings += [f"{b.kind.upper()} [{b.start}, {b.end}) in {b.segment}" for b in report.bad]
        print(f"{report.partition}: {report.segments} segments, {report.bytes_checked} bytes checked: "
              + ("; ".join(findings) or "OK"))
    bad_count = sum(1 for report in reports if not report.ok)
    print(f"{len(reports) - bad_count}/{len(reports)} partitions whole" + ("" if not bad_count else f", {bad_count} NOT"))
    return 0 if ok else 1


def run_group(args: argparse.Namespace) -> int:
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # errors are reported as one line below
    from ..tools.verify import VerifyError, verify_group

    try:
        report = asyncio.run(
            verify_group(args.zk, args.broker_id, args.zk_root, args.topic, chunk=args.chunk_mib * 1024 * 1024, creds=credentials(args))
        )
    except VerifyError as exc:
        raise MetaqError(str(exc)) from None
    if args.json:
        checks = [{**asdict(check), "ok": check.ok} for check in report.checks]
        print(json.dumps({"broker_id": report.broker_id, "master": report.master, "ok": report.ok,
                          "slaves": {str(k): v for k, v in report.slaves.items()}, "checks": checks}))
        return 0 if report.ok else 1
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
