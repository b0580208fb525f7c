"""``metaq promote --zk Z --broker-id ID --slave N [--unclean]``: choose the next master.

Planned switchover (default): the group's master pauses writes (503, nothing
stored), waits until slave ``N`` holds its whole log, and gives up the master
lock; only slave ``N`` may take the next epoch (the ``handover`` node names it).
Writes are paused from the first step to the new master's first ack.

``--unclean``: for a group with NO master and no eligible slave (sync mode and no
sync-set member alive; async with the last master's followers gone): slave ``N``
takes over even though it may lack acked messages (Kafka's unclean leader
election, RocketMQ's enableElectUncleanMaster). The report names, per partition,
slave ``N``'s log end against the highest log end any other live member holds:
messages past slave ``N``'s end on the old master are lost, and members that are
ahead move their extra tail aside (``truncated-*``) when they follow it.

Exit 0 once slave ``N`` leads; 1 with one line otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import Any

from ..errors import MetaqError
from . import numbers
from .admin import stats_map
from .login import add_group_secret_argument, add_login_arguments, credentials, zk_connect_arg, zk_root_arg, zk_security, zk_write_refused


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("promote", help="hand a broker group over to one of its slaves (planned, or --unclean)")
    parser.add_argument("--zk", type=zk_connect_arg, required=True, metavar="HOST:PORT[,...]", help="ZooKeeper connect string")
    parser.add_argument("--zk-root", type=zk_root_arg, default="/meta", help="ZooKeeper root of the cluster (default /meta)")
    parser.add_argument("--broker-id", type=numbers.broker_id, required=True, help="the broker group")
    parser.add_argument("--slave", type=numbers.slave_id, required=True, metavar="N", help="the slave id to promote")
    parser.add_argument("--unclean", action="store_true", help="elect it although it may lack acked messages (no master, no eligible slave)")
    parser.add_argument("--timeout", type=numbers.positive, default=15.0, help="seconds to wait for it to lead (default 15)")
    add_login_arguments(parser)
    add_group_secret_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    from kazoo.exceptions import NoAuthError

    from ..zk.session import ZooKeeperUnreachable, zk_session

    try:
        with zk_session(args.zk, 10, security=zk_security(args, args.broker_id)) as client:
            lines = promote(client, args.zk_root, args.broker_id, args.slave, args.unclean, args.timeout, credentials(args))
    except ZooKeeperUnreachable as exc:
        raise MetaqError(str(exc)) from None
    except NoAuthError:
        raise zk_write_refused(args, "the hand-over") from None
    print("\n".join(lines))
    return 0


def promote(client: Any, zk_root: str, broker_id: int, slave_id: int, unclean: bool, timeout: float, creds: Any = None) -> list[str]:
    """Run the hand-over; the report's lines (MetaqError with one line if it cannot); brokers are asked as ``creds``."""
    from kazoo.exceptions import NoNodeError

    from ..ha.election import Handover, clear_handover, write_handover
    from ..zk.group import read_group_state, read_members
    from ..zk.paths import ZkPaths

    paths = ZkPaths(zk_root)
    try:
        members = read_members(client, paths, broker_id)
    except NoNodeError:
        raise MetaqError(f"no broker group {broker_id} under {zk_root}") from None
    state = read_group_state(client, paths, broker_id)
    target = members.slaves.get(slave_id)
    if target is None:
        raise MetaqError(f"slave {slave_id} of broker group {broker_id} is not registered (slaves: {sorted(members.slaves)})")
    report: list[str] = []
    if unclean:
        if state.master_url is not None:
            raise MetaqError(f"broker group {broker_id} has a master ({state.master_url}); --unclean is only for a group without one")
        report += _unclean_report(broker_id, slave_id, target, members, creds)
    else:
        if state.master_url is None:
            raise MetaqError(
                f"broker group {broker_id} has no master to hand over from; if no slave is eligible,"
                f" `metaq promote --unclean` elects slave {slave_id} (it may lose acked messages)"
            )
        if state.sync_set is not None and state.sync_set_epoch == state.epoch and slave_id not in state.sync_set:
            raise MetaqError(f"slave {slave_id} is not in the sync set {sorted(state.sync_set)}: it may lack acked messages; let it catch up first")
    started = time.monotonic()
    write_handover(client, paths, broker_id, Handover(slave_id, state.epoch, unclean))
    try:
        while True:
            now_state = read_group_state(client, paths, broker_id)
            # The checksum node comes last, once the new master takes writes.
            if now_state.master_url == target and now_state.epoch > state.epoch and client.exists(paths.master_config_checksum(broker_id)):
                break
            if time.monotonic() - started > timeout:
                raise MetaqError(f"slave {slave_id} ({target}) did not take over within {timeout:.0f}s; see the brokers' logs (master stays {now_state.master_url})")
            time.sleep(0.01)
    finally:
        clear_handover(client, paths, broker_id)
    took = time.monotonic() - started
    report.append(f"slave {slave_id} ({target}) leads broker group {broker_id} in epoch {now_state.epoch}; hand-over took {took * 1000:.0f} ms")
    return report


def _unclean_report(broker_id: int, slave_id: int, target: str, members: Any, creds: Any) -> list[str]:
    """Per partition: the target's log end against the highest end another live member holds."""
    ends = {url: asyncio.run(_log_ends(url, creds)) for url in members.slaves.values()}
    mine = ends.get(target) or {}
    lines = [f"UNCLEAN election of slave {slave_id} ({target}) in broker group {broker_id}: acked messages it lacks are lost"]
    for partition in sorted(set().union(*(e.keys() for e in ends.values() if e))):
        best_url, best = max(((u, e.get(partition, 0)) for u, e in ends.items() if e), key=lambda item: item[1])
        own = mine.get(partition)
        lost = "unknown (unreachable)" if own is None else f"{max(0, best - own)} bytes behind the best live member ({best_url}: {best})"
        lines.append(f"  {partition}: slave {slave_id} log end {own if own is not None else '?'}; {lost}; anything the old master acked past it is lost")
    return lines


async def _log_ends(url: str, creds: Any) -> dict[str, int] | None:
    reply = await stats_map(url, "offsets", 5, creds)
    if reply is None:
        return None
    return {name: int(row["max_offset"]) for name, row in reply.pairs if isinstance(row, dict) and "max_offset" in row}
