"""``metaq demo``: the whole story on an embedded default, in about half a minute.

An embedded ZooKeeper and a sync master/slave pair (real processes) on
127.0.0.1, with security on (``securityEnabled=true``: logins, ACLs, an
authenticated slave, ZooKeeper ACLs; metaq/cli/demo_security.py); what an
outsider tries is refused; produce through the client; consume from the slave;
verify the logs are byte-identical; a kill -9 failover drill (the slave takes
over under a new epoch, the old master comes back as its slave); verify again;
a summary. Every client and tool logs in. ``--console`` also runs the web console
(``metaq console``, docs/console.md) for the demo's cluster from the start: its URL is
printed, and it stays up as long as the demo (with ``--keep``, until Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MetaqError
from ..process import stop_pid
from . import numbers

if TYPE_CHECKING:
    from ..client.connection import Credentials

TOPIC = "demo"


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="showcase: ZooKeeper + a sync pair, produce, slave reads, a failover drill")
    parser.add_argument("--messages", type=numbers.positive_int, default=5000, help="messages to produce (default 5000)")
    parser.add_argument("--dir", help="work directory, new or empty (default: a temporary one, removed afterwards)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running until Ctrl-C")
    parser.add_argument("--console", action="store_true",
                        help="also run the web console (metaq console) for the demo's cluster: its URL is printed first, and it runs as long as the demo does")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(highlight=False)
    # The story is told by the steps below; the components' own info lines would drown it.
    for name in ("metaq", "kazoo"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if args.dir and Path(args.dir).is_dir() and any(Path(args.dir).iterdir()):
        # A previous run's brokers, roles swapped by its drill, would not start as a fresh pair.
        raise MetaqError(f"--dir {args.dir} is not empty: the demo starts a fresh cluster; give a new or empty directory")
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="metaq-demo-"))
    try:
        return asyncio.run(_demo(console, work, args.messages, args.keep, args.console))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


async def _demo(console: Any, work: Path, count: int, keep: bool, web_console: bool = False) -> int:
    from rich.table import Table

    from ..tools.launcher import LocalCluster
    from .demo_security import DemoSecurity, check_refused, try_as_outsider

    step = _Steps(console)
    security = DemoSecurity.create(work / "security", TOPIC)
    system = {
        "unflushThreshold": 0,
        "replicationMode": "sync",
        "onSyncSlaveLoss": "degrade",
        "syncSlaveTimeoutMs": 1000,
        **security.system,
    }
    cluster = LocalCluster(
        work, masters=1, slaves=1, topics={TOPIC: 2}, system=system, tick_ms=100,
        zookeeper={"zk.zkSessionTimeoutMs": 1500, "zk.zkSyncTimeMs": 0},
    )
    extra_pids: list[int] = []
    results: dict[str, Any] = {}
    try:
        with step("start an embedded ZooKeeper and a sync master/slave pair, security on"):
            await asyncio.to_thread(cluster.start)
            master, slave = cluster.masters[0], cluster.slaves[0][0]
            step.note(f"ZooKeeper {cluster.zk_connect}; master {master.url}; slave {slave.url} (slave0)")
            step.note(f"securityEnabled=true: users {security.app.user} (produce/consume {TOPIC}) and {security.ops.user} (admin),"
                      f" group secret and password files in {security.directory}")
        if web_console:
            with step("start the web console (metaq console)"):
                pid, url = await asyncio.to_thread(_start_console, work, cluster.zk_connect, security)
                extra_pids.append(pid)
                step.note(f"open {url} and log in as {security.ops.user} (admin) or {security.app.user} (read-only);"
                          f" passwords in {security.directory}/{security.ops.user}.password and {security.app.user}.password")
        with step("try what an outsider would: each attempt must be refused"):
            refusals = await try_as_outsider(security, master.url, cluster.zk_connect, cluster.zk_root, TOPIC)
            for refusal in refusals:
                step.note(f"{refusal.attempt}: {'refused' if refusal.refused else 'ACCEPTED'} ({refusal.answer})")
            check_refused(refusals)
        with step(f"produce {count} messages through the client (logged in as {security.app.user})"):
            results["produce"] = await _produce(cluster.zk_connect, count, security.app)
            step.note(f"{count} acked in {results['produce']:.2f}s ({count / results['produce']:,.0f} msgs/s), each on master and slave")
        with step("consume them from the slave (read_from=slave)"):
            got, seconds = await _consume_from_slave(cluster.zk_connect, count, security.app)
            results["consumed"] = got
            step.note(f"{got} messages read from the slave in {seconds:.2f}s")
            if got != count:
                raise MetaqError(f"read {got} messages from the slave, expected {count}")
        with step("verify: the slave's log is a byte-identical prefix of the master's"):
            results["verify_before"] = await _verify(cluster.zk_connect, security.ops)
            step.note("identical" if results["verify_before"] else "DIFFERENT")
        with step(f"failover drill: kill -9 the master under load (logged in as {security.ops.user})"):
            from ..tools.drill import Drill

            report = await Drill(cluster.zk_connect, 0, "kill", topic=TOPIC, rate=200, creds=security.ops).run()
            if report.restarted_pid:
                extra_pids.append(report.restarted_pid)
            results["drill"] = report
            step.note(
                f"{report.old_master} -> {report.new_master} (epoch {report.epoch_before} -> {report.epoch_after});"
                f" first acked write on the new master after {_s(report.first_ack_s)}; lost {report.lost}"
            )
            step.note(f"the old master came back as {report.rejoined_as or '?'} and follows the new one")
        with step("verify again, after the role swap"):
            results["verify_after"] = await _verify(cluster.zk_connect, security.ops)
            step.note("identical" if results["verify_after"] else "DIFFERENT")

        report = results["drill"]
        table = Table(title="metaq demo: summary", show_header=True)
        table.add_column("what")
        table.add_column("result", justify="right")
        table.add_row("security", "on (logins, ACLs, authenticated slave, ZooKeeper ACLs)")
        for refusal in refusals:
            table.add_row(refusal.attempt, "refused")
        table.add_row("messages produced (sync acks)", f"{count}")
        table.add_row("produce rate", f"{count / results['produce']:,.0f} msgs/s")
        table.add_row("read back from the slave", f"{results['consumed']}")
        table.add_row("logs identical before failover", str(results["verify_before"]))
        table.add_row("failover: detection", _s(report.detection_s))
        table.add_row("failover: first acked write on new master", _s(report.first_ack_s))
        table.add_row("failover: first read of a new message", _s(report.first_read_s))
        table.add_row("acked before the fault / found after", f"{report.acked_before_fault} / {report.found_after}")
        table.add_row("acked messages lost", str(report.lost))
        table.add_row("duplicates (retried unknown outcomes)", str(report.duplicates))
        table.add_row("epoch", f"{report.epoch_before} -> {report.epoch_after}")
        table.add_row("old master rejoined as", str(report.rejoined_as))
        table.add_row("logs identical after role swap", str(results["verify_after"]))
        console.print(table)
        ok = results["verify_before"] and results["verify_after"] and report.lost == 0 and report.new_master
        if keep:
            console.print(f"cluster left running: ZooKeeper {cluster.zk_connect}, work dir {work}; Ctrl-C (or SIGTERM) stops it")
            console.print(f"log in with: {security.login_hint()} (e.g. metaq cluster --zk {cluster.zk_connect} {security.login_hint()})")
            await _wait_forever()
        return 0 if ok else 1
    finally:
        for pid in extra_pids:
            stop_pid(pid)
        await asyncio.to_thread(cluster.stop)


def _start_console(work: Path, zk_connect: str, security: Any) -> tuple[int, str]:
    """``metaq console`` for the demo's cluster, as a child process: (its pid, its URL).

    It listens on 127.0.0.1 (a free port) and asks for logins of the demo's users; over
    plain HTTP, which the console allows on a loopback address only.
    """
    import re
    import subprocess
    import sys

    log = open(work / "console.log", "ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "metaq", "console", "--zk", zk_connect, "--port", "0", "--reports", str(work / "console-reports"),
         "--http-users", str(security.directory / "security.ini"), "--user", security.ops.user,
         "--password-file", str(security.directory / f"{security.ops.user}.password"),
         "--group-secret", f"0={security.directory / 'group.secret'}"],
        stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"serving (\S+)", line)
    if found is None:
        process.kill()
        process.wait()
        raise MetaqError(f"the web console did not start; see {work / 'console.log'}")
    return process.pid, found.group(1)


async def _produce(zk_connect: str, count: int, creds: Credentials) -> float:
    from ..client import AsyncMessageSessionFactory, Message, MetaClientConfig

    async with AsyncMessageSessionFactory(MetaClientConfig(zk_connect=zk_connect, credentials=creds)) as factory:
        producer = factory.create_producer()
        start = time.perf_counter()
        batch = 100
        sends = []
        for first in range(0, count, batch):
            messages = [
                Message(TOPIC, f"demo message {i}".encode(), attribute="even" if i % 2 == 0 else "odd")
                for i in range(first, min(count, first + batch))
            ]
            sends.append(producer.send_batch(messages))
        results = [r for batch_results in await asyncio.gather(*sends) for r in batch_results]
        failed = [r for r in results if not r.success]
        if failed:
            raise MetaqError(f"{len(failed)} sends failed, e.g. {failed[0].error_message}")
        return time.perf_counter() - start


async def _consume_from_slave(zk_connect: str, count: int, creds: Credentials) -> tuple[int, float]:
    from ..client import AsyncMessageSessionFactory, ConsumerConfig, Message, MetaClientConfig

    seen: set[bytes] = set()
    done = asyncio.Event()

    def on_message(message: Message) -> None:
        seen.add(message.data)
        if len(seen) >= count:
            done.set()

    start = time.perf_counter()
    async with AsyncMessageSessionFactory(MetaClientConfig(zk_connect=zk_connect, credentials=creds)) as factory:
        consumer = factory.create_consumer(ConsumerConfig(group="demo-readers", read_from="slave"))
        consumer.subscribe(TOPIC, 1024 * 1024, on_message)
        await consumer.complete_subscribe()
        try:
            await asyncio.wait_for(done.wait(), 60)
        except asyncio.TimeoutError:
            pass
    return len(seen), time.perf_counter() - start


async def _verify(zk_connect: str, creds: Credentials) -> bool:
    from ..tools.verify import VerifyError, verify_group

    deadline = time.monotonic() + 30
    while True:
        try:
            report = await verify_group(zk_connect, 0, creds=creds)
            if report.ok and report.slaves:
                return True
        except VerifyError:
            pass
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.3)


async def _wait_forever() -> None:
    """Until Ctrl-C or SIGTERM (both handled here: a backgrounded shell job ignores SIGINT)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    except asyncio.CancelledError:
        return


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


class _Steps:
    """Numbered steps with their duration, printed as they happen."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.number = 0

    def __call__(self, title: str) -> "_Steps":
        self.number += 1
        self.title = title
        return self

    def __enter__(self) -> "_Steps":
        self.started = time.perf_counter()
        self.console.print(f"[bold]{self.number}. {self.title}[/bold]")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.console.print(f"   [green]done[/green] in {time.perf_counter() - self.started:.1f}s")

    def note(self, text: str) -> None:
        self.console.print(f"   {text}")
