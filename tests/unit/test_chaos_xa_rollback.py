"""The chaos workload's XA transactions roll back a branch a step gave up in as a transaction
manager must (chaos/transactions.py, ``TransactionLoad._xa_roll_back``), against the
broker's own branch state machine (metaq/txn/xa.py) behind the real client resource."""

from __future__ import annotations

import asyncio

from chaos.transactions import TransactionLoad
from metaq.client.xa import AsyncXAResource, Xid
from metaq.txn.xa import Event, Marker, State, step


class TableSender:
    """A broker group that answers every transaction step by the coordinator's table."""

    broker_id = 0
    fenced = None

    def __init__(self) -> None:
        self.state: dict[str, State] = {}
        self.markers: list[Marker] = []

    async def step(self, branch, action: str, **_fields) -> int:
        row = step(self.state.get(branch.xid, State.NONEXISTENT), Event(action))
        self.state[branch.xid] = row.state
        if row.marker is not None:
            self.markers.append(row.marker)
        return int(row.code)


def test_a_branch_whose_send_gave_up_is_ended_with_tmfail_and_rolled_back() -> None:
    """Campaign seed 6200: an XA put got no reply (stored all the same), the workload's
    rollback was refused (XAER_PROTO: the branch was still associated), and the branch held
    its partition's reads until its timeout, into a ZooKeeper outage that stopped the timer."""
    sender = TableSender()
    resource = AsyncXAResource(sender)  # type: ignore[arg-type]
    xid = Xid(1, b"xa0-t378", b"b0")

    async def scenario() -> bool:
        await resource.start(xid)
        branch = resource.associated
        await sender.step(branch, "start")  # what the first send does, before its put
        branch.started = True
        return await TransactionLoad._xa_roll_back(resource, xid)

    assert asyncio.run(scenario())
    assert sender.state[str(xid)] is State.ROLLED_BACK and sender.markers == [Marker.ABORT]
    assert resource.associated is None
