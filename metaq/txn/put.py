"""What the put handler does with an idempotent or transactional batch, as one pure step.

``plan_put`` runs after ``record.validate_batch`` and before anything is
appended. It refuses a batch carrying a forged control record, asks the
partition's producer table for its verdict, and for a new batch returns the
exact bytes to append (BATCH header + the producer's records). After the append
(msg ids stamped) the handler calls ``PartitionTxnState.appended(offset,
plan.append, plan.header)``, which records the batch in the table and the index
exactly as a slave's ``catch_up`` does from the replicated bytes.
"""

from __future__ import annotations

from typing import NamedTuple

from metaq.txn.control import Control, Kind, encode_control, find_forged_control
from metaq.txn.producer_state import Decision, ProducerStateTable, Verdict

#: Bytes of a BATCH header without a transaction id (header 20 + attribute block 18 + body 34).
BATCH_HEADER_SIZE = len(encode_control(Control(Kind.BATCH)))


class PutRefused(ValueError):
    """The batch breaks a rule of the transaction layer (answer 400 with the message)."""


class PutPlan(NamedTuple):
    decision: Decision
    #: NEW: the bytes to append; None otherwise (DUPLICATE: re-ack with the decision's offsets).
    append: bytearray | None
    #: NEW: where the producer's first record sits inside ``append`` (the ack's offset is append start + this).
    data_start: int = 0
    #: NEW: the BATCH header's fields, for ``PartitionTxnState.appended``.
    header: Control | None = None


def plan_put(producers: ProducerStateTable, batch: bytes | bytearray, record_count: int, *, producer_id: int,
             producer_epoch: int, first_seq: int, timestamp_ms: int, txid: str = "", fence_epoch: int = 0) -> PutPlan:
    """``fence_epoch``: the producer's newest epoch on this broker (its transactional id's fence;
    0: none), so a zombie's batch gets its one FENCED verdict here, with the partition's own."""
    forged = find_forged_control(batch)
    if forged is not None:
        raise PutRefused(f"record {forged} of the batch uses the reserved control attribute")
    decision = producers.check(producer_id, producer_epoch, first_seq, record_count, fence_epoch)
    if decision.verdict is not Verdict.NEW:
        return PutPlan(decision, None)
    header = Control(Kind.BATCH, producer_id, producer_epoch, timestamp_ms, txid, first_seq, record_count, len(batch))
    framed = bytearray(encode_control(header)) + batch
    return PutPlan(decision, framed, len(framed) - len(batch), header)

