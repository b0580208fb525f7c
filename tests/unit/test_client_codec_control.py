"""Readers that deliver messages skip control records (an idempotent producer's BATCH records)."""

from __future__ import annotations

from metaq.client.codec import decode_messages, encode_messages
from metaq.client.message import Message, Partition
from metaq.record import decode_columns
from metaq.txn.control import drop_control_columns
from metaq.txn.producer_state import ProducerStateTable
from metaq.txn.put import plan_put


def framed(payloads: list[bytes], first_seq: int) -> bytes:
    body, _ = encode_messages([Message("t", p) for p in payloads])
    plan = plan_put(ProducerStateTable(), body, len(payloads), producer_id=5, producer_epoch=0,
                    first_seq=first_seq, timestamp_ms=1)
    assert plan.append is not None
    return bytes(plan.append)


def test_decoded_messages_leave_out_batch_records_and_the_end_passes_them() -> None:
    plain, _ = encode_messages([Message("t", b"plain")])
    buf = framed([b"a", b"b"], 0) + plain + framed([b"c"], 2)
    messages, end = decode_messages(buf, 1000, "t", Partition(0, 0))
    assert [m.data for m in messages] == [b"a", b"b", b"plain", b"c"] and end == 1000 + len(buf)
    header_only = framed([b"x"], 0)[: len(framed([b"x"], 0)) - len(encode_messages([Message("t", b"x")])[0])]
    messages, end = decode_messages(header_only, 0, "t", Partition(0, 0))
    assert messages == [] and end == len(header_only)  # nothing to deliver, but the position moves on


def test_arrow_columns_drop_the_batch_records_rows() -> None:
    buf = framed([b"a", b"b"], 0)
    offsets, ids, attrs, datas, _ = decode_columns(buf, 0)
    assert len(offsets) == 3
    offsets, ids, attrs, datas = drop_control_columns(offsets, ids, attrs, datas)
    assert datas == [b"a", b"b"] and len(offsets) == len(ids) == len(attrs) == 2
