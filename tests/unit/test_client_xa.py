"""The XA resource's client-side rules (metaq/client/xa.py), without a broker.

A branch the resource sent nothing in lives only in the client: it votes read-only and
its commit or rollback needs no round trip; calls out of order or with bad flags raise
XAError with XA's code, like javax.transaction.xa.XAException.
"""

from __future__ import annotations

import asyncio

import pytest

from metaq.client.xa import TMFAIL, TMJOIN, TMSUCCESS, AsyncXAResource, XAError, Xid
from metaq.txn.xa import Code


class NoBroker:
    """A sender that must not be asked anything: these calls are decided in the client."""

    broker_id = None

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the resource called sender.{name}")


def resource() -> AsyncXAResource:
    return AsyncXAResource(NoBroker())  # type: ignore[arg-type]


def test_xids_travel_as_text_and_come_back() -> None:
    xid = Xid(7, b"order-42", b"\x00\xffq")
    assert str(xid) == "XID:7:6f726465722d3432:00ff71"
    assert Xid.parse(str(xid)) == xid
    with pytest.raises(ValueError, match="not an XA transaction id: 'TX:1:2'"):
        Xid.parse("TX:1:2")


def test_a_branch_without_work_is_read_only_and_never_reaches_a_broker() -> None:
    async def scenario() -> None:
        xa, xid = resource(), Xid(1, b"g")
        await xa.start(xid)
        await xa.end(xid, TMSUCCESS)
        assert await xa.prepare(xid) == xa.XA_RDONLY
        other = Xid(1, b"h")
        await xa.start(other)
        await xa.end(other, TMFAIL)
        await xa.rollback(other)
        assert await xa.recover() == []  # no group named yet: nothing can be in doubt here

    asyncio.run(scenario())


@pytest.mark.parametrize("call, code", [
    (lambda xa: xa.end(Xid(1, b"never"), TMSUCCESS), Code.XAER_NOTA),
    (lambda xa: xa.start(Xid(1, b"never"), TMJOIN), Code.XAER_NOTA),
    (lambda xa: xa.start(Xid(1, b"g"), 0x1), Code.XAER_PROTO),
    (lambda xa: xa.start(Xid(1, b"")), Code.XAER_PROTO),
    (lambda xa: xa.commit(Xid(1, b"elsewhere")), Code.XAER_RMERR),
])
def test_calls_out_of_order_raise_xa_codes(call, code) -> None:
    with pytest.raises(XAError) as raised:
        asyncio.run(call(resource()))
    assert raised.value.code == code


def test_a_second_start_of_the_same_xid_is_a_duplicate() -> None:
    async def scenario() -> None:
        xa = resource()
        await xa.start(Xid(1, b"g"))
        with pytest.raises(XAError) as raised:
            await xa.start(Xid(1, b"g"))
        assert raised.value.code == Code.XAER_DUPID

    asyncio.run(scenario())
