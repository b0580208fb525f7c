"""The XA resource's client-side rules (metaq/client/xa.py), without a broker.

A branch the resource sent nothing in lives only in the client: it votes read-only and
its commit or rollback needs no round trip; calls out of order or with bad flags raise
XAError with XA's code, like javax.transaction.xa.XAException.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from metaq.client.transactional import AsyncTransactionalProducer
from metaq.client.xa import TMFAIL, TMJOIN, TMSUCCESS, AsyncXAResource, XAError, Xid
from metaq.txn.xa import Code


class NoBroker:
    """A sender that must not be asked anything: these calls are decided in the client."""

    broker_id = None
    fenced = None  # a state the resource reads, not a call to a broker

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
    (lambda xa: xa.start(Xid(1, "a str gtrid", b"b")), Code.XAER_PROTO),  # type: ignore[arg-type]
    (lambda xa: xa.start(Xid(1, b"g", "a str bqual")), Code.XAER_PROTO),  # type: ignore[arg-type]
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


def test_a_recovered_branch_without_a_group_names_the_call_that_gives_one() -> None:
    with pytest.raises(XAError, match=r"create_xa_producer\(broker_id=\.\.\.\)"):
        asyncio.run(resource().commit(Xid(1, b"elsewhere")))


@pytest.mark.parametrize("seconds", [-1, 1 << 31, 2.5, "30"])
def test_a_timeout_the_broker_would_refuse_is_refused_at_once(seconds: object) -> None:
    xa = resource()
    with pytest.raises(XAError, match="set_transaction_timeout: timeout_s must be an int") as raised:
        xa.set_transaction_timeout(seconds)  # type: ignore[arg-type]
    assert raised.value.code == Code.XAER_INVAL and xa.get_transaction_timeout() == 0
    producer = AsyncTransactionalProducer(SimpleNamespace(fenced=None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s must be an int 0..2147483647"):
        asyncio.run(producer.begin_transaction(timeout_s=seconds))  # type: ignore[arg-type]
    assert not producer.in_transaction
    xa.set_transaction_timeout((1 << 31) - 1)
    assert xa.get_transaction_timeout() == (1 << 31) - 1
