"""The per-record read-committed filters (metaq/txn/reader.py) agree with ``committed_records``.

The client consumer, the HTTP gateway and the Spark source decode fetched bytes
column-wise and then ask ``VisibleRecords`` / ``drop_aborted`` per record; on random
histories of plain, transactional, retried, prepared, committed and aborted batches they
must deliver exactly what ``committed_records`` delivers, fetch by fetch.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.client.codec import decode_messages
from metaq.client.message import Partition
from metaq.record import decode_columns
from metaq.txn.reader import VisibleRecords, committed_records, drop_aborted
from tests.unit.test_txn_index import random_fetch
from tests.unit.test_txn_rebuild import OPS


@settings(max_examples=150, deadline=None)
@given(OPS, st.data())
def test_column_filters_deliver_what_committed_records_delivers(ops, data) -> None:
    model, index, _lso, start, fetch_end = random_fetch(ops, data)
    buf, spans = model.log[start:fetch_end], index.aborted_between(start, fetch_end)
    expected = [(r.offset, bytes(r.data)) for r in committed_records(buf, start, spans).records]

    offsets, _ids, attributes, datas, _consumed = decode_columns(bytes(buf), start)
    visible = VisibleRecords(spans)
    assert [(o, bytes(d)) for o, a, d in zip(offsets, attributes, datas) if visible.visible(o, a)] == expected

    messages, _end = decode_messages(buf, start, "t", Partition(0, 0))
    assert [(m.offset, m.data) for m in drop_aborted(messages, spans)] == expected


def test_spans_merge_across_replies_and_are_forgotten_behind_the_reader() -> None:
    visible = VisibleRecords([(10, 20)])
    visible.add([(10, 20), (40, 50)])
    assert [visible.visible(o, None) for o in (9, 10, 19, 20, 45)] == [True, False, False, True, False]
    visible.forget_before(30)
    assert visible.starts == [40] and not visible.visible(40, None)
