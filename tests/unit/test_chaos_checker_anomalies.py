"""Catch tests for the Kafka workload's anomaly checks (chaos/anomalies.py): each anomaly is
planted in a hand-built history and caught by its check; the clean history (and each
allowed look-alike: a redelivery after a rebalance, a read-committed consumer passing over
an aborted transaction, ...) passes."""

from __future__ import annotations

import pytest

from chaos import anomalies
from chaos.checker import check
from metaq.record import encode_record
from metaq.txn.control import CONTROL_ATTRIBUTE
from tests.unit.test_chaos_checker import Run, failing

PARTS = ("t/0-0", "t/0-1")


class Kafka(Run):
    """A ``Run`` that also writes transactions and control records and records consumers."""

    def __init__(self, mode: str = "sync", partitions: tuple[str, ...] = PARTS) -> None:
        super().__init__(mode, partitions)
        self.records: dict[str, list[tuple[int, str]]] = {p: [] for p in partitions}
        self.aborted: set[str] = set()

    def append(self, partition: str, value: str, control: bool = False) -> int:
        offset = len(self.logs[partition])
        attribute = CONTROL_ATTRIBUTE if control else None
        data = value.encode()
        self.logs[partition] += encode_record(data, attribute, msg_id=next(self.msg_ids))
        self.records[partition].append((offset, "control:" + data.hex() if control else value))
        return offset

    def txn(self, name: str, sends, outcome: str = "ok", during=None, reads=None) -> dict:
        """A transaction by ``t0``: its sends, then ``during()`` (before commit), then the outcome
        and one control marker per partition it wrote."""
        op = self.h.invoke("t0", "txn", txn=name)
        done = [[p, self.append(p, v), v] for p, v in sends]
        if during is not None:
            during(done)
        commit_time = self.h.now()
        for p in sorted({p for p, _o, _v in done}):
            self.append(p, f"marker-{name}", control=True)
        fields = {"sends": done, "reads": reads or {}}
        if outcome == "ok":
            return self.h.ok(op, commit_time=commit_time, **fields)
        self.aborted |= {v for _p, _o, v in done}
        return self.h.fail(op, "rolled back", **fields)

    def visible(self, partition: str) -> list[tuple[int, str]]:
        """What a read-committed consumer is given: no control record, no aborted message."""
        return [(o, v) for o, v in self.records[partition] if not v.startswith("control:") and v not in self.aborted]

    def consume(self, process: str = "g0-c0", group: str = "g0", generation: int = 1, polls=None) -> None:
        """One assignment of both partitions and two polls of each (the visible log, halved)."""
        self.h.assign(process, group, generation, PARTS)
        for p in PARTS:
            vis = self.visible(p)
            for batch in polls(p, vis) if polls is not None else (vis[: len(vis) // 2], vis[len(vis) // 2:]):
                self.h.poll(process, group, generation, {p: batch})


def writes() -> Kafka:
    k = Kafka()
    for i in range(6):
        k.put(f"p0-{i}", partition=PARTS[i % 2])
    k.txn("T1", [("t/0-0", "t1-a"), ("t/0-0", "t1-b"), ("t/0-1", "t1-c")])
    k.txn("T2", [("t/0-1", "t2-a")], outcome="fail")
    k.txn("T3", [("t/0-0", "t3-a")])
    k.put("p0-6", partition="t/0-1")
    return k


def clean(drained: bool = True, polls=None) -> Kafka:
    k = writes()
    k.consume(polls=polls)
    if drained:
        k.h.group_drained("g0")
    for p in PARTS:
        k.read(p, k.records[p])  # a raw read (read uncommitted): every record, markers included
    return k


def verdict(k: Kafka):
    return check(k.finish())


def test_the_clean_history_passes_and_every_anomaly_check_looks_at_it():
    result = verdict(clean())
    assert result.ok, result.report()
    for name in anomalies.CHECKS:
        # topic-ops looks at topic operations, which this history has none of (tests/unit/test_chaos_topic_ops.py).
        if name not in ("G1c", "topic-ops"):
            assert result.checks[name]["checked"] > 0, name
        assert not result.checks[name]["expected"], name
    assert result.checks["G1c"]["checked"] > 0  # T1, T3 and the polls that read them


def test_the_report_shows_every_anomaly_count():
    result = verdict(clean())
    line = next(x for x in result.report().splitlines() if "anomalies:" in x)
    for name in ["lost-write", *anomalies.CHECKS]:
        assert f"{name} 0" in line, name
    assert result.stats["anomalies"] == {name: 0 for name in ["lost-write", *anomalies.CHECKS]}


def test_lost_write_is_counted_under_its_jepsen_name():
    k = clean()
    offset = k.put("p0-lost")
    del k.logs["t/0-0"][offset:]
    result = verdict(k)
    assert result.stats["anomalies"]["lost-write"] == 1 and "lost-write 1" in result.report()


def test_unseen_acked_message_is_caught_when_the_group_ran_to_the_end():
    def last_message_never_delivered(p, vis):
        return (vis[: len(vis) // 2], vis[len(vis) // 2: -1] if p == "t/0-1" else vis[len(vis) // 2:])

    result = verdict(clean(polls=last_message_never_delivered))
    assert failing(result) == {"unseen"}
    (v,) = result.violations("unseen")
    assert v["value"] == "p0-6" and v["group"] == "g0"
    # A group that did not run to the end may not have got that far.
    assert verdict(clean(drained=False, polls=last_message_never_delivered)).ok


def test_duplicate_delivery_within_one_assignment_is_caught():
    result = verdict(clean(polls=lambda p, vis: (vis[:2], vis[1:])))
    assert "duplicate" in failing(result) and failing(result) <= {"duplicate", "nonmonotonic-poll"}
    assert result.violations("duplicate")[0]["generation"] == 1


def _consumer_given_a_resent_put_stored_twice(producers: dict) -> Kafka:
    """A put whose first attempt's reply was lost: resent, stored at two offsets, and the
    group's consumer is given both copies in one assignment."""
    k = writes()
    k.h.meta["producers"] = producers
    k.append("t/0-0", "r0-dup")  # the first attempt, stored although its reply was lost
    op = k.h.invoke("r0", "put", "r0-dup", "t/0-0")
    offset = k.append("t/0-0", "r0-dup")  # the resend, stored again
    k.h.ok(op, offset=offset, epoch=1, master="meta://m0", attempts=2, resent_after_unknown=1)
    k.consume()
    k.h.group_drained("g0")
    for p in PARTS:
        k.read(p, k.records[p])
    return k


def test_two_stored_copies_of_a_resent_put_are_expected_deliveries_under_at_least_once():
    result = verdict(_consumer_given_a_resent_put_stored_twice({"idempotent": False, "retry_unknown": True}))
    assert result.ok, result.report()
    (case,) = result.checks["duplicate"]["expected"]
    assert case["value"] == "r0-dup" and case["offsets"][0] != case["offsets"][1]
    # Exactly once: the same deliveries are still expected of the consumer (it was given what
    # was stored), and the storage itself is the violation.
    exactly_once = verdict(_consumer_given_a_resent_put_stored_twice({"idempotent": True, "retry_unknown": True}))
    assert failing(exactly_once) == {"duplicates"}


@pytest.mark.parametrize("process, start", [("g0-c1", 1), ("g0-c0", 3)], ids=["redelivers", "skips-ahead"])
def test_a_new_assignment_may_redeliver_or_start_elsewhere(process, start):
    """Generation 2 (a rebalance, a crash, a restart) starts again from the committed
    offset: a redelivery is no duplicate, a start past the last poll is no skip."""
    k = clean()
    k.h.assign(process, "g0", 2, PARTS)
    k.h.poll(process, "g0", 2, {"t/0-0": k.visible("t/0-0")[start:]})
    assert verdict(k).ok


def test_two_values_at_one_offset_are_caught():
    k = clean()
    offset, _value = k.records["t/0-0"][0]
    k.read("t/0-0", [(offset, "p9-other")])
    result = verdict(k)
    assert "inconsistent-offsets" in failing(result)
    (v,) = result.violations("inconsistent-offsets")
    assert v["offset"] == offset and "p9-other" in v["values"]


@pytest.mark.parametrize("lag, expected", [({"messages": 1}, True), ({"messages": 0, "bytes": 0}, False)],
                         ids=["inside-its-lag", "lag-zero"])
def test_async_offset_rewritten_across_a_failover_is_expected_only_inside_its_lag(lag, expected):
    # Before: any later failover of the group excused the rewritten offset, whatever its lag
    # (the anomaly check's own allowance passed unchecked). The lag window decides now.
    k = Kafka("async")
    old = k.h.invoke("p0", "put", "p0-old", "t/0-0")
    k.h.ok(old, offset=0, epoch=1, master="meta://m0")  # acked by the old master ...
    k.read("t/0-0", [(0, "p0-old")])
    k.h.failover(0, "meta://m0", "meta://s1", 2, lag={"t/0-0": lag})  # ... and taken back by the failover
    first = k.put("p0-a", epoch=2, master="meta://s1")
    k.read("t/0-0", [(first, "p0-a")])
    check_ = verdict(k).checks["inconsistent-offsets"]
    assert check_["ok"] is expected and len(check_["expected"]) == int(expected)


@pytest.mark.parametrize("ticks_before_recorded", [0, 2], ids=["seen-late", "long-after"])
def test_async_a_failover_recorded_after_what_it_explains_explains_it_inside_its_lag(ticks_before_recorded):
    # Campaign seed 3026: a reader got the new master's record at an offset 0.04 s before the
    # monitor recorded the failover that took the old value back. What decides is the lag
    # window: the old value's ack and read are what the failover took back.
    k = Kafka("async")
    old = k.h.invoke("p0", "put", "p0-old", "t/0-0")
    k.h.ok(old, offset=0, epoch=1, master="meta://m0")
    k.read("t/0-0", [(0, "p0-old")])
    first = k.append("t/0-0", "marker-new", control=True)  # the new master's first record, read before ...
    k.read("t/0-0", [(first, k.records["t/0-0"][-1][1])])
    for _ in range(ticks_before_recorded):
        k.h.now()
    k.h.failover(0, "meta://m0", "meta://s1", 2, lag={"t/0-0": {"messages": 1}})  # ... the failover is recorded
    check_ = verdict(k).checks["inconsistent-offsets"]
    assert check_["ok"] and len(check_["expected"]) == 1


def test_async_a_group_that_read_past_records_a_failover_took_back_misses_what_replaced_them_expectedly():
    # Campaign seed 3026: the group read offsets an async failover then took back (A3) and
    # committed past them; the new master's messages at those offsets were never delivered.
    # What the group had not read past is still due.
    k = Kafka("async")
    old = k.h.invoke("p0", "put", "p0-old", "t/0-0")
    k.h.ok(old, offset=0, epoch=1, master="meta://m0")
    k.h.assign("g0-c0", "g0", 1, PARTS)
    k.h.poll("g0-c0", "g0", 1, {"t/0-0": [(0, "p0-old")]})
    size = len(encode_record(b"p0-old"))
    k.h.failover(0, "meta://m0", "meta://s1", 2, {"t/0-0": {"messages": 1, "bytes": size}})
    k.put("p0-a", epoch=2, master="meta://s1")  # at offset 0: the group's position is past it
    k.put("p0-b", epoch=2, master="meta://s1")  # past what the group read: due
    k.h.group_drained("g0")
    check_ = verdict(k).checks["unseen"]
    assert [v["value"] for v in check_["violations"]] == ["p0-b"]
    assert [v["value"] for v in check_["expected"]] == ["p0-a"]


def test_poll_skip_is_caught():
    skip_one = lambda p, vis: (vis[:2], vis[3:]) if p == "t/0-0" else (vis,)  # noqa: E731
    result = verdict(clean(drained=False, polls=skip_one))
    assert failing(result) == {"poll-skip"}
    (v,) = result.violations("poll-skip")
    assert [value for _o, value in v["skipped"]] == ["p0-4"]


def test_passing_over_aborted_and_control_records_is_no_skip():
    # t/0-1 holds T2's aborted message and markers between visible messages: the clean
    # consumer's polls pass over them (split right there).
    k = clean(drained=False, polls=lambda p, vis: [[x] for x in vis])
    result = verdict(k)
    assert result.ok, result.report()
    assert result.checks["poll-skip"]["checked"] >= 8


def test_nonmonotonic_poll_is_caught():
    result = verdict(clean(polls=lambda p, vis: (vis[len(vis) // 2:], vis[: len(vis) // 2])))
    assert failing(result) == {"nonmonotonic-poll"}
    assert len(result.violations("nonmonotonic-poll")) == 2  # one per partition


def acked_backwards(second_process: str) -> tuple[Kafka, int, int]:
    """Two concurrent puts to one partition, the later one (by ``second_process``) acked first."""
    k = clean(drained=False)
    first = k.h.invoke("p0", "put", "p0-n1", "t/0-0")
    second = k.h.invoke(second_process, "put", f"{second_process}-n2", "t/0-0")
    o1, o2 = k.append("t/0-0", "p0-n1"), k.append("t/0-0", f"{second_process}-n2")
    k.h.ok(second, offset=o2, epoch=1, master="meta://m0")
    k.h.ok(first, offset=o1, epoch=1, master="meta://m0")  # acked after, at a lower offset
    return k, o1, o2


def test_nonmonotonic_send_is_caught():
    k, o1, o2 = acked_backwards("p0")
    result = verdict(k)
    assert failing(result) == {"nonmonotonic-send"}
    assert result.violations("nonmonotonic-send")[0]["offsets"] == [o2, o1]


def test_sends_of_two_producers_may_interleave():
    k, _o1, _o2 = acked_backwards("p1")
    assert verdict(k).ok


def test_skip_inside_one_poll_is_caught():
    result = verdict(clean(drained=False, polls=lambda p, vis: (vis[:1] + vis[2:],)))
    assert failing(result) == {"int-poll-skip"}
    assert len(result.violations("int-poll-skip")) == 2


def test_raw_read_missing_a_marker_is_an_internal_skip():
    k = clean()
    markers = [r for r in k.records["t/0-1"] if r[1].startswith("control:")]
    k.read("t/0-1", [r for r in k.records["t/0-1"] if r != markers[0]])
    result = verdict(k)
    assert failing(result) == {"int-poll-skip"}


def test_backwards_inside_one_poll_is_caught():
    def swapped(p, vis):
        return ([vis[1], vis[0], *vis[2:]],)

    result = verdict(clean(polls=swapped))
    # Going back also passes over the message it went back to (Jepsen reports both too).
    assert failing(result) == {"int-nonmonotonic-poll", "int-poll-skip"}
    assert all(v["offsets"][1] < v["offsets"][0] for v in result.violations("int-nonmonotonic-poll"))


def test_read_before_commit_is_caught():
    k = writes()

    def peek(done):
        k.h.poll("g1-c0", "g1", 1, {"t/0-0": [(done[0][1], done[0][2])]})

    k.txn("T4", [("t/0-0", "t4-a")], during=peek)
    result = verdict(k)
    assert failing(result) == {"precommitted-read"}
    assert result.violations("precommitted-read")[0]["value"] == "t4-a"


def test_transaction_reading_its_own_write_is_caught():
    k = writes()
    offset = len(k.logs["t/0-1"])
    k.txn("T4", [("t/0-1", "t4-a")], reads={"t/0-1": [[offset, "t4-a"]]})
    result = verdict(k)
    assert failing(result) == {"precommitted-read"}


def test_read_after_commit_is_fine():
    k = writes()
    k.h.poll("g1-c0", "g1", 1, {"t/0-0": [r for r in k.visible("t/0-0") if r[1].startswith("t1")]})
    assert verdict(k).ok


def test_aborted_read_is_caught():
    k = writes()
    (aborted,) = [r for r in k.records["t/0-1"] if r[1] == "t2-a"]
    k.h.poll("g1-c0", "g1", 1, {"t/0-1": [aborted]})
    result = verdict(k)
    assert failing(result) == {"aborted-read"}
    assert result.violations("aborted-read")[0]["writer"]["txn"] == "T2"


def test_torn_transaction_is_an_intermediate_read():
    k = writes()
    vis = [r for r in k.visible("t/0-0") if r[1] != "t1-b"]  # T1's first message, not its second
    k.h.poll("g1-c0", "g1", 1, {"t/0-0": vis})
    result = verdict(k)
    assert "intermediate-read" in failing(result)
    assert failing(result) <= {"intermediate-read", "int-poll-skip"}
    assert result.violations("intermediate-read")[0]["txn"] == "T1"


def test_reading_part_of_a_transaction_before_its_end_is_fine():
    k = writes()
    vis = k.visible("t/0-0")
    upto = next(i for i, r in enumerate(vis) if r[1] == "t1-a")
    k.h.poll("g1-c0", "g1", 1, {"t/0-0": vis[: upto + 1]})  # the batch ends inside T1
    assert verdict(k).ok


def cross_reads(both: bool) -> Kafka:
    """T5 and T6 (consume-transform-produce) each read what the other wrote, if ``both``."""
    k = writes()
    t5 = k.h.invoke("t5", "txn", txn="T5")
    t6 = k.h.invoke("t6", "txn", txn="T6")
    a, b = k.append("t/0-0", "t5-a"), k.append("t/0-1", "t6-b")
    c5, c6 = k.h.now(), k.h.now()
    k.h.ok(t6, sends=[["t/0-1", b, "t6-b"]], commit_time=c6,
           reads={"t/0-0": [[a, "t5-a"]]} if both else {})
    k.h.ok(t5, sends=[["t/0-0", a, "t5-a"]], commit_time=c5, reads={"t/0-1": [[b, "t6-b"]]})
    return k


def test_wr_cycle_is_g1c():
    result = verdict(cross_reads(both=True))
    assert "G1c" in failing(result)
    assert sorted(result.violations("G1c")[0]["txns"]) == ["T5", "T6"]
    assert verdict(cross_reads(both=False)).checks["G1c"]["ok"]


def test_interleaved_transactions_pass_and_g0_is_no_check():
    # Kafka-style transactions do not isolate writes: T7 and T8 interleave in both partitions
    # (a ww cycle). The check that could only count such cycles, never fail, is gone.
    k = writes()
    t7 = k.h.invoke("t7", "txn", txn="T7")
    t8 = k.h.invoke("t8", "txn", txn="T8")
    sends7 = [["t/0-0", k.append("t/0-0", "t7-a"), "t7-a"]]
    sends8 = [["t/0-0", k.append("t/0-0", "t8-a"), "t8-a"], ["t/0-1", k.append("t/0-1", "t8-b"), "t8-b"]]
    sends7.append(["t/0-1", k.append("t/0-1", "t7-b"), "t7-b"])
    k.h.ok(t7, sends=sends7, commit_time=k.h.now())
    k.h.ok(t8, sends=sends8, commit_time=k.h.now())
    for p in PARTS:
        k.read(p, k.records[p])
    result = verdict(k)
    assert result.ok, result.report()
    assert "G0" not in result.checks and "G0" not in result.report()


@pytest.mark.parametrize("name", sorted(anomalies.CHECKS))
def test_every_check_is_listed_in_docs(name):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "chaos.md").read_text()
    assert f"`{name}`" in doc


# --- the consumer-group workload's records (chaos/group_consumer.py) ---------------------------


def test_member_records_merge_into_the_history_in_time_order():
    k = writes()
    t = k.h.now()  # after every commit
    k.put("p0-late")  # two more ops on the runner's side, at t + 1 and t + 2
    vis = k.visible("t/0-0")[:-1]
    records = [  # as two members wrote them: file by file, each in its own order
        ("g0-c1.1", {"f": "assign", "time": t + 0.5, "generation": 1, "partitions": ["t/0-0"]}),
        ("g0-c1.1", {"f": "poll", "time": t + 0.6, "generation": 1, "partition": "t/0-0", "pairs": vis[:2]}),
        ("g0-c1.1", {"f": "poll", "time": t + 2.5, "generation": 1, "partition": "t/0-0", "pairs": vis[3:]}),
        ("g0-c0.0", {"f": "poll", "time": t + 1.5, "generation": 1, "partition": "t/0-1", "pairs": k.visible("t/0-1")}),
    ]
    k.h.merge_consumer_records("g0", records)
    times = [op["time"] for op in k.h.ops]
    assert times == sorted(times)
    polls = [op for op in k.h.ops if op.get("f") == "poll" and op["type"] == "ok"]
    assert [op["process"] for op in polls] == ["g0-c1.1", "g0-c0.0", "g0-c1.1"]
    # p0-late's invocation (t + 1) and completion (t + 2) keep their places among them.
    assert [op["f"] for op in k.h.ops[-10:]] == ["assign", "assign", "poll", "poll", "put", "poll", "poll", "put",
                                                 "poll", "poll"]
    assert all(op["group"] == "g0" and op["isolation"] == "read_committed" for op in polls)
    assert failing(verdict(k)) == {"poll-skip"}  # g0-c1.1 passed over vis[2]


def test_the_group_ran_to_the_end_when_it_got_each_partitions_last_committed_message():
    from chaos.group_consumer import unreached

    k = clean()
    k.finish()
    assert unreached(k.h, "g0") == []  # t/0-1 ends with T2's rolled-back message: never given
    assert unreached(k.h, "other") == list(PARTS)
    k2 = clean(polls=lambda p, vis: (vis[:-1],))
    k2.finish()
    assert unreached(k2.h, "g0") == list(PARTS)


@pytest.mark.parametrize("recorded", [True, False])
def test_a_rolled_back_send_that_gave_up_but_was_stored_is_no_phantom_and_no_skip(recorded: bool):
    """chaos/transactions.py ``send_values``: a send that raised (no reply in time) may still be
    stored; the transaction is then rolled back. Recorded as ``[None, None, value]`` the checker
    knows the value and its abort; before (nothing recorded: a hosts-mode campaign run, seed
    2007), the stored copy was a phantom and the consumer's correct skip of it a poll-skip."""
    k = writes()
    op = k.h.invoke("t0", "txn", txn="T5")
    k.append("t/0-0", "t5-a")
    k.append("t/0-0", "marker-T5", control=True)
    k.aborted.add("t5-a")
    k.h.fail(op, "rolled back after: gave up", sends=[[None, None, "t5-a"]] if recorded else [], reads={})
    k.put("p0-7", partition="t/0-0")  # read after it: passing over it is judged
    k.consume()
    k.h.group_drained("g0")
    result = verdict(k)
    if recorded:
        assert result.ok, result.report()
    else:
        failed = {name for name, c in result.checks.items() if c["violations"]}
        assert "phantoms" in failed and failed & {"poll-skip", "int-poll-skip"}, failed
