"""A model broker for the transaction tests: appends what the real put path will append.

It keeps the ground truth the log must reproduce: which transaction owns each
data record, and how every transaction ended. Plain data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from metaq.record import buffer_reader, encode_batch, record_ends
from metaq.txn.control import AbortReason, Kind, frame_batch, marker
from metaq.txn.producer_state import Verdict
from metaq.txn.rebuild import PartitionTxnState


@dataclass
class ModelLog:
    log: bytearray = field(default_factory=bytearray)
    #: data record offset -> owning transaction id ("" outside transactions)
    owner: dict[int, str] = field(default_factory=dict)
    #: transaction id -> "open", "prepared", "commit" or "abort"
    status: dict[str, str] = field(default_factory=dict)
    state: PartitionTxnState = field(default_factory=PartitionTxnState)
    next_seq: dict[int, int] = field(default_factory=dict)
    clock: int = 1_000

    @property
    def read(self):
        return buffer_reader(self.log, 0)

    def _append(self, data: bytes | bytearray) -> int:
        at = len(self.log)
        self.log += data
        self.clock += 1
        self.state.catch_up(self.read, len(self.log))
        return at

    def put(self, pid: int, count: int, txid: str = "", epoch: int = 0) -> Verdict:
        seq = self.next_seq.get(pid, 0)
        verdict = self.state.producers.check(pid, epoch, seq, count).verdict
        if verdict is Verdict.NEW:
            body = encode_batch([(f"{txid}|{pid}|{seq + i}".encode(), None) for i in range(count)])
            self._append(frame_batch(bytearray(body), count, producer_id=pid, producer_epoch=epoch,
                                   first_seq=seq, timestamp_ms=self.clock, txid=txid))
            data_start = len(self.log) - len(body)
            for start in [data_start] + record_ends(body, data_start)[:-1]:
                self.owner[start] = txid
            self.next_seq[pid] = seq + count
            if txid:
                self.status.setdefault(txid, "open")
        return verdict

    def retry_last(self, pid: int, count: int) -> Verdict:
        seq = self.next_seq.get(pid, 0) - count
        return self.state.producers.check(pid, 0, seq, count).verdict

    def mark(self, kind: Kind, txid: str, reason: AbortReason = AbortReason.ROLLBACK) -> None:
        self._append(marker(kind, txid, producer_id=0, producer_epoch=0, timestamp_ms=self.clock,
                            timeout_s=30, reason=reason))
        self.status[txid] = {Kind.PREPARE: "prepared", Kind.COMMIT: "commit", Kind.ABORT: "abort"}[kind]

    def first_open_offsets(self) -> dict[str, int]:
        firsts: dict[str, int] = {}
        for offset, txid in sorted(self.owner.items()):
            if txid and self.status[txid] in ("open", "prepared") and txid not in firsts:
                firsts[txid] = offset
        return firsts
