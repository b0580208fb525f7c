"""MsgIdGenerator: contiguous runs, monotonic across clock jumps, floors and seq overflow."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.store.msgid import EPOCH, MsgIdGenerator, msg_id_broker, msg_id_timestamp_ms

T0 = EPOCH + 10_000_000


class FakeClock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_layout_and_contiguous_runs():
    gen = MsgIdGenerator(broker_id=7, clock_ms=FakeClock())
    first = gen.allocate(10)
    assert msg_id_timestamp_ms(first) == T0
    assert msg_id_broker(first) == 7
    assert first & 0xFFF == 0
    second = gen.allocate(5)
    assert second == first + 10  # same tick: the next run starts right after


def test_allocate_rejects_bad_counts():
    gen = MsgIdGenerator(1, clock_ms=FakeClock())
    for n in (0, -1, 4097):
        with pytest.raises(ValueError):
            gen.allocate(n)
    with pytest.raises(ValueError):
        MsgIdGenerator(1024)


def test_seq_overflow_moves_to_the_next_tick_without_touching_broker_bits():
    clock = FakeClock()
    gen = MsgIdGenerator(3, clock_ms=clock)
    a = gen.allocate(4000)
    b = gen.allocate(200)  # would need seq 4000..4199: does not fit in this tick
    assert msg_id_timestamp_ms(b) == T0 + 1 and b & 0xFFF == 0
    assert msg_id_broker(b + 199) == 3 and b > a + 3999
    c = gen.allocate(4096)
    assert msg_id_timestamp_ms(c) == T0 + 2 and msg_id_broker(c + 4095) == 3


def test_clock_going_backwards_keeps_ids_increasing():
    clock = FakeClock()
    gen = MsgIdGenerator(2, clock_ms=clock)
    a = gen.allocate(1)
    clock.now -= 60_000  # NTP step back by a minute
    b = gen.allocate(1)
    assert b == a + 1
    clock.now = T0 + 5
    assert msg_id_timestamp_ms(gen.allocate(1)) == T0 + 5


@pytest.mark.parametrize("floor_broker", [0, 2, 9])
def test_floor_from_the_logs_is_respected_even_with_a_slow_clock(floor_broker):
    # The floor came from a log written by a master whose clock was an hour ahead,
    # possibly under another broker id (e.g. before a failover).
    floor = ((T0 + 3_600_000 - EPOCH) << 22) | (floor_broker << 12) | 4095
    gen = MsgIdGenerator(2, floor=floor, clock_ms=FakeClock())
    first = gen.allocate(3)
    assert first > floor and msg_id_broker(first) == 2
    floor_mid = ((T0 - EPOCH) << 22) | (2 << 12) | 17
    assert MsgIdGenerator(2, floor=floor_mid, clock_ms=FakeClock()).allocate(1) == floor_mid + 1


@given(
    steps=st.lists(st.tuples(st.integers(-5_000, 5_000), st.integers(1, 4096)), min_size=1, max_size=60),
    floor_offset=st.integers(0, 1 << 40),
)
def test_property_runs_are_contiguous_and_strictly_increasing(steps, floor_offset):
    clock = FakeClock()
    floor = ((T0 - EPOCH) << 22) + floor_offset
    gen = MsgIdGenerator(5, floor=floor, clock_ms=clock)
    previous_last = floor
    for clock_step, n in steps:
        clock.now += clock_step
        first = gen.allocate(n)
        assert first > previous_last
        assert all(msg_id_broker(i) == 5 for i in (first, first + n - 1))
        assert (first + n - 1) >> 22 == first >> 22  # the run stays inside one tick
        previous_last = first + n - 1
