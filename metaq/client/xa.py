"""XA: a resource manager per broker group, with JTA's XAResource calls and flags.

``AsyncXAProducer`` sends messages inside the branch its resource is associated with;
``AsyncXAResource`` is what a transaction manager drives: ``start``, ``end``,
``prepare``, ``commit`` (one or two phase), ``rollback``, ``recover``, ``forget``.
The XA rules the broker applies are in metaq/txn/xa.py; codes are XA's (``Code``).

As in JTA, ``prepare`` returns XA_OK or XA_RDONLY, and every other outcome raises
``XAError`` with its code (XA_RB* when the branch was rolled back, XA_HEURRB after a
heuristic rollback, XAER_NOTA for an unknown xid, XAER_PROTO for a call out of order).

One resource is one broker group: the group of the first message sent (or the one
given to ``create_xa_producer(broker_id=...)``, e.g. by a transaction manager recovering after
its own restart). A branch the resource has not sent anything in yet lives only here:
``start`` reaches the broker with the first message, and such a branch votes
read-only in ``prepare``.

Failover: every call goes to the group's current master and is retried through a
failover (transactional.py). A branch prepared on a master that then dies is known to
the new master from the replicated log: ``recover`` lists it and ``commit`` commits
it there.
"""

from __future__ import annotations

from typing import NamedTuple

from ..protocol.messages import TransactionRequest
from ..txn.xa import Code
from .message import Message, SendResult
from .transactional import Branch, ProducerFenced, TransactionalSender, TransactionError, check_timeout, xa_name

TMNOFLAGS = 0x00000000
TMJOIN = 0x00200000
TMRESUME = 0x08000000
TMSUCCESS = 0x04000000
TMFAIL = 0x20000000
TMSUSPEND = 0x02000000
TMSTARTRSCAN = 0x01000000
TMENDRSCAN = 0x00800000


class XAError(TransactionError):
    """javax.transaction.xa.XAException: ``code`` is the XA code."""


class Xid(NamedTuple):
    """An XA transaction branch id: format id, global transaction id, branch qualifier (<= 64 bytes each)."""

    format_id: int
    gtrid: bytes
    bqual: bytes = b""

    def __str__(self) -> str:
        return f"XID:{self.format_id}:{self.gtrid.hex()}:{self.bqual.hex()}"

    @classmethod
    def parse(cls, text: str) -> "Xid":
        """The Xid a broker named (``XID:{formatId}:{gtrid hex}:{bqual hex}``)."""
        try:
            tag, format_id, gtrid, bqual = text.split(":")
            if tag != "XID":
                raise ValueError(tag)
            return cls(int(format_id), bytes.fromhex(gtrid), bytes.fromhex(bqual))
        except ValueError:
            raise ValueError(f"not an XA transaction id: {text!r}") from None


def _check_xid(xid: Xid) -> Xid:
    well_typed = isinstance(xid.format_id, int) and isinstance(xid.gtrid, bytes) and isinstance(xid.bqual, bytes)
    if not well_typed or len(xid.gtrid) > 64 or len(xid.bqual) > 64 or not xid.gtrid:
        raise XAError(f"bad xid {xid!r}: an int format_id, gtrid 1..64 bytes, bqual at most 64 bytes (bytes, not str)",
                      int(Code.XAER_PROTO))
    return xid


class AsyncXAResource:
    XA_OK = int(Code.XA_OK)
    XA_RDONLY = int(Code.XA_RDONLY)

    def __init__(self, sender: TransactionalSender) -> None:
        self.sender = sender
        self.timeout_s = 0
        self._branches: dict[Xid, Branch] = {}
        #: The branch the producer's sends go to (between start and end).
        self.associated: Branch | None = None

    def set_transaction_timeout(self, seconds: int) -> bool:
        """The timeout of branches started from now on (0: the broker's maxTxTimeoutInSeconds)."""
        try:
            self.timeout_s = check_timeout(seconds)
        except ValueError as exc:
            raise XAError(f"set_transaction_timeout: {exc}", int(Code.XAER_INVAL)) from None
        return True

    def get_transaction_timeout(self) -> int:
        return self.timeout_s

    def is_same_rm(self, other: "AsyncXAResource") -> bool:
        return self.sender.broker_id is not None and self.sender.broker_id == other.sender.broker_id

    async def start(self, xid: Xid, flags: int = TMNOFLAGS) -> None:
        _check_xid(xid)
        if self.sender.fenced is not None:
            # A new branch reaches no broker until its first message: the fence is checked here.
            raise ProducerFenced(self.sender.fenced)
        if flags & (TMJOIN | TMRESUME):
            branch = self._known(xid)
            if branch.started:
                await self._expect(branch, "start_join")
        elif flags == TMNOFLAGS:
            if xid in self._branches:
                raise XAError(f"{xid} is already started here", int(Code.XAER_DUPID))
            branch = self._branches[xid] = Branch(str(xid), self.timeout_s, self.sender.broker_id)
        else:
            raise XAError(f"start: flags {flags:#x} are not TMNOFLAGS, TMJOIN or TMRESUME", int(Code.XAER_PROTO))
        self.associated = branch

    async def end(self, xid: Xid, flags: int = TMSUCCESS) -> None:
        branch = self._known(xid)
        if flags not in (TMSUCCESS, TMFAIL, TMSUSPEND):
            raise XAError(f"end: flags {flags:#x} are not TMSUCCESS, TMFAIL or TMSUSPEND", int(Code.XAER_PROTO))
        if self.associated is branch:
            self.associated = None
        if branch.started:
            await self._expect(branch, "end_fail" if flags == TMFAIL else "end")

    async def prepare(self, xid: Xid) -> int:
        branch = self._known(xid)
        if not branch.started:
            del self._branches[xid]  # no work here: read-only, finished
            return self.XA_RDONLY
        code = await self.sender.step(branch, "prepare")
        if code == Code.XA_RDONLY:
            self._branches.pop(xid, None)
            return code
        self._raise_unless_ok(branch, "prepare", code)
        return self.XA_OK

    async def commit(self, xid: Xid, one_phase: bool = False) -> None:
        branch = self._branches.get(xid)
        if branch is not None and not branch.started:
            del self._branches[xid]
            return  # nothing was sent: nothing to commit
        branch = branch or self._recovered(xid)
        await self._expect(branch, "commit_one_phase" if one_phase else "commit")
        self._branches.pop(xid, None)

    async def rollback(self, xid: Xid) -> None:
        branch = self._branches.get(xid)
        if branch is not None and not branch.started:
            del self._branches[xid]
            return
        branch = branch or self._recovered(xid)
        await self._expect(branch, "rollback")
        self._branches.pop(xid, None)

    async def forget(self, xid: Xid) -> None:
        await self._expect(self._branches.get(xid) or self._recovered(xid), "forget")
        self._branches.pop(xid, None)

    async def recover(self, flags: int = TMSTARTRSCAN | TMENDRSCAN) -> list[Xid]:
        """In-doubt XA branches of this resource's broker group: prepared, or heuristically rolled back."""
        sender = self.sender
        if sender.broker_id is None:
            return []  # nothing sent yet, and no group named: no branch can be in doubt here
        reply, _ = await sender.request(sender.broker_id, TransactionRequest(action="recover").to_header())
        if reply.code != 200:
            raise XAError(f"recover: {reply.code} {reply.message}", int(Code.XAER_RMERR))
        return [Xid.parse(x) for x in reply.get("xids") or () if str(x).startswith("XID:")]

    # --- internals ---------------------------------------------------------------------

    def _known(self, xid: Xid) -> Branch:
        branch = self._branches.get(xid)
        if branch is None:
            raise XAError(f"{xid} was not started on this resource", int(Code.XAER_NOTA))
        return branch

    def _recovered(self, xid: Xid) -> Branch:
        """A branch another resource (or an earlier life of the transaction manager) started."""
        if self.sender.broker_id is None:
            raise XAError(f"{xid}: this resource names no broker group yet (create_xa_producer(broker_id=...))",
                          int(Code.XAER_RMERR))
        return Branch(str(_check_xid(xid)), broker_id=self.sender.broker_id, started=True)

    async def _expect(self, branch: Branch, action: str) -> None:
        self._raise_unless_ok(branch, action, await self.sender.step(branch, action))

    def _raise_unless_ok(self, branch: Branch, action: str, code: int) -> None:
        if code != Code.XA_OK:
            raise XAError(f"{action} {branch.xid}: {xa_name(code)}", code)


class AsyncXAProducer:
    """Sends messages in the branch its XA resource is associated with. Create with ``factory.create_xa_producer()``."""

    def __init__(self, sender: TransactionalSender) -> None:
        self.sender = sender
        self.resource = AsyncXAResource(sender)

    def xa_resource(self) -> AsyncXAResource:
        return self.resource

    async def send_message(self, message: Message) -> SendResult:
        return (await self.send_batch([message]))[0]

    async def send_batch(self, messages: list[Message]) -> list[SendResult]:
        branch = self.resource.associated
        if branch is None:
            raise XAError("no XA branch is associated: call xa_resource().start(xid) first", int(Code.XAER_PROTO))
        return list(await self.sender.send(branch, list(messages)))
