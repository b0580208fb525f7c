"""The ``time_reads`` check (chaos.checker) on synthetic histories: right ``offset_for_time``
answers pass, and each kind of wrong answer is named; the prober's choice of times
(chaos.time_reads)."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

from chaos.checker import check
from chaos.time_reads import RANDOM_MARGIN_MS, TimeReadProber
from metaq.record import encode_record
from metaq.store.msgid import EPOCH
from tests.unit.test_chaos_checker import Run, failing

BASE_MS = 1_765_000_000_000
P = "t/0-0"


class TimedRun(Run):
    """A ``Run`` whose records carry times ``BASE_MS``, +10 ms, +20 ms, ... in their msg ids."""

    def __init__(self, mode: str = "sync") -> None:
        super().__init__(mode)
        self.h.meta["time_reads"] = True
        self.clock_ms = itertools.count(BASE_MS, 10)
        self.times: dict[int, int] = {}  # offset in P -> record time

    def append(self, partition: str, value: str) -> int:
        offset = len(self.logs[partition])
        time_ms = next(self.clock_ms)
        self.logs[partition] += encode_record(value.encode(), msg_id=(time_ms - EPOCH) << 22)
        if partition == P:
            self.times[offset] = time_ms
        return offset

    def time_read(self, time_ms: int, offset: int, latest: bool = False, min_offset: int = 0,
                  max_offset: int | None = None) -> None:
        op = self.h.invoke("time-g0", "time_read", None, P, replica="meta://s1", time_ms=time_ms)
        self.h.ok(op, offset, partition=P, latest=latest, min_offset=min_offset,
                  max_offset=len(self.logs[P]) if max_offset is None else max_offset)


def five(mode: str = "sync") -> tuple[TimedRun, list[int]]:
    run = TimedRun(mode)
    offsets = [run.put(f"p0-{i}") for i in range(5)]
    run.read(P, [(offsets[0], "p0-0")])
    return run, offsets


def kinds(result) -> list[str]:
    return [v["kind"] for v in result.violations("time_reads")]


def test_right_answers_pass():
    run, offsets = five()
    end = len(run.logs[P])
    for offset in offsets:
        t = run.times[offset]
        run.time_read(t, offset)  # exactly a record's time: that record
        following = [o for o in offsets if o > offset]
        if following:
            run.time_read(t + 1, following[0])  # just past it: the next one
    run.time_read(BASE_MS - 5000, offsets[0])  # before every record: the first
    run.time_read(run.times[offsets[-1]] + 1, end, latest=True)  # after every record: the end
    # A slave behind its master: only its readable prefix counts.
    run.time_read(run.times[offsets[3]], offsets[3], latest=True, max_offset=offsets[3])
    result = check(run.finish())
    assert result.ok, result.report()
    assert result.checks["time_reads"]["checked"] == 12


def test_a_skipped_newer_record_is_named():
    run, offsets = five()
    run.time_read(run.times[offsets[1]], offsets[2])  # record 1 has that time, and was passed over
    result = check(run.finish())
    assert failing(result) == {"time_reads"}
    (v,) = result.violations("time_reads")
    assert v["kind"] == "skipped_newer" and v["record"] == offsets[1] and v["record_time"] == run.times[offsets[1]]


def test_latest_while_a_readable_record_is_that_new_is_skipped_newer():
    run, offsets = five()
    run.time_read(run.times[offsets[4]], len(run.logs[P]), latest=True)
    assert kinds(check(run.finish())) == ["skipped_newer"]


def test_an_answer_older_than_the_time_is_named():
    run, offsets = five()
    run.time_read(run.times[offsets[3]], offsets[2])
    result = check(run.finish())
    (v,) = result.violations("time_reads")
    assert v["kind"] == "older_than_time" and v["record_time"] == run.times[offsets[2]]


def test_an_offset_inside_a_record_is_not_a_record():
    run, offsets = five()
    run.time_read(run.times[offsets[3]], offsets[2] + 3)
    assert kinds(check(run.finish())) == ["not_a_record"]


def test_an_offset_the_final_log_never_reached_is_past_final_end():
    run, offsets = five()
    end = len(run.logs[P])
    # Sync: what a replica could read is never taken back.
    run.time_read(run.times[offsets[4]] + 1, end + 40, max_offset=end + 80)
    assert kinds(check(run.finish())) == ["past_final_end"]


@pytest.mark.parametrize("offset, latest, max_offset", [(500, False, 100), (90, True, 100), (-1, False, 100)])
def test_an_offset_outside_the_readable_range_is_named(offset, latest, max_offset):
    run, offsets = five()
    run.time_read(BASE_MS + 10_000, offset, latest=latest, max_offset=max_offset)
    assert "outside_readable" in kinds(check(run.finish()))


def test_async_answers_past_a_lag_window_are_expected_not_judged():
    run = TimedRun("async")
    kept = [run.put(f"p0-{i}", epoch=1) for i in range(4)]
    run.h.failover(0, "meta://m0", "meta://s1", 2, lag={P: {"bytes": 1000, "messages": 5}})
    new = run.put("p0-new", epoch=2, master="meta://s1")
    # The old master had other records past `new` before the failover took them back.
    run.time_read(run.times[new] + 1, new + 7, max_offset=new + 100)
    run.time_read(run.times[kept[1]], kept[2])  # below the window: still judged
    result = check(run.finish())
    assert kinds(result) == ["skipped_newer"]
    assert [e["kind"] for e in result.checks["time_reads"]["expected"]] == ["taken_back"]


def test_a_final_snapshot_without_record_times_cannot_judge():
    run, offsets = five()
    run.time_read(run.times[offsets[0]], offsets[0])
    history = run.finish()
    for replica in history.final["replicas"].values():
        for snap in replica["partitions"].values():
            snap.pop("times", None)
    assert kinds(check(history)) == ["no_final_times"]


def test_a_run_asked_for_time_reads_that_got_none_makes_no_progress():
    run, _offsets = five()
    result = check(run.finish())
    assert any(v["workload"] == "time_reads" for v in result.violations("progress"))


def test_the_prober_asks_acked_times_and_random_ones_around_them():
    history = TimedRun().h
    op = history.invoke("r0", "put", "v", P)
    history.ok(op, 0, partition=P, msg_id=(BASE_MS - EPOCH) << 22)
    op = history.invoke("r0", "put", "w", "t/1-0")  # another group's put: not this prober's
    history.ok(op, 0, partition="t/1-0", msg_id=(BASE_MS + 7 - EPOCH) << 22)
    workload = SimpleNamespace(history=history, seed=3)
    prober = TimeReadProber(workload, 0)
    prober._learn_acked_times()
    assert prober.acked_times == {P: [BASE_MS]}
    for _ in range(20):
        acked, random_time = prober.times_to_ask(P)
        assert acked in (BASE_MS, BASE_MS + 1)
        assert random_time >= BASE_MS - RANDOM_MARGIN_MS
    assert len(prober.times_to_ask("t/0-1")) == 1  # nothing acked there yet: a random time only


def test_a_campaign_setup_may_ask_for_time_reads_and_the_default_plan_does_not():
    from chaos.campaign import Setup, plan

    assert not any(setup.time_reads for setup in plan(16, 1000))
    setup = Setup(0, 1000, "sync", 1, 1, True, time_reads=True)
    assert "--time-reads" in setup.command(30.0, Path("/tmp/c"), 3) and "time reads" in setup.label
    assert "--time-reads" not in Setup(0, 1000, "sync", 1, 1, True).command(30.0, Path("/tmp/c"), 3)


def test_run_accepts_time_reads_and_repeats_it_on_its_command_line(tmp_path):
    import argparse

    from chaos import runner

    parser = argparse.ArgumentParser()
    runner.add_parser(parser.add_subparsers())
    args = parser.parse_args(["run", "--scenario", "kill-master", "--time-reads"])
    run = runner.run_of(args, tmp_path)
    assert run.history.meta["time_reads"] is True and "--time-reads" in run.command_line()
    args = parser.parse_args(["run", "--scenario", "random"])
    assert runner.run_of(args, tmp_path).history.meta["time_reads"] is False  # off in random too
