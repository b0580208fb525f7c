"""The checker's verdict on synthetic histories it used to get wrong: each case here passed
(or failed) before for a reason the guarantees do not give, and gets the right verdict now.

Async excuses are judged one by one against a failover's lag window (a lost ack, every
excused read, a group's unseen message); a run where nothing worked, a crashed workload,
a master fault without a failover or a settle failure fails the one verdict that the run,
``python -m chaos check`` and the campaign share; an outcome-unknown transaction is judged
by its marker in the final logs; V9's transaction exemption covers only reads above the
transaction's first record."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from chaos.checker import check
from chaos.history import History
from metaq.record import encode_record
from metaq.txn.control import AbortReason, Control, Kind, encode_body, encode_control, frame_batch, marker
from tests.unit.test_chaos_checker import BOUND, Run, TimedRun, clean, failing
from tests.unit.test_chaos_checker_anomalies import PARTS, Kafka


# --- 1. a lost async ack needs the failover that took it back ---------------------------


def test_an_ack_of_the_new_master_lost_after_the_only_failover_is_a_violation():
    """Before: 1 lost ack <= the failover's lag of 3 messages, so it passed, although the
    failover came before the ack and the ack was made in the failover's own epoch."""
    run = clean("async")
    run.h.failover(0, "meta://m0", "meta://s1", 2, lag={"t/0-0": {"messages": 3}})
    for _ in range(5):
        run.h.now()  # 5 s later
    offset = run.put("p0-new", epoch=2, master="meta://s1")
    del run.logs["t/0-0"][offset:]
    result = check(run.finish())
    assert failing(result) == {"async_loss_bound"}
    (v,) = result.violations("async_loss_bound")
    assert v["kind"] == "loss_not_excused" and v["offset"] == offset and v["epoch"] == 2
    assert v["failover"] is None  # no failover after the ack to compare it with
    assert f"t/0-0@{offset} in epoch 2" in v["why"]


def test_a_lost_ack_below_the_failovers_lag_window_is_a_violation():
    """p0-l1 is lost, but an ack of the same epoch after it is still at its offset: the new
    master's log went past p0-l1, so this failover did not take it back."""
    run = clean("async")
    lost = run.put("p0-l1")
    kept_value = "p0-l2"
    run.put(kept_value)
    # p0-l1's record is overwritten in place by other bytes of the same size (p0-x1).
    log = run.logs["t/0-0"]
    size = len(encode_record(b"p0-l1"))
    log[lost:lost + size] = encode_record(b"p0-x1", msg_id=999)
    run.put("p0-x1", outcome="info", write=False)  # so p0-x1 is no phantom
    run.h.failover(0, "meta://m0", "meta://s1", 2, lag={"t/0-0": {"messages": 5, "bytes": 5 * size}})
    result = check(run.finish())
    (v,) = result.violations("async_loss_bound")
    assert v["kind"] == "loss_not_excused" and v["offset"] == lost and v["epoch"] == 1
    assert v["failover"]["epoch"] == 2 and "took back offsets" in v["why"]


def test_a_lost_ack_a_failover_deposing_its_epoch_took_back_inside_its_lag_passes():
    run = clean("async")
    start = len(run.logs["t/0-0"])
    for i in range(2):
        run.put(f"p0-l{i}")
    size = len(run.logs["t/0-0"]) - start
    del run.logs["t/0-0"][start:]
    run.h.failover(0, "meta://m0", "meta://s1", 2, lag={"t/0-0": {"messages": 2, "bytes": size}})
    run.put("p0-new", epoch=2, master="meta://s1")
    assert check(run.finish()).ok


# --- 2. every excused read, polls included, inside a lag window -------------------------


def _poll_of_a_rewritten_offset(lag: dict) -> History:
    """A consumer polled p0-old at offset 0; a later failover (``lag``); the final log has p0-a there."""
    k = Kafka("async")
    size = len(encode_record(b"p0-old"))
    k.h.assign("g0-c0", "g0", 1, PARTS)
    k.h.poll("g0-c0", "g0", 1, {"t/0-0": [(0, "p0-old")]})
    old = k.h.invoke("p0", "put", "p0-old", "t/0-0")
    k.h.info(old, "timeout")
    k.h.failover(0, "meta://m0", "meta://s1", 2, lag={"t/0-0": {**lag, "bytes": lag["messages"] * size}})
    first = k.put("p0-a", epoch=2, master="meta://s1")
    k.read("t/0-0", [(first, "p0-a")])
    return k.finish()


def test_a_poll_of_a_record_a_failover_with_no_lag_took_back_is_a_violation():
    """Before: read_lost looked at raw gets only, and inconsistent-offsets' own allowance (any
    failover after the first observation) passed the poll unchecked."""
    result = check(_poll_of_a_rewritten_offset({"messages": 0}))
    assert {"read_lost", "inconsistent-offsets"} <= failing(result)
    (v,) = result.violations("read_lost")
    assert v["f"] == "poll" and v["value"] == "p0-old" and v["final_there"] == "p0-a"


def test_a_poll_of_a_record_a_failover_took_back_inside_its_lag_is_expected():
    result = check(_poll_of_a_rewritten_offset({"messages": 1}))
    assert result.ok, result.report()
    assert len(result.checks["read_lost"]["expected"]) == 1
    assert result.stats["async_reads_taken_back"] == 1


# --- 2b. skips and aborted reads beside reads a failover took back -------------------------


def _reads_of_a_log_a_failover_then_cut(kept_below: bool, as_polls: bool, ticks_before_failover: int = 4) -> History:
    """Campaign seeds 8000 and 8001's shape. The old master m0 holds p0-kept (acked in epoch 1,
    and with ``kept_below`` p0-kept2 after it) and then p0-big-..., p0-next, which no slave
    fetched. A reader gets two records beside each other in m0's log: one fetch
    (``as_polls`` False) or the last record of a consumer's poll and the first of its next
    (True). Seconds later (``ticks_before_failover``) s1 takes over in epoch 2 lacking them
    and acks shorter messages there: a record of the final log now starts between the two
    the reader got, or (``kept_below``) the reader passed over p0-kept2, which both logs hold."""
    k = Kafka("async")
    k.put("p0-kept")
    kept2 = k.put("p0-kept2") if kept_below else None
    start = len(k.logs["t/0-0"])
    old = [(k.put(value, outcome="info"), value) for value in ("p0-big-" + "x" * 60, "p0-next")]
    lag = {"messages": 2, "bytes": len(k.logs["t/0-0"]) - start}
    del k.logs["t/0-0"][start:]
    edges = [(kept2, "p0-kept2") if kept_below else old[0], old[1]] if not kept_below else [(0, "p0-kept"), old[0]]
    if as_polls:
        k.h.assign("g0-c0", "g0", 1, PARTS)
        for edge in edges:
            k.h.poll("g0-c0", "g0", 1, {"t/0-0": [edge]})
    else:
        k.read("t/0-0", edges, replica="meta://m0")
    for _ in range(ticks_before_failover):
        k.h.now()  # a loaded machine: the failover is recorded seconds after the reads
    k.h.failover(0, "meta://m0", "meta://s1", 2, lag={"t/0-0": lag})
    for i in range(4):
        k.put(f"p0-new{i}", epoch=2, master="meta://s1")
    return k.finish()


@pytest.mark.parametrize("as_polls, check_name", [(False, "int-poll-skip"), (True, "poll-skip")])
def test_a_skip_beside_reads_a_failover_took_back_is_expected_inside_its_lag_whenever_it_was_recorded(
        as_polls, check_name):
    """Before: a skip was excused only by a failover recorded within 1 s of the reads; at a
    load average of 30-40 the failover was recorded 1.4-3 s after them (seeds 8000, 8001:
    int-poll-skip 25 and 9, poll-skip 3), though read_lost excused the same reads by its lag
    window. The lag window decides now, and the excuse names the failover."""
    result = check(_reads_of_a_log_a_failover_then_cut(kept_below=False, as_polls=as_polls))
    assert result.ok, result.report()
    (case,) = result.checks[check_name]["expected"]
    assert case["taken_back_by"].startswith("the failover at ") and "to epoch 2" in case["taken_back_by"]
    assert [v for _o, v in case["skipped"]] == ["p0-new1", "p0-new2", "p0-new3"]


@pytest.mark.parametrize("as_polls, check_name", [(False, "int-poll-skip"), (True, "poll-skip")])
def test_a_skip_of_a_record_both_logs_hold_is_a_violation_beside_a_read_a_failover_took_back(as_polls, check_name):
    """Just outside the rule: the reader passed over p0-kept2, below where the new master's
    log diverged (both logs hold it); the read after the gap is one the failover took back,
    which read_lost expects, but no failover explains passing over p0-kept2."""
    result = check(_reads_of_a_log_a_failover_then_cut(kept_below=True, as_polls=as_polls, ticks_before_failover=0))
    assert failing(result) == {check_name}
    (v,) = result.violations(check_name)
    assert [value for _o, value in v["skipped"]] == ["p0-kept2"]
    assert len(result.checks["read_lost"]["expected"]) == 1


def test_a_skip_in_a_fetch_of_the_final_log_is_a_violation_whatever_failover_came_right_after():
    """Before: a failover recorded within 1 s after a fetch excused any skip in it whose skipped
    records lay in some lag window, though the fetch read only records of the final log."""
    k = Kafka("async")
    k.put("p0-kept")
    start = len(k.logs["t/0-0"])
    k.put("p0-gone-" + "x" * 60, outcome="info")  # its lag window holds p0-new0 and p0-new1
    lag = {"messages": 1, "bytes": len(k.logs["t/0-0"]) - start}
    del k.logs["t/0-0"][start:]
    new = [(k.put(f"p0-new{i}", epoch=2, master="meta://s1"), f"p0-new{i}") for i in range(3)]
    k.read("t/0-0", [new[0], new[2]])  # passes over p0-new1 on the new master
    k.h.failover(0, "meta://m0", "meta://s1", 2, lag={"t/0-0": lag})
    result = check(k.finish())
    assert failing(result) == {"int-poll-skip"}
    assert "taken_back_by" not in result.violations("int-poll-skip")[0]


def _commit_a_failover_took_back(client: str = "ok", commit_read: bool = True, put_after: bool = True) -> History:
    """Seed 8000's xa0-t353 and x0-t392: transaction u1 (producer 7, txid "x0") stores u1-a in
    t/0-0; the old master m0 appends its COMMIT marker, which no slave fetched, and its client
    is told ``client``; a raw reader gets the marker (``commit_read``) and a read-committed
    consumer gets u1-a from m0. s1 takes over lacking the marker and aborts the transaction
    (ABORT where the COMMIT was), then acks a put of its own. Without ``put_after``, u1-a stays
    the partition's last message and the group polled only p0-0 (it read on at the new master)."""
    k = Kafka("async")
    k.put("p0-0")
    op = k.h.invoke("x0", "txn", txn="u1")
    log = k.logs["t/0-0"]
    record = encode_record(b"u1-a", msg_id=50)
    batch = frame_batch(record, 1, producer_id=7, producer_epoch=0, first_seq=0, timestamp_ms=1, txid="x0")
    at = len(log) + len(batch) - len(record)
    log += batch
    commit_at = len(log)
    commit = Control(Kind.COMMIT, 7, 0, 2, "x0")
    log += encode_control(commit)
    commit_time = k.h.now()
    getattr(k.h, client)(op, **({} if client == "ok" else {"error": "rolled back"}), sends=[["t/0-0", at, "u1-a"]],
                         commit_time=commit_time)
    if commit_read:
        k.read("t/0-0", [(commit_at, "control:" + encode_body(commit).hex())], replica="meta://m0")
    k.h.assign("g0-c0", "g0", 1, PARTS)
    k.h.poll("g0-c0", "g0", 1, {"t/0-0": [(0, "p0-0")] + ([(at, "u1-a")] if put_after else [])})
    lag = {"messages": 1, "bytes": len(log) - commit_at}
    del log[commit_at:]
    for _ in range(3):
        k.h.now()
    k.h.failover(0, "meta://m0", "meta://s1", 2, lag={"t/0-0": lag})
    log += marker(Kind.ABORT, "x0", producer_id=7, producer_epoch=0, timestamp_ms=3, reason=AbortReason.FAILOVER)
    if put_after:
        k.put("p0-new", epoch=2, master="meta://s1")
    return k.finish()


def test_a_read_of_a_transaction_whose_commit_marker_a_failover_took_back_is_expected_inside_its_lag():
    """Before: an aborted-read (seed 8000: 12 reads of xa0-t353 and x0-t392, "whose
    transaction failed"): the client had been told committed, the reader read the old
    master's log where the COMMIT marker was, and the failover that took the marker back
    inside its lag aborted the transaction, which async_loss_bound and read_lost excuse."""
    result = check(_commit_a_failover_took_back())
    assert result.ok, result.report()
    (case,) = result.checks["aborted-read"]["expected"]
    assert case["value"] == "u1-a" and "to epoch 2" in case["taken_back_by"]
    assert "its client was told committed" in case["why"]


def test_a_group_ran_to_the_end_without_a_committed_transactions_message_the_new_master_aborted():
    """Before: a settle failure (seed 8114: "never got the last message of txn-b/1-0", whose
    only message was x1-t0-0): the client was told committed, the failover took back the COMMIT
    marker and the new master aborted the transaction, so a read-committed group is never given
    the partition's last message."""
    from chaos.group_consumer import unreached

    history = _commit_a_failover_took_back(commit_read=False, put_after=False)
    assert unreached(history, "g0") == []


@pytest.mark.parametrize("client, commit_read", [("ok", False), ("fail", True)],
                         ids=["commit-marker-never-read", "client-told-it-failed"])
def test_an_aborted_read_without_a_commit_marker_a_failover_took_back_or_of_a_failed_transaction_is_a_violation(
        client, commit_read):
    """Just outside the rule: no reader got a COMMIT marker of it (nothing shows the old
    master had committed it); or its client was told it failed while its COMMIT marker was
    served (a definite failure must mean not committed)."""
    result = check(_commit_a_failover_took_back(client=client, commit_read=commit_read))
    assert "aborted-read" in failing(result)
    assert not result.checks["aborted-read"]["expected"]


# --- 3. unseen: only inside a failover's lag window -------------------------------------


def test_one_taken_back_record_no_longer_excuses_a_skip_of_an_earlier_message():
    """Before: the group read a taken-back record at a high offset, so every message below it
    that the group never got was excused, here p0-early, far below the failover's window."""
    k = Kafka("async")
    early = k.put("p0-early")  # never delivered to the group: a real skip
    k.put("p0-kept")
    start = len(k.logs["t/0-0"])
    k.h.assign("g0-c0", "g0", 1, PARTS)
    k.h.poll("g0-c0", "g0", 1, {"t/0-0": [(start - len(encode_record(b"p0-kept")), "p0-kept"),
                                          (start, "p0-gone")]})
    gone = k.h.invoke("p0", "put", "p0-gone", "t/0-0")
    k.h.info(gone, "timeout")
    size = len(encode_record(b"p0-gone"))
    k.h.failover(0, "meta://m0", "meta://s1", 2, lag={"t/0-0": {"messages": 1, "bytes": size}})
    k.put("p0-new", epoch=2, master="meta://s1")  # at p0-gone's offset, inside the window: expected
    k.h.group_drained("g0")
    check_ = check(k.finish()).checks["unseen"]
    assert [v["value"] for v in check_["violations"]] == ["p0-early"]
    assert check_["violations"][0]["offset"] == early
    assert [v["value"] for v in check_["expected"]] == ["p0-new"]


# --- 4. minimum progress ----------------------------------------------------------------


def test_an_empty_history_fails():
    history = History({"mode": "sync"})
    result = check(history)
    assert not result.ok and "progress" in failing(result)
    assert {v["workload"] for v in result.violations("progress")} == {"puts", "reads"}


def test_a_run_with_no_acked_put_fails():
    run = Run()
    run.put("p0-u", outcome="info", write=False)
    run.put("p0-f", outcome="fail", write=False)
    result = check(run.finish())
    assert failing(result) == {"progress"}


@pytest.mark.parametrize("workload, meta_key", [("polls", "consumer_group"), ("transactions", "transactions"),
                                                ("topic_ops", "topic_ops")])
def test_a_requested_workload_that_never_worked_fails(workload, meta_key):
    run = clean()
    run.h.meta[meta_key] = True
    result = check(run.finish())
    assert failing(result) == {"progress"}
    assert [v["workload"] for v in result.violations("progress")] == [workload]


# --- 5. one verdict: every signal of the run in it ---------------------------------------


@pytest.mark.parametrize("key", ["settle_failures", "hostile_problems", "txn_problems", "workload_crashes"])
def test_what_the_runner_saw_fails_the_check_of_the_history(key, tmp_path):
    run = clean()
    history = run.finish()
    history.meta["run_problems"] = {key: ["something went wrong"]}
    result = check(history)
    assert failing(result) == {"run"}
    # The re-check of the saved history gives the same verdict (exit 1).
    history.save(tmp_path / "history.json")
    proc = subprocess.run([sys.executable, "-m", "chaos", "check", str(tmp_path / "history.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "something went wrong" in proc.stdout


def test_an_older_history_still_fails_on_its_steps_settle_failures():
    history = clean().finish()
    history.fault("settle_timeout", "b0-m", of="kill-master", why="no master after 60s")
    assert failing(check(history)) == {"run"}


def _master_fault(hold_s: float, failover_at: float | None, heals: bool = True, **details) -> History:
    run = TimedRun()
    run.h.meta["session_ms"] = 1500
    run.load(1, 10)
    run.fault("kill-master", 10.2, 10.2 + hold_s if heals else None, hold_s=hold_s, **details)
    if failover_at is not None:
        run.at(failover_at).h.failover(0, "meta://m0", "meta://s1", 2)
    run.load(10.5, 10.2 + hold_s + BOUND + 2)
    return run.finish()


def test_a_master_fault_held_past_the_session_without_a_failover_fails():
    """Before: the run's report printed it as a liveness failure, and the verdict left it out."""
    result = check(_master_fault(4.0, None))
    assert failing(result) == {"failover"}
    assert "was not followed by a failover of group 0" in result.violations("failover")[0]["why"]
    assert check(_master_fault(4.0, 12.0)).ok
    assert not check(_master_fault(1.5, None)).ok  # held the session timeout: due too
    # Held shorter than the session timeout: the master may keep its session.
    assert check(_master_fault(1.0, None)).ok
    # No slave could take over (campaign seed 4000: the sync set had emptied a second before
    # the kill, the master acking alone): no failover is due, by design (V4).
    assert check(_master_fault(4.0, None, eligible_slaves=0)).ok
    assert not check(_master_fault(4.0, None, eligible_slaves=1)).ok


# --- 6. outcome-unknown transactions, judged by their markers --------------------------


def _unknown_transaction(kind: Kind, client: str = "info") -> Kafka:
    """Transaction u1 (producer 7, txid "x0") stores u1-a in t/0-0 behind its BATCH header; its
    client gives up (info); the broker's marker says ``kind``; a read-committed consumer polls
    u1-a."""
    k = Kafka()
    k.put("p0-0")
    op = k.h.invoke("x0", "txn", txn="u1")
    log = k.logs["t/0-0"]
    batch = frame_batch(encode_record(b"u1-a", msg_id=50), 1, producer_id=7, producer_epoch=0, first_seq=0,
                        timestamp_ms=1, txid="x0")
    header = len(batch) - len(encode_record(b"u1-a", msg_id=50))
    at = len(log) + header
    log += batch
    log += marker(kind, "x0", producer_id=7, producer_epoch=0, timestamp_ms=2)
    if client == "ok":
        k.h.ok(op, sends=[["t/0-0", at, "u1-a"]], commit_time=k.h.now())
    else:
        k.h.info(op, "unknown: gave up", sends=[["t/0-0", at, "u1-a"]])
    k.h.assign("g0-c0", "g0", 1, PARTS)
    k.h.poll("g0-c0", "g0", 1, {"t/0-0": [(0, "p0-0"), (at, "u1-a")]})
    return k


def test_a_read_committed_read_of_an_unknown_transaction_its_marker_aborted_is_an_aborted_read():
    """Before: an outcome-unknown transaction was never judged: reading its message passed."""
    result = check(_unknown_transaction(Kind.ABORT).finish())
    assert failing(result) == {"aborted-read"}
    assert result.violations("aborted-read")[0]["value"] == "u1-a"
    assert check(_unknown_transaction(Kind.COMMIT).finish()).ok


def test_a_transaction_its_client_saw_committed_whose_marker_says_abort_is_a_lost_write():
    result = check(_unknown_transaction(Kind.ABORT, client="ok").finish())
    assert failing(result) == {"acked_lost", "aborted-read"}
    assert "its marker in t/0-0 says ABORT" in result.violations("acked_lost")[0]["why"]


def test_an_unknown_transaction_its_marker_committed_must_be_delivered():
    k = _unknown_transaction(Kind.COMMIT)
    k.h.ops = [op for op in k.h.ops if op.get("f") != "poll"]
    k.h.poll("g0-c0", "g0", 1, {"t/0-0": [(0, "p0-0")]})
    k.h.group_drained("g0")
    result = check(k.finish())
    assert failing(result) == {"unseen"}
    assert result.violations("unseen")[0]["value"] == "u1-a"


# --- 7. V9: only reads above an open transaction's first record are exempt -----------------


def _zk_majority_loss_over_an_open_transaction(below_read_at: float | None) -> TimedRun:
    """Seed 44's shape (tests/unit/test_chaos_checker.py): a transaction's record in t/0-0,
    ZooKeeper's majority lost from 10.2 s to 16.0 s before it is decided; t/0-0's reads
    resume at 17.0 s. p0-below is acked at 9.55 s, below the transaction's record; it is read
    at ``below_read_at`` (None: not before 17.0 s)."""
    run = TimedRun()
    run.load(1, 9.5)
    below = run.at(9.55).put("p0-below", partition="t/0-0")
    txn = run.at(9.6).h.invoke("x0", "txn", txn="x0-t1")
    sent = run.append("t/0-0", "x0-t1-0")
    run.at(9.8).put("p0-after-the-txn", partition="t/0-0")
    run.fault("zk-majority", 10.2, 16.0, reads_during=True, master_fixed=True)
    if below_read_at is not None:
        run.at(below_read_at).read("t/0-0", [(below, "p0-below")], replica="meta://m0")
    run.at(17.0).h.fail(txn, "rolled back", sends=[["t/0-0", sent, "x0-t1-0"]])
    run.load(10.5, 20, writes=False, partitions=("t/0-1",))
    run.load(17.0, 20, writes=False, partitions=("t/0-0",))
    run.load(16.5, 20, reads=False)
    return run


def test_reads_below_an_open_transaction_must_go_on_during_a_zookeeper_majority_loss():
    """Before: any transaction open at the fault switched "reads throughout" off for the
    partition, so p0-below (acked under the transaction's record) unread for 7 s passed."""
    result = check(_zk_majority_loss_over_an_open_transaction(None).finish())
    assert failing(result) == {"liveness"}, result.report()
    (v,) = result.violations("liveness")
    assert v["kind"] == "reads_stopped" and "below transaction x0-t1's first record" in v["why"]
    assert result.stats["reads_during_exemptions"] == {"x0-t1": 1}
    # Read during the fault, within the bound: the exemption covers the rest.
    result = check(_zk_majority_loss_over_an_open_transaction(12.0).finish())
    assert result.ok, result.report()
    assert result.stats["reads_during_exemptions"] == {"x0-t1": 1}


@pytest.mark.parametrize("acked_at, caught", [(15.0, False), (11.0, True)])
def test_reads_throughout_a_zookeeper_majority_loss_count_from_the_partitions_first_ack(acked_at, caught):
    """Campaign seed 4000: the quorum went 23 s into the run, before t/0-1 (there: chaos/1-1)
    had an acked message; a raw read got an unacked record, then nothing until the first ack
    just before the quorum came back. Nothing acked was there to read: no ``reads_stopped``.
    Once something is acked, reads must come within the bound."""
    run = TimedRun()
    run.load(1, 9.5, partitions=("t/0-0",))
    run.put("p0-unacked", partition="t/0-1", outcome="info")
    run.at(9.0).read("t/0-1", [(0, "p0-unacked")])
    run.fault("zk-majority", 10.2, 16.0, reads_during=True, master_fixed=True)
    run.load(10.5, 20, writes=False, partitions=("t/0-0",))
    run.at(acked_at).put("p0-first", partition="t/0-1")
    run.at(15.2).read_newest("t/0-1")
    run.load(16.5, 20)
    result = check(run.finish())
    assert (failing(result) == {"liveness"}) is caught, result.report()
    if caught:
        assert [v["kind"] for v in result.violations("liveness")] == ["reads_stopped"]


# --- 9. dead switches ------------------------------------------------------------------


def test_foreign_values_ok_no_longer_turns_the_phantom_check_off():
    run = clean()
    run.append("t/0-0", "never-written")
    history = run.finish()
    history.meta["foreign_values_ok"] = True
    assert "phantoms" in failing(check(history))


# --- 4. a crashed workload task is recorded for the verdict --------------------------------


def test_a_workload_task_that_raises_is_a_crash_the_history_records(monkeypatch):
    """Before: ``Workload.run`` only logged a task's exception; the run passed."""
    import asyncio
    from types import SimpleNamespace

    from chaos import runner
    from chaos.raw_producer import ProducerSettings

    class Crashing:
        def __init__(self, workload, name, *_args) -> None:
            self.name = name

        async def run(self) -> None:
            if self.name == "r1":
                raise RuntimeError("boom")

    async def quiet(*_args, **_kwargs) -> None:
        return None

    monkeypatch.setattr(runner, "RawProducer", Crashing)
    workload = runner.Workload.__new__(runner.Workload)
    workload.cluster = SimpleNamespace(num_groups=1)
    workload.transactions, workload.time_reads = False, False
    workload.producers, workload.resend_budget_s = ProducerSettings(), 1.0
    workload.conns, workload.crashes = {}, []
    workload.client_producer = workload.reader = workload.prober = quiet
    asyncio.run(workload.run())
    assert workload.crashes == ["r1: RuntimeError('boom')"]


def test_a_consumer_that_exits_by_itself_is_a_crash(tmp_path):
    """A group member gone with a non-zero code before the load stopped it."""
    import subprocess as sp
    from types import SimpleNamespace

    from chaos.group_consumer import ConsumerGroupLoad

    load = ConsumerGroupLoad(SimpleNamespace(), History(), 1, tmp_path)
    proc = sp.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    load.members[0] = ("chaos-g0-c0.0", proc)
    load._stop(0, signal.SIGTERM, wait_s=1.0)
    assert load.crashes == ["consumer chaos-g0-c0.0 exited by itself with code 3 (see consumers/chaos-g0-c0.0.log)"]



def test_a_fault_that_took_seconds_to_inject_is_timed_from_its_start_and_its_takeover_counts():
    """Campaign seed 5200 (power loss): the kill's fast takeover was seen at 110.16 s, but the
    fault was recorded at 110.56 s, after the power-loss replay; the failover check looked
    for a failover after 110.56 s and found none. The runner now records when the fault
    began (``History.fault(at=...)``), kept in time order."""
    history = History()
    history.fault("consumer-start", "c0", at=5.0)
    history.fault("consumer-start", "c1", at=11.0)
    history.fault("power-loss-master", "b0-m", at=10.0)
    assert [f["time"] for f in history.faults] == [5.0, 10.0, 11.0]
    # Recorded late, timed from its start: the failover seen during the injection satisfies it.
    assert check(_master_fault(4.0, 10.25)).ok
    assert failing(check(_master_fault(4.0, 10.1))) == {"failover"}, "a failover before the fault is not its own"
