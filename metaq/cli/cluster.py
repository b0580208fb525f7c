"""``metaq cluster --zk Z [--zk-root R]``: every broker group, one table.

From ZooKeeper: each broker id's master and slaves (``/brokers/ids/{id}/master``,
``slave{k}``), the group's epoch (``/brokers/ids/{id}/epoch``) and sync set
(``/brokers/ids/{id}/sync_set``) where present. From each broker's ``stats``
over the protocol: per-slave replication lag as the master sees it (bytes and
messages summed over partitions, the worst partition's milliseconds), the age of
the slave's last UDP heartbeat, and the slave's own view (stopped partitions), and, from the master's ``topics`` reply, the
partitions it serves that a slave has no replica of at all.

A group with no master shows a ``(none)`` master row in state ``NO MASTER``; a
master that refuses writes (lease expired, fenced, or a sync set below
minSyncSlaves with ``onSyncSlaveLoss=reject``) shows ``writes refused``. A rich
table on a terminal, plain aligned text otherwise (``--json``: one JSON object), then
one line per problem. Exit 1 if ZooKeeper cannot be reached, no broker is registered,
or any group is unhealthy (no master, an unreachable master, refused writes, a slave
with stopped partitions or without a replica of a partition the master serves (also as the
master itself counts them: stats ``not_replicated slave{k}``)) or cannot be checked (its master needs a login).

One call covers secured and plain groups: ``--user`` logs in where security is on
(a broker with security off is asked without a login), ``--group-login`` gives one
group its own user; a secured broker asked without a login shows ``needs login``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from . import numbers
from .admin import LOGIN_REFUSED, NEEDS_LOGIN, NEEDS_TLS, TLS_REFUSED, Answer, print_json, render_table, stats_answer, sync_set_json, sync_set_text
from .login import (
    add_group_login_argument, add_group_secret_argument, add_login_arguments, credentials, group_credentials, zk_connect_arg, zk_root_arg,
)


NO_MASTER = "NO MASTER"
NO_MASTER_URL = "(none)"
WRITES_REFUSED = "writes refused"

#: Partition names a problem line lists before "and N more".
NAMES_SHOWN = 20

COLUMNS = ("broker", "role", "address", "state", "epoch", "sync set", "lag bytes", "lag msgs", "lag ms", "heartbeat age")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("cluster", help="masters, slaves, epochs, sync sets and replication lag in one table; remove a dead group or slave")
    parser.add_argument("action", nargs="?", choices=("show", "remove-group", "remove-slave"), default="show",
                        help="show (default): the table; remove-group: forget a dead broker group; remove-slave: take a dead slave out of its group's sync set")
    parser.add_argument("--broker-id", type=numbers.broker_id, metavar="ID", help="the broker group (remove-group, remove-slave; show: only this group)")
    parser.add_argument("--slave-id", type=numbers.slave_id, metavar="K", help="the slave (remove-slave)")
    add_group_secret_argument(parser)
    parser.add_argument("--zk", type=zk_connect_arg, required=True, metavar="HOST:PORT[,...]", help="ZooKeeper connect string")
    parser.add_argument("--zk-root", type=zk_root_arg, default="/meta", help="ZooKeeper root of the cluster (default /meta)")
    parser.add_argument("--timeout", type=numbers.positive, default=5.0, help="seconds per ZooKeeper/broker request (default 5)")
    parser.add_argument("--json", action="store_true", help="one JSON object: members, problems, healthy")
    add_login_arguments(parser)
    add_group_login_argument(parser)
    parser.set_defaults(run=run)


@dataclass
class Member:
    broker_id: int
    role: str  # master | slave{k}
    url: str
    #: The group's epoch (a number in --json too); None: no epoch node, or an unreadable one.
    epoch: int | None = None
    sync_set: str = "-"
    state: str = "?"
    lag_bytes: int | None = None
    lag_messages: int | None = None
    lag_ms: float | None = None
    heartbeat_age_ms: float | None = None
    #: a slave's partitions that stopped replicating: name -> why
    stopped: dict[str, str] = field(default_factory=dict)
    #: partitions the master serves that this slave does not replicate (no replica of them on
    #: the slave, or the master counted them as not replicated), stopped ones aside
    not_replicating: list[str] = field(default_factory=list)

    def row(self) -> tuple[str, ...]:
        def num(value: Any, unit: str = "") -> str:
            return "-" if value is None or value < 0 else f"{value:.0f}{unit}"

        address = self.url.removeprefix("meta://")
        return (
            str(self.broker_id), self.role, address, self.state, "-" if self.epoch is None else str(self.epoch), self.sync_set,
            num(self.lag_bytes), num(self.lag_messages), num(self.lag_ms), num(self.heartbeat_age_ms, " ms"),
        )


def read_zk(zk_connect: str, zk_root: str, timeout: float) -> list[Member]:
    from ..zk.paths import ZkPaths
    from ..zk.session import zk_session

    paths = ZkPaths(zk_root)
    with zk_session(zk_connect, timeout) as client:
        return zk_members(client, paths)


def zk_members(client: Any, paths: Any) -> list[Member]:
    """Every group's members as ZooKeeper names them (states and lag unknown until ``apply_stats``)."""
    from kazoo.exceptions import NoNodeError

    from ..zk.group import read_group_state, read_members

    try:
        ids = sorted(int(child) for child in client.get_children(paths.broker_ids()) if child.isdigit())
    except NoNodeError:
        return []
    members: list[Member] = []
    for broker_id in ids:
        try:
            group = read_members(client, paths, broker_id)
        except NoNodeError:
            continue
        try:
            state = read_group_state(client, paths, broker_id)
            epoch = None if state.epoch_version < 0 else state.epoch
            sync_text = sync_set_text(state.sync_set)
        except ValueError:  # a malformed epoch or sync set node: show the rest
            epoch, sync_text = None, "?"
        if group.master_url is not None:
            members.append(Member(broker_id, "master", group.master_url, epoch, sync_text))
        else:
            members.append(Member(broker_id, "master", NO_MASTER_URL, epoch, sync_text, state=NO_MASTER))
        for slave_id, url in group.slaves.items():
            members.append(Member(broker_id, f"slave{slave_id}", url, epoch, sync_text))
    return members


def apply_stats(members: list[Member], answers: dict[str, Answer]) -> None:
    """Fill in states and lag from the brokers' stats answers (keyed by url)."""
    by_slave: dict[tuple[int, str], Member] = {(m.broker_id, m.role): m for m in members if m.role != "master"}
    for member in members:
        if member.state == NO_MASTER:
            continue
        answer = answers.get(member.url)
        reply = None if answer is None else answer.reply
        if reply is None:
            member.state = answer.problem if answer is not None and answer.problem else "unreachable"
            continue
        member.state = "up"
        if member.role == "master":
            if str(reply.get("writes", "accepted")).startswith("refused"):
                member.state = WRITES_REFUSED
            for name, value in reply.pairs:  # the master's own count (metaq/server/replica_health.py)
                head, _, slave_name = name.partition(" ")
                slave = by_slave.get((member.broker_id, slave_name))
                if head == "not_replicated" and slave is not None and isinstance(value, dict):
                    slave.not_replicating += [p for p in str(value.get("partitions", "")).split(",") if p]
            for slave_id, _partition, row in reply.slave_rows():
                slave = by_slave.get((member.broker_id, f"slave{slave_id}"))
                if slave is None:
                    continue
                slave.lag_bytes = (slave.lag_bytes or 0) + int(row["lag_bytes"])
                slave.lag_messages = (slave.lag_messages or 0) + int(row["lag_messages"])
                slave.lag_ms = max(slave.lag_ms or 0.0, float(row["lag_ms"]))
                slave.heartbeat_age_ms = float(row["heartbeat_age_ms"])
            continue
        rows = reply.replica_rows()
        own = list(rows.values())
        member.stopped = {name: str(row.get("error", "")) for name, row in sorted(rows.items()) if row.get("state") == "stopped"}
        if member.stopped:
            member.state = f"{len(member.stopped)} partition(s) stopped"
        if member.heartbeat_age_ms is None:
            age = reply.get("master_heartbeat_age_ms")
            member.heartbeat_age_ms = float(age) if age not in (None, "-") else None
        if member.lag_bytes is None and own:
            # The master did not list it (e.g. unreachable): the slave's own view.
            member.lag_bytes = sum(int(row["lag_bytes"]) for row in own)
            member.lag_ms = max(float(row["lag_ms"]) for row in own)


def apply_coverage(members: list[Member], answers: dict[str, Answer], served: dict[str, Any]) -> None:
    """Name the partitions each reachable slave has no replica of, from what its master serves
    (``served``: a master's url -> its topics reply, None when it did not answer)."""
    masters = {m.broker_id: m.url for m in members if m.role == "master" and m.state != NO_MASTER}
    for member in members:
        topics = served.get(masters.get(member.broker_id, ""))
        answer = answers.get(member.url)
        if member.role == "master" or topics is None or answer is None or answer.reply is None:
            continue
        replicas = answer.reply.replica_rows()
        names = [f"{topic}-{member.broker_id}-{n}" for topic, count in sorted(topics.items()) for n in range(count)]
        lacking = [name for name in names if name not in member.stopped and
                   (name not in replicas or replicas[name].get("state") != "following")]
        member.not_replicating = sorted(set(member.not_replicating) | set(lacking) - set(member.stopped))
        if member.not_replicating and member.state == "up":
            member.state = f"{len(member.not_replicating)} partition(s) not replicated"


async def _master_topics(url: str, timeout: float, creds: Any) -> dict[str, int] | None:
    from ..protocol.messages import TopicsRequest
    from ..protocol.replies import TopicsReply
    from .admin import ask

    reply = await ask(url, TopicsRequest().to_header(), timeout, creds)
    try:
        return None if reply is None else TopicsReply.of(reply).topics
    except ValueError:
        return None


async def collect(
    zk_connect: str, zk_root: str = "/meta", timeout: float = 5.0, creds: Any = None, group_creds: dict[int, Any] | None = None,
) -> list[Member]:
    """Members from ZooKeeper, with each broker's stats (asked as ``creds``, or the group's own
    entry of ``group_creds``, where security is on)."""
    members = await asyncio.to_thread(read_zk, zk_connect, zk_root, timeout)
    login = {m.url: (group_creds or {}).get(m.broker_id, creds) for m in members if m.state != NO_MASTER}
    urls = sorted(login)
    answers = await asyncio.gather(*(stats_answer(url, "", timeout, login[url]) for url in urls))
    by_url = dict(zip(urls, answers))
    apply_stats(members, by_url)
    masters = sorted({m.url for m in members if m.role == "master" and m.state not in (NO_MASTER, "unreachable")})
    topics = await asyncio.gather(*(_master_topics(url, timeout, login[url]) for url in masters))
    apply_coverage(members, by_url, dict(zip(masters, topics)))
    return members


def render_plain(members: list[Member]) -> str:
    return render_table(COLUMNS, [m.row() for m in members])


def render_rich(members: list[Member], zk_connect: str, zk_root: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"metaq cluster {zk_connect}{zk_root}")
    for column in COLUMNS:
        table.add_column(column, justify="right" if column.startswith(("lag", "heartbeat", "epoch")) else "left")
    previous = None
    for member in members:
        if previous is not None and member.broker_id != previous:
            table.add_section()
        previous = member.broker_id
        row = list(member.row())
        if member.state != "up":
            row[3] = f"[red]{row[3]}[/red]"
        table.add_row(*row)
    Console().print(table)


def run(args: argparse.Namespace) -> int:
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # errors are reported as one line below
    if args.action != "show":
        from .admin import zk_client
        from .cluster_remove import check_remove_options, remove_group, remove_slave

        check_remove_options(args)  # a usage error before any connection
        with zk_client(args) as (client, paths):
            lines = (remove_group if args.action == "remove-group" else remove_slave)(args, client, paths)
        print("\n".join(lines))
        return 0
    members = asyncio.run(collect(args.zk, args.zk_root, args.timeout, credentials(args), group_credentials(args)))
    if args.broker_id is not None:
        members = [m for m in members if m.broker_id == args.broker_id]
    where = args.zk_root if args.broker_id is None else f"{args.zk_root} as broker group {args.broker_id}"
    problems = verdict(members, where)
    if args.json:
        print_json({"zk": args.zk, "zk_root": args.zk_root, "healthy": not problems, "problems": problems,
                    "members": [{**asdict(m), "sync_set": sync_set_json(m.sync_set)} for m in members]})
    elif members and sys.stdout.isatty():
        render_rich(members, args.zk, args.zk_root)
    elif members:
        print(render_plain(members))
    if not args.json:
        for line in problems:
            print(line)
    return exit_code(problems)


def verdict(members: list[Member], where: str) -> list[str]:
    """The problems of the cluster's members (``unhealthy``), or the one line for none
    registered under ``where`` (a ZooKeeper root): ``metaq cluster`` and the web console
    (metaq/console/) both judge by this."""
    # No broker registered is never healthy: ZooKeeper lost its data, or the root is wrong.
    return unhealthy(members) if members else [f"UNHEALTHY: no brokers registered under {where}"]


def exit_code(problems: list[str]) -> int:
    """``metaq cluster``'s exit status for ``verdict``'s problems: 1 if any, else 0."""
    return 1 if problems else 0


def unhealthy(members: list[Member]) -> list[str]:
    """One line per problem: a group that cannot take writes now (no master, unreachable,
    refusing), a slave that stopped replicating partitions, a master not checked (no login)."""
    lines = []
    for m in members:
        if m.role == "master" and m.state in (NEEDS_LOGIN, LOGIN_REFUSED):
            lines.append(f"UNKNOWN broker group {m.broker_id}: master {m.state} ({m.url}): pass --user and "
                         f"--password-file, or --group-login {m.broker_id}=USER:PASSWORD_FILE")
        elif m.role == "master" and m.state == NEEDS_TLS:
            lines.append(f"UNKNOWN broker group {m.broker_id}: master {m.state} ({m.url}): pass --tls-ca with the CA "
                         f"of the brokers' certificates")
        elif m.role == "master" and m.state == TLS_REFUSED:
            lines.append(f"UNKNOWN broker group {m.broker_id}: master {m.state} ({m.url}): it does not speak TLS, "
                         f"or the --tls-ca CA did not sign its certificate")
        elif m.role == "master" and m.state != "up":
            lines.append(f"UNHEALTHY broker group {m.broker_id}: master {m.state}" + ("" if m.state == NO_MASTER else f" ({m.url})"))
        else:
            if m.stopped:
                first, why = next(iter(m.stopped.items()))
                lines.append(f"UNHEALTHY broker group {m.broker_id}: {m.role} ({m.url}) stopped replicating "
                             f"{len(m.stopped)} partition(s): {', '.join(m.stopped)} (first: {why})")
            if m.not_replicating:
                shown = ", ".join(m.not_replicating[:NAMES_SHOWN])
                more = f" and {len(m.not_replicating) - NAMES_SHOWN} more" if len(m.not_replicating) > NAMES_SHOWN else ""
                lines.append(f"UNHEALTHY broker group {m.broker_id}: {m.role} ({m.url}) does not replicate "
                             f"{len(m.not_replicating)} partition(s) its master serves: {shown}{more}")
    return lines
