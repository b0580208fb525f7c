"""``metaq drill``: a failover drill against a running broker group (see metaq/tools/drill.py)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

from ..errors import MetaqError, UsageError
from . import numbers
from .login import add_group_secret_argument, add_login_arguments, credentials, zk_connect_arg, zk_root_arg, zk_security


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "drill",
        help="fault the master of a running group under load; measure failover; check for lost messages",
    )
    parser.add_argument("--zk", type=zk_connect_arg, required=True, metavar="HOST:PORT[,...]", help="ZooKeeper connect string")
    parser.add_argument("--zk-root", type=zk_root_arg, default="/meta", help="ZooKeeper root of the cluster (default /meta)")
    parser.add_argument("--broker-id", type=numbers.broker_id, required=True, help="the broker group to drill")
    parser.add_argument("--fault", choices=("kill", "stop", "partition", "promote"), default="kill",
                        help="kill -9, SIGSTOP, a network partition through a fault proxy, or a planned hand-over (metaq promote's) to a sync slave (default kill)")
    parser.add_argument("--topic", help="topic to load (default: the group's first topic)")
    parser.add_argument("--rate", type=numbers.positive, default=200.0, help="messages per second during the drill (default 200)")
    parser.add_argument("--repeat", type=numbers.positive_int, default=1, help="run N drills back to back (p50/p99 over them)")
    parser.add_argument("--proxy-url", help="Toxiproxy API url, for --fault partition")
    parser.add_argument("--proxy-name", help="the proxy carrying the master's ZooKeeper link")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.add_argument("--no-idempotence", dest="idempotence", action="store_false",
                        help="load with a plain (at-least-once) producer: resends after the fault may be stored twice")
    add_login_arguments(parser)
    add_group_secret_argument(parser)
    parser.set_defaults(run=run)


@contextmanager
def drill_status(text: str, console: Any = None) -> Iterator[None]:
    """A spinner with the elapsed time on stderr while a drill runs (a drill takes seconds to
    minutes); nothing when stderr is not a terminal, so pipes and logs get the reports alone."""
    if console is None:
        if not sys.stderr.isatty():
            yield
            return
        from rich.console import Console

        console = Console(stderr=True)
    started = time.monotonic()
    with console.status(text) as status:
        ticker = asyncio.ensure_future(_tick(status, text, started))
        try:
            yield
        finally:
            ticker.cancel()


async def _tick(status: Any, text: str, started: float) -> None:
    while True:
        await asyncio.sleep(0.5)
        status.update(f"{text} ({time.monotonic() - started:.0f} s)")


def render(reports: list, first: int = 1) -> str:
    """The reports, numbered from ``first`` (drills printed one by one as they finish)."""
    from ..tools.drill import DrillReport

    lines = []
    for i, r in enumerate(reports, first):
        assert isinstance(r, DrillReport)
        lines.append(
            f"drill {i}: fault={r.fault} mode={r.mode} {r.old_master} -> {r.new_master or 'nobody'}"
            f" epoch {r.epoch_before}->{r.epoch_after}"
        )
        lines.append(
            f"  detection {_s(r.detection_s)}  first acked write {_s(r.first_ack_s)}  first read {_s(r.first_read_s)}"
        )
        lines.append(
            f"  acked before fault {r.acked_before_fault}, found after {r.found_after}; acked in all {r.acked_total};"
            f" lost {r.lost}; duplicates {r.duplicates} ({'idempotent' if r.idempotent else 'plain'} producer); failed sends {r.failed_sends}; unknown outcome {r.unknown_outcome_sends}"
            + (f"; acked by other groups of the topic {r.acked_other_groups} (not checked)" if r.acked_other_groups else "")
        )
        lines.append(
            f"  old master rejoined as {_rejoined(r)}; logs identical: "
            f"{'-' if r.logs_identical is None else r.logs_identical}"
        )
        for note in r.notes:
            lines.append(f"  note: {note}")
        if r.lost and r.mode == "sync":
            lines.append("  VIOLATION: acked messages lost in sync mode")
        if r.duplicates and r.idempotent:
            lines.append("  VIOLATION: messages stored twice with the idempotent producer")
    return "\n".join(lines)


def render_summary(summary: dict) -> str:
    return (
        "summary: {drills} drills, {failovers} failovers; first acked write p50 {p50} p99 {p99} max {mx};"
        " lost {lost_total}; duplicates {duplicates_total}".format(
            p50=_s(summary["first_ack_p50_s"]), p99=_s(summary["first_ack_p99_s"]), mx=_s(summary["first_ack_max_s"]), **summary
        )
    )


def _rejoined(report: Any) -> str:
    """``slave1``, with its address when it came back at another one (``serverPort=0``)."""
    if report.rejoined_as is None:
        return "nothing (yet)"
    if report.rejoined_at in (None, report.old_master):
        return report.rejoined_as
    return f"{report.rejoined_as} at {report.rejoined_at.removeprefix('meta://')}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def run(args: argparse.Namespace) -> int:
    from ..tools.drill import Drill, summarize, to_json

    proxy = (args.proxy_url, args.proxy_name) if args.proxy_url or args.proxy_name else None
    if proxy is not None and not (args.proxy_url and args.proxy_name):
        raise UsageError("--proxy-url and --proxy-name go together")
    if args.fault == "partition" and proxy is None:
        # The action needs the proxy: a usage error before anything connects (Drill checks it too, for its API users).
        raise UsageError("--fault partition needs --proxy-url and --proxy-name (the proxy carrying the master's ZooKeeper link)")

    creds = credentials(args)  # before the loop: a password prompt must not block it

    async def drills() -> list:
        reports = []
        for i in range(args.repeat):
            drill = Drill(args.zk, args.broker_id, args.fault, zk_root=args.zk_root, topic=args.topic, rate=args.rate, proxy=proxy, creds=creds,
                          idempotence=args.idempotence, zk_security=zk_security(args, args.broker_id))
            with drill_status(f"drill {i + 1} of {args.repeat}: {args.fault} the master of group {args.broker_id} under load, "
                              "wait for the new master, check every acked message"):
                report = await drill.run()
            reports.append(report)
            if not args.json:
                print(render([report], first=i + 1), flush=True)
        return reports

    reports = asyncio.run(drills())
    summary = summarize(reports)
    if args.json:
        print(to_json(reports))
    elif len(reports) > 1:
        print(render_summary(summary))
    return 0 if summary["all_ok"] else 1

