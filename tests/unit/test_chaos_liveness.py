"""Liveness (chaos.liveness) of reads held back by a transaction whose client gave up:
undecided until the broker's timeout, so its partition's reads are due within the bound
of that timeout, not of the fault's end; every other hold keeps the bound of the end.

The rest of the liveness checks are tested in test_chaos_checker.py (``TimedRun``)."""

from __future__ import annotations

from chaos.checker import check
from chaos.transactions import TXN_TIMEOUT_S
from metaq.server.transactions import TICK_S
from tests.unit.test_chaos_checker import BOUND, TimedRun

INVOKED, START, END = 9.6, 10.2, 13.0  # the transaction begins; ZooKeeper loses its majority; it is back


def transaction_across_a_quorum_loss(outcome: str, completed: float, reads_resume: float, timeout_s: float | None = 10,
                                     xa: bool = False, transactions_meta: bool = False) -> TimedRun:
    """Seed 2007's shape: a transaction stores a record in t/0-0 and plain puts are acked
    after it; ZooKeeper loses its majority (START to END) before it is decided; its client
    completes it at ``completed`` (``info``: it gave up, "broker 0 is fenced"; ``ok`` /
    ``fail``: it heard the commit / the abort). Writes and t/0-1's reads go on from just
    after END; t/0-0's reads of the acked messages past the record resume at
    ``reads_resume``. ``timeout_s`` None: the operation does not record it (older runs)."""
    run = TimedRun()
    if transactions_meta:
        run.h.meta["transactions"] = True
    run.load(1, 9.5)
    extra = {"xa": True} if xa else {}
    if timeout_s is not None:
        extra["timeout_s"] = timeout_s
    txn = run.at(INVOKED).h.invoke("x1", "txn", txn="x1-t1", **extra)
    sent = run.append("t/0-0", "x1-t1-0")
    run.at(9.8).put("p0-after-the-txn", partition="t/0-0")
    run.fault("zk-majority", START, END, reads_during=True, master_fixed=True)
    sends = [["t/0-0", sent, "x1-t1-0"]]
    run.at(completed)
    if outcome == "info":
        run.h.info(txn, "unknown: transaction to broker group 0 gave up: 503 broker 0 is fenced", sends=sends)
    elif outcome == "fail":
        run.h.fail(txn, "rolled back", sends=sends)
    else:
        run.h.ok(txn, sends=sends, commit_time=completed - 0.1)
    run.load(10.5, 30, writes=False, partitions=("t/0-1",))
    run.load(13.5, 30, reads=False)
    run.load(reads_resume, 30, writes=False, partitions=("t/0-0",))
    return run


def reads_stalled(run: TimedRun) -> list[dict]:
    result = check(run.finish())
    assert {v["kind"] for v in result.violations()} <= {"reads_stalled"}, result.report()
    return result.violations()


def test_reads_held_by_a_transaction_whose_client_gave_up_are_due_within_the_bound_of_its_timeout():
    """The client gave up during the outage (15 s); the broker's timer aborts the
    transaction at 9.6 + 10 s (+ a tick): t/0-0's reads resume just after, 6.8 s after the
    quorum came back (> B, but nothing could be read earlier)."""
    decidable = INVOKED + 10 + TICK_S
    run = transaction_across_a_quorum_loss("info", completed=15.0, reads_resume=decidable + 0.1)
    result = check(run.finish())
    assert result.ok, result.report()
    (record,) = result.stats["liveness_faults"]
    assert record["reads_wait_for_timeout"] == {"t/0-0": {"transaction": "x1-t1", "decidable_at": round(decidable, 3)}}
    assert record["reads_held_by_transaction"] == {"t/0-0": "x1-t1"}


def test_reads_resuming_long_after_the_timeout_of_a_transaction_whose_client_gave_up_are_caught():
    decidable = INVOKED + 10 + TICK_S
    run = transaction_across_a_quorum_loss("info", completed=15.0, reads_resume=decidable + BOUND + 1)
    (violation,) = reads_stalled(run)
    assert "held by transaction x1-t1 (outcome unknown, decided by 19.7s at the latest)" in violation["why"]


def test_a_transaction_its_client_committed_or_rolled_back_keeps_the_bound_of_the_faults_end():
    """Decided by its client just after the quorum's return (a write): the reads it held
    are due within B of the end, and resuming as late as the test above is caught."""
    for outcome in ("ok", "fail"):
        late = transaction_across_a_quorum_loss(outcome, completed=13.4, reads_resume=INVOKED + 10 + TICK_S + 0.1)
        (violation,) = reads_stalled(late)
        assert "held by transaction" not in violation["why"]
        assert "reads_wait_for_timeout" not in check(late.finish()).stats["liveness_faults"][0]
        in_time = transaction_across_a_quorum_loss(outcome, completed=13.4, reads_resume=END + BOUND - 0.5)
        assert check(in_time.finish()).ok


def test_a_read_past_the_record_decides_a_transaction_whose_client_gave_up():
    """A reader got past the record before the quorum went (a timer or a failover decided
    it; the client never heard): it holds nothing, and the reads keep the bound of the end."""
    run = transaction_across_a_quorum_loss("info", completed=15.0, reads_resume=INVOKED + 10 + TICK_S + 0.1)
    run.at(9.9).read_newest("t/0-0")  # the plain put acked after the transaction's record
    assert reads_stalled(run)


def test_an_xa_branch_whose_client_gave_up_counts_its_timeout_from_the_completion():
    """An XA branch's timeout runs again from its prepare, sent before its client gave up
    (15 s): decidable at 15 + 10 s; a local transaction's counts from its invocation."""
    resume = 15.0 + 10 + TICK_S + 0.1
    assert check(transaction_across_a_quorum_loss("info", completed=15.0, reads_resume=resume, xa=True).finish()).ok
    assert reads_stalled(transaction_across_a_quorum_loss("info", completed=15.0, reads_resume=resume))


def test_a_history_without_the_timeout_takes_the_workloads_default_only_when_it_ran():
    """Histories before ``timeout_s`` was recorded on every ``txn`` operation: the runner's
    transactional workload (``meta.transactions``) asked for ``TXN_TIMEOUT_S``; a history
    from another source gets no grace (its client's completion decides, the strict reading)."""
    resume = INVOKED + TXN_TIMEOUT_S + TICK_S + 0.1
    runner = transaction_across_a_quorum_loss("info", 15.0, resume, timeout_s=None, transactions_meta=True)
    # (Only liveness: this history has no committed transaction, which progress asks of a
    # run whose transactional workload ran.)
    assert check(runner.finish()).checks["liveness"]["ok"]
    assert reads_stalled(transaction_across_a_quorum_loss("info", 15.0, resume, timeout_s=None))


def test_a_transaction_whose_send_was_stored_without_an_ack_holds_the_reads_too():
    """Campaign seed 6200: an XA branch's send got no reply (a cut between clients and the
    master) but was stored; the branch's client gave up, recorded the send as ``[None, None,
    value]``, and the branch stayed open until ZooKeeper lost its majority. Reads past its
    record stopped until the quorum came back, as T1 says. The checker knew only a later
    transaction's record and called a message acked between the two "below the open
    transaction" and unread: ``reads_stopped``. The send is found by its value in the final
    log, and its transaction holds the reads from there."""
    run = TimedRun()
    run.load(1, 9.5)
    unacked = run.at(9.55).h.invoke("xa0", "txn", txn="xa0-t1", xa=True, timeout_s=10)
    run.append("t/0-0", "xa0-t1-0")  # stored; its reply never came
    run.at(9.7).put("p0-between", partition="t/0-0")
    later = run.at(9.9).h.invoke("x0", "txn", txn="x0-t2", timeout_s=10)
    sent = run.append("t/0-0", "x0-t2-0")
    run.fault("zk-majority", START, 16.0, reads_during=True, master_fixed=True)
    run.at(START + 0.05).h.ok(later, sends=[["t/0-0", sent, "x0-t2-0"]], commit_time=START - 0.1)
    run.at(12.0).h.info(unacked, "unknown: put to broker group 0 gave up after 2 attempts",
                        sends=[[None, None, "xa0-t1-0"]])
    run.load(10.5, 20, writes=False, partitions=("t/0-1",))
    run.load(16.5, 20)
    result = check(run.finish())
    assert result.ok, result.report()
    (record,) = result.stats["liveness_faults"]
    assert record["reads_held_by_transaction"] == {"t/0-0": "xa0-t1"}


def transaction_begun_just_after_the_quorum_went(decided: float, below_read: float | None = 10.4) -> TimedRun:
    """Campaign seeds 7100, 7101: the fault's time is taken before its injection, which took
    0.2 s; meanwhile a transaction began (S + 0.06 s), stored a record in t/0-0, and a plain
    put was acked above it; then the master fenced. The transaction is decided at
    ``decided`` (its client heard it refused); t/0-0's reads got the message below its
    record at ``below_read`` (None: never), then nothing until the quorum came back."""
    run = TimedRun()
    run.load(1, 10.0)
    run.fault("zk-majority", START, 16.0, reads_during=True, master_fixed=True)
    txn = run.at(START + 0.06).h.invoke("z0", "txn", txn="z0-t1", timeout_s=10)
    below = run.at(START + 0.07).put("p0-below", partition="t/0-0")
    sent = run.append("t/0-0", "z0-t1-0")
    run.at(START + 0.13).put("p0-above", partition="t/0-0")
    if below_read is not None:
        run.at(below_read).read("t/0-0", [(below, "p0-below")], replica="meta://m0")
    run.at(decided).h.fail(txn, "older instance refused: fenced", sends=[["t/0-0", sent, "z0-t1-0"]])
    run.load(10.5, 20, writes=False, partitions=("t/0-1",))
    run.load(16.5, 20)
    return run


def test_a_transaction_begun_after_the_fault_before_the_master_noticed_holds_the_reads_too():
    """Before: only a transaction invoked by ``S`` narrowed the reads-throughout rule, so
    t/0-0's reads, stopped at this one's record, were ``reads_stopped`` (5.6 s > 4 s)."""
    result = check(transaction_begun_just_after_the_quorum_went(decided=16.6).finish())
    assert result.ok, result.report()
    (record,) = result.stats["liveness_faults"]
    assert record["reads_held_by_transaction"] == {"t/0-0": "z0-t1"}
    assert result.stats["reads_during_exemptions"] == {"z0-t1": 1}


def test_reads_below_a_transaction_begun_after_the_fault_must_still_go_on():
    (violation,) = check(transaction_begun_just_after_the_quorum_went(16.6, below_read=None).finish()).violations()
    assert violation["kind"] == "reads_stopped" and "below transaction z0-t1's first record" in violation["why"]


def test_a_transaction_begun_and_decided_during_the_fault_holds_nothing():
    """Decided before the quorum came back (the master had not noticed yet): its record
    held the reads for a moment only, and the reads that then stopped are a violation."""
    (violation,) = check(transaction_begun_just_after_the_quorum_went(decided=START + 0.2).finish()).violations()
    assert violation["kind"] == "reads_stopped" and "stopped for" in violation["why"]


def test_reads_stopped_before_a_transaction_begun_during_the_fault_are_still_caught():
    """Reads stopped at the start of the fault, with nothing holding them; a transaction
    began just before the quorum came back and stayed open 4.4 s (> B). It holds the reads
    from its invocation only: before it, the reads-throughout rule applies."""
    run = TimedRun()
    run.load(1, 10.0)
    run.fault("zk-majority", START, 18.0, reads_during=True, master_fixed=True)
    run.load(10.5, 25, writes=False, partitions=("t/0-1",))
    txn = run.at(17.5).h.invoke("x0", "txn", txn="x0-t1", timeout_s=10)
    sent = run.append("t/0-0", "x0-t1-0")
    run.at(17.6).put("p0-above", partition="t/0-0")
    run.at(21.9).h.fail(txn, "rolled back", sends=[["t/0-0", sent, "x0-t1-0"]])
    run.load(18.5, 25, reads=False)
    run.load(22.0, 25, writes=False, partitions=("t/0-0",))
    result = check(run.finish())
    (violation,) = result.violations()
    assert violation["kind"] == "reads_stopped" and "reads of t/0-0 stopped for 7.50s" in violation["why"]
    assert result.stats["liveness_faults"][0]["reads_held_by_transaction"] == {"t/0-0": "x0-t1"}
