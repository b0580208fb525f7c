"""Checks a chaos history (chaos.history) for safety (nothing acked lost) and liveness.

Each check is a function ``history, index -> (violations, checked_count)``; the result
of a run is every check's verdict plus run statistics. The final logs are the truth:
the master snapshot of each group after healing ("the final log").

checks
------
``acked_lost``      (sync) every ``ok`` put, and every message of a committed transaction
                    (on whichever topic it went to), is in the final log of its partition at
                    its acked offset with its value: half a transaction missing is a loss.
                    (async: only ``moved`` is a violation here, the losses are judged by
                    ``async_loss_bound``.)
``async_loss_bound``(async) acked puts missing from the final log number no more than the
                    replication lag (messages, else bytes) reported at failovers of their
                    group; a loss with no failover at all is a violation.
``order``           per partition, if put A completed (ok) before put B was invoked, A's
                    final offset is below B's (real-time order survives failover).
``read_lost``       every message a consumer read (offset, value) is in the final log at that
                    offset: nobody read a message that a failover later took back. (async:
                    a read that a failover of the group took back inside its lag is expected,
                    see ``taken_back_reads``; counted in ``stats["async_reads_taken_back"]``.)
``split_brain``     no two masters acked writes in the same epoch of a group (from the
                    ``epoch``/``master`` that each ok put carries); a put acked at a lower
                    epoch after a higher-epoch ack had completed is a warning (``stale_ack``).
``replica_prefix``  after healing, every slave's log of every partition is a byte-identical
                    prefix of its master's (equal record lists: offset, size, CRC32 of the
                    whole record, value; no torn tail; not longer than the master).
``duplicates``      no value appears twice in the final logs (unknown-outcome writes appear at
                    most once, never twice at different offsets), unless the producers resend
                    unknown outcomes without idempotence (at least once, ``--retry-unknown``):
                    then a resent put's copies are expected and only counted; a copy of a
                    put that was never resent is still a violation. With ``--idempotent``
                    every duplicate is a violation.
``phantoms``        nothing is in a final log that was never written, and no put that
                    definitely failed (``fail``) is there.
``final_masters``   every group has exactly one master in the final snapshot.
``liveness``        after every fault ends (heals, or starts when it never heals) acked
                    messages are read back and, where the configuration allows, writes are
                    acked again within the liveness bound (``chaos.liveness``); the per-kind
                    unavailability table is in ``stats["unavailability"]``.

Jepsen's Kafka workload anomalies (chaos/anomalies.py, by Jepsen's names; ``acked_lost`` is
its ``lost-write``): ``unseen``, ``duplicate``, ``inconsistent-offsets``, ``poll-skip``,
``nonmonotonic-poll``, ``nonmonotonic-send``, ``int-poll-skip``, ``int-nonmonotonic-poll``,
``precommitted-read``, ``aborted-read`` (G1a), ``intermediate-read`` (G1b), ``G0``, ``G1c``.
``inconsistent-offsets`` is Jepsen's, with the same async allowance as ``read_lost``: an
offset seen holding a value a failover took back inside its lag, besides the final one.
A check may also return anomalies its mode allows (``expected``): counted, never a failure.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

from chaos import anomalies
from chaos.history import History, brief, group_of, is_control
from chaos.liveness import check_liveness, liveness_bound, render_table, table

MAX_SHOWN = 20


@dataclass
class LogIndex:
    end: int
    by_offset: dict[int, tuple[Any, int, int]]  # offset -> (value, size, crc)
    by_value: dict[Any, list[int]]
    records: list[list[Any]]


@dataclass
class Index:
    masters: dict[int, list[str]]  # group -> master replica names
    logs: dict[str, LogIndex]  # partition -> the final master's log
    puts: list[dict[str, Any]]  # completed puts (with invoke_time)
    gets: list[dict[str, Any]]
    history: History

    def where(self, partition: str, value: Any) -> list[int]:
        log = self.logs.get(partition)
        return [] if log is None else log.by_value.get(value, [])

    @cached_property
    def liveness(self) -> "Liveness":
        return _liveness(self.history, self)

    @cached_property
    def kafka(self) -> anomalies.View:
        """Batches, writes and transactions, for the Kafka workload's anomaly checks."""
        return anomalies.build_view(self.history, self.logs)

    @cached_property
    def kafka_graphs(self) -> tuple[Any, Any]:
        """The (ww, wr) dependency graphs of transactions and read-committed reads."""
        return anomalies.dependency_graphs(self.kafka)

    @cached_property
    def taken_back(self) -> "TakenBack":
        """Reads an async failover took back inside its lag (``read_lost``, ``inconsistent-offsets``)."""
        return taken_back_reads(self.history, self)

    @cached_property
    def lost_and_moved(self) -> tuple[list[dict], list[dict], int]:
        """Acked puts missing from / elsewhere in the final logs (three checks use it)."""
        return _lost_and_moved(self)


def build_index(history: History) -> Index:
    replicas = history.final.get("replicas", {})
    masters: dict[int, list[str]] = defaultdict(list)
    for name, rep in replicas.items():
        if rep.get("role") == "master":
            masters[int(rep["group"])].append(name)
    logs: dict[str, LogIndex] = {}
    for group, names in masters.items():
        if len(names) != 1:
            continue
        for partition, snap in replicas[names[0]].get("partitions", {}).items():
            by_offset, by_value = {}, defaultdict(list)
            for offset, size, crc, value in snap.get("records", []):
                by_offset[offset] = (value, size, crc)
                by_value[value].append(offset)
            logs[partition] = LogIndex(snap.get("end", 0), by_offset, dict(by_value), snap.get("records", []))
    completions = history.completions()
    return Index(
        masters=dict(masters),
        logs=logs,
        puts=[op for op in completions if op.get("f") == "put"],
        gets=[op for op in completions if op.get("f") == "get" and op["type"] == "ok"],
        history=history,
    )


# --- the checks ----------------------------------------------------------------------


def check_final_masters(history: History, index: Index) -> tuple[list[dict], int]:
    groups = {int(r["group"]) for r in history.final.get("replicas", {}).values()}
    out = []
    for group in sorted(groups):
        names = index.masters.get(group, [])
        if len(names) != 1:
            out.append({"kind": "masters", "group": group, "masters": names,
                        "why": f"group {group} has {len(names)} masters in the final snapshot (expected 1)"})
    return out, len(groups)


def acked_writes(index: Index) -> list[dict[str, Any]]:
    """Every write that must be in the final log, each as a put's completion: the ``ok`` puts
    and, per message of a committed transaction, its ``txn`` completion with that message's
    ``partition``, acked ``offset`` and ``value`` (a transaction commits whole: every topic
    and partition it wrote, or none)."""
    writes = [op for op in index.puts if op["type"] == "ok"]
    for w in index.kafka.writes:
        if w.transactional and w.committed and w.partition is not None:
            writes.append({**w.op, "partition": w.partition, "offset": w.offset, "value": w.value})
    return writes


def _lost_and_moved(index: Index) -> tuple[list[dict], list[dict], int]:
    lost, moved, checked = [], [], 0
    for op in acked_writes(index):
        checked += 1
        partition = op.get("partition")
        log = index.logs.get(partition)
        if log is None:
            lost.append({**brief(op), "kind": "lost", "why": f"{op.get('value')!r}: no final master log for partition {partition}"})
            continue
        offsets = log.by_value.get(op.get("value"), [])
        acked = op.get("offset")
        if acked is None:
            if not offsets:
                what = f"transaction {op.get('txn')}'s message" if op.get("f") == "txn" else "acked put"
                lost.append({**brief(op), "kind": "lost", "why": f"{what} {op.get('value')!r} is not in the final log of {partition}"})
        elif acked not in offsets:
            if offsets:
                moved.append({**brief(op), "kind": "moved", "found_at": offsets,
                              "why": f"{op.get('value')!r} acked at {partition}@{acked} but found at {offsets}"})
            else:
                at = log.by_offset.get(acked)
                lost.append({**brief(op), "kind": "lost", "found_there": at[0] if at else None,
                             "why": f"{op.get('value')!r} acked at {partition}@{acked}; the final log has "
                                    + (f"{at[0]!r} there" if at else "no record there")})
    return lost, moved, checked


def check_acked_lost(history: History, index: Index) -> tuple[list[dict], int]:
    lost, moved, checked = index.lost_and_moved
    if history.meta.get("mode", "sync") == "async":
        return moved, checked
    return lost + moved, checked


def check_async_loss_bound(history: History, index: Index) -> tuple[list[dict], int]:
    if history.meta.get("mode", "sync") != "async":
        return [], 0
    lost, _moved, checked = index.lost_and_moved
    by_partition: dict[str, list[dict]] = defaultdict(list)
    for op in lost:
        by_partition[op.get("partition")].append(op)
    out = []
    for partition, ops in sorted(by_partition.items(), key=lambda kv: str(kv[0])):
        group = group_of(partition)
        failovers = [f for f in history.failovers if f.get("group") == group]
        if not failovers:
            out.append({"kind": "loss_without_failover", "partition": partition, "lost": len(ops),
                        "values": [o.get("value") for o in ops[:MAX_SHOWN]],
                        "why": f"{len(ops)} acked messages lost in {partition} with no failover of group {group}"})
            continue
        lags = [f.get("lag", {}).get(partition, {}) for f in failovers]
        if all("messages" in lag for lag in lags):
            bound = sum(int(lag["messages"]) for lag in lags)
            amount, unit = len(ops), "messages"
        else:
            bound = sum(int(lag.get("bytes", 0)) for lag in lags)
            amount = sum(int(o.get("size") or 20 + len(str(o.get("value", "")).encode())) for o in ops)
            unit = "bytes"
        if amount > bound:
            out.append({"kind": "loss_over_lag", "partition": partition, "lost": len(ops),
                        "lost_amount": amount, "lag_bound": bound, "unit": unit,
                        "values": [o.get("value") for o in ops[:MAX_SHOWN]],
                        "why": f"lost {amount} {unit} in {partition}, more than the lag of {bound} at failover"})
    return out, checked


def check_order(history: History, index: Index) -> tuple[list[dict], int]:
    out, checked = [], 0
    per_partition: dict[str, list[tuple[float, float, int, dict]]] = defaultdict(list)
    for op in index.puts:
        if op["type"] != "ok":
            continue
        offsets = index.where(op.get("partition"), op.get("value"))
        if len(offsets) != 1:
            continue  # lost or duplicated: other checks report it
        per_partition[op.get("partition")].append((op["invoke_time"], op["time"], offsets[0], op))
    for partition, ops in per_partition.items():
        by_ok = sorted(ops, key=lambda o: o[1])
        ok_times = [o[1] for o in by_ok]
        best: list[tuple[int, dict]] = []  # running max of final offset over by_ok prefixes
        for _inv, _ok, off, op in by_ok:
            best.append(max(best[-1], (off, op), key=lambda x: x[0]) if best else (off, op))
        for inv, _ok, off, op in ops:
            checked += 1
            n = bisect.bisect_left(ok_times, inv)  # ops acked strictly before this one was invoked
            if n and best[n - 1][0] >= off:
                before = best[n - 1][1]
                out.append({"kind": "order", "partition": partition, "earlier": brief(before),
                            "later": brief(op), "earlier_offset": best[n - 1][0], "later_offset": off,
                            "why": f"{before.get('value')!r} was acked before {op.get('value')!r} was sent, "
                                   f"but sits at offset {best[n - 1][0]} >= {off}"})
    return out, checked


def check_read_lost(history: History, index: Index) -> tuple[list[dict], int, list[dict]]:
    out, expected, checked = [], [], 0
    excused = index.taken_back.excused
    for op in index.gets:
        partition = op.get("partition")
        log = index.logs.get(partition)
        for offset, value in op.get("reads", []):
            checked += 1
            at = log.by_offset.get(offset) if log else None
            if at is None or at[0] != value:
                case = {"kind": "read_lost", "partition": partition, "offset": offset,
                        "value": value, "replica": op.get("replica"), "read_time": op.get("time"),
                        "final_there": at[0] if at else None,
                        "why": f"read {value!r} at offset {offset}, the final log has "
                               + (f"{at[0]!r}" if at else "nothing") + " there"}
                (expected if value in excused.get((partition, offset), ()) else out).append(case)
    return out, checked, expected


# --- reads an async failover took back -----------------------------------------------


@dataclass
class TakenBack:
    """Read records the final log no longer holds at their offset that an async failover of
    their group took back inside its replication lag (docs/guarantees.md, async reads)."""

    excused: dict[tuple[str, int], set[Any]]  # (partition, offset) -> the values read there

    @property
    def count(self) -> int:
        return sum(len(values) for values in self.excused.values())


def lag_window(index: Index, failover: dict[str, Any], partition: str) -> tuple[float, float] | None:
    """``[lo, hi)``: the offsets of ``partition`` whose records ``failover`` may have taken back,
    or None when its lag there was nothing.

    The new master's log ended at its promotion at some D, and it lacked the old master's
    last L bytes (the lag): [D, D + L) was taken back. D is not recorded, but the acks bound
    it: a put acked in an earlier epoch that is still at its offset in the final log ends at
    or below D; a put the new master acked in its epoch starts at or above D.
    """
    lag = failover.get("lag", {}).get(partition) or {}
    if not int(lag.get("bytes", 0)) and not int(lag.get("messages", 0)):
        return None
    epoch = failover.get("epoch")
    if epoch is None:
        return (0.0, float("inf"))
    log = index.logs.get(partition)
    lo, first_new = 0, float("inf")
    for op in index.puts:
        offset, acked_in = op.get("offset"), op.get("epoch")
        if op["type"] != "ok" or op.get("partition") != partition or offset is None or acked_in is None:
            continue
        if int(acked_in) == int(epoch):
            first_new = min(first_new, offset)
        elif int(acked_in) < int(epoch) and log is not None:
            at = log.by_offset.get(offset)
            if at is not None and at[0] == op.get("value"):
                lo = max(lo, offset + at[1])
    return (lo, first_new + int(lag["bytes"]) if "bytes" in lag else float("inf"))


def taken_back_reads(history: History, index: Index) -> TakenBack:
    """Async only: every read of a record the final log does not hold at its offset (raw
    fetches and consumer polls alike) is taken back by a failover if its offset lies in that
    failover's lag window (``lag_window``) and, per partition, there are no more such
    records than the failovers' lags in messages add up to (when recorded). Anything else
    stays a violation of the checks that found it."""
    if history.meta.get("mode", "sync") != "async":
        return TakenBack({})
    gone: dict[str, set[tuple[int, Any]]] = defaultdict(set)
    for batch in index.kafka.batches:
        log = index.logs.get(batch.partition)
        for offset, value in batch.pairs:
            at = log.by_offset.get(offset) if log else None
            if at is None or at[0] != value:
                gone[batch.partition].add((offset, value))
    excused: dict[tuple[str, int], set[Any]] = defaultdict(set)
    for partition, reads in gone.items():
        failovers = [f for f in history.failovers if f.get("group") == group_of(partition)]
        windows = [w for f in failovers if (w := lag_window(index, f, partition)) is not None]
        inside = [(o, v) for o, v in reads if any(lo <= o < hi for lo, hi in windows)]
        lags = [f.get("lag", {}).get(partition) or {} for f in failovers]
        if lags and all("messages" in lag for lag in lags) and len(inside) > sum(int(lag["messages"]) for lag in lags):
            continue  # more taken back than the lags held: none of it is explained
        for offset, value in inside:
            excused[(partition, offset)].add(value)
    return TakenBack(dict(excused))


def check_inconsistent_offsets(history: History, index: Index) -> tuple[list[dict], int, list[dict]]:
    """Jepsen's ``inconsistent-offsets`` (chaos.anomalies); also expected in async mode: an
    offset whose values besides the final log's are reads a failover took back."""
    out, checked, expected = anomalies.check_inconsistent_offsets(history, index)
    final = index.kafka.final_value
    violations = []
    for case in out:
        partition, offset = case["partition"], case["offset"]
        taken_back = {str(v) for v in index.taken_back.excused.get((partition, offset), ())}
        others = set(case["values"]) - {str(final.get(partition, {}).get(offset))}
        (expected if taken_back and others <= taken_back else violations).append(case)
    return violations, checked, expected


def check_split_brain(history: History, index: Index) -> tuple[list[dict], int]:
    out, checked = [], 0
    masters: dict[tuple[int | None, int], dict[str, dict]] = defaultdict(dict)
    acked = [op for op in index.puts if op["type"] == "ok" and op.get("epoch") is not None]
    for op in acked:
        checked += 1
        masters[(group_of(op.get("partition")), int(op["epoch"]))].setdefault(op.get("master"), op)
    for (group, epoch), seen in sorted(masters.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        if len(seen) > 1:
            out.append({"kind": "split_brain", "group": group, "epoch": epoch, "masters": sorted(map(str, seen)),
                        "examples": [brief(op) for op in seen.values()],
                        "why": f"{len(seen)} masters acked writes in epoch {epoch} of group {group}"})
    return out, checked


def stale_acks(history: History, index: Index) -> list[dict]:
    """Warnings: a put acked at epoch e after a put at a higher epoch had been acked."""
    warnings = []
    by_group: dict[int | None, list[dict]] = defaultdict(list)
    for op in index.puts:
        if op["type"] == "ok" and op.get("epoch") is not None:
            by_group[group_of(op.get("partition"))].append(op)
    for group, ops in by_group.items():
        done = sorted(ops, key=lambda o: o["time"])
        times = [o["time"] for o in done]
        run_max: list[tuple[int, dict]] = []  # highest epoch acked among done[:i+1]
        for o in done:
            cur = (int(o["epoch"]), o)
            run_max.append(max(run_max[-1], cur, key=lambda x: x[0]) if run_max else cur)
        for op in ops:
            n = bisect.bisect_left(times, op["invoke_time"])
            if n and run_max[n - 1][0] > int(op["epoch"]):
                warnings.append({"kind": "stale_ack", "group": group, "op": brief(op),
                                 "newer": brief(run_max[n - 1][1]),
                                 "why": f"acked in epoch {op['epoch']} after epoch {run_max[n - 1][0]} had acked"})
    return warnings


def check_replica_prefix(history: History, index: Index) -> tuple[list[dict], int]:
    out, checked = [], 0
    replicas = history.final.get("replicas", {})
    for group, names in index.masters.items():
        if len(names) != 1:
            continue
        master = replicas[names[0]]
        for name, rep in replicas.items():
            if int(rep["group"]) != group or name == names[0]:
                continue
            for partition, snap in rep.get("partitions", {}).items():
                checked += 1
                mine = snap.get("records", [])
                theirs = master.get("partitions", {}).get(partition)
                base = {"kind": "prefix", "group": group, "slave": name, "master": names[0], "partition": partition}
                if theirs is None:
                    if mine or snap.get("end", 0):
                        out.append({**base, "why": f"slave {name} has {partition}, its master has no such log"})
                    continue
                if snap.get("tail"):
                    out.append({**base, "why": f"slave {name} has a torn tail of {snap['tail']} bytes in {partition}"})
                if snap.get("end", 0) > theirs.get("end", 0):
                    out.append({**base, "why": f"slave {name} log of {partition} ends at {snap['end']}, "
                                               f"past its master's end {theirs['end']}"})
                prefix = theirs.get("records", [])[: len(mine)]
                if [list(r) for r in mine] != [list(r) for r in prefix]:
                    first = next((i for i, (a, b) in enumerate(zip(mine, prefix)) if list(a) != list(b)),
                                 min(len(mine), len(prefix)))
                    out.append({**base, "first_difference": first,
                                "slave_record": mine[first] if first < len(mine) else None,
                                "master_record": prefix[first] if first < len(prefix) else None,
                                "why": f"slave {name} log of {partition} differs from its master's at record {first}"})
                elif mine and mine[-1][0] + mine[-1][1] != snap.get("end", 0) - snap.get("tail", 0):
                    out.append({**base, "why": f"slave {name} log of {partition}: records do not end at its log end"})
    return out, checked


def resent(op: dict[str, Any]) -> bool:
    """Whether a put may have been sent more than once (its producer retried it).

    The raw producers resend only after an unknown outcome; the real client does not say
    why it retried, so any retry of it counts (the cautious reading for duplicates)."""
    return int(op.get("attempts") or 1) > 1


def duplicates_expected(history: History) -> bool:
    """At least once: the producers resend unknown outcomes without idempotence, so a resent
    put may be stored twice. Otherwise (no resends, or an idempotent producer) never."""
    producers = history.meta.get("producers") or {}
    return bool(producers.get("retry_unknown")) and not producers.get("idempotent")


def stored_twice(index: Index) -> dict[Any, list[tuple[str, int]]]:
    """value -> every (partition, offset) of a value that the final logs hold more than once."""
    where: dict[Any, list[tuple[str, int]]] = defaultdict(list)
    for partition, log in index.logs.items():
        for offset, _size, _crc, value in log.records:
            if value is not None and not is_control(value):
                where[value].append((partition, offset))
    return {value: at for value, at in where.items() if len(at) > 1}


def check_duplicates(history: History, index: Index) -> tuple[list[dict], int]:
    """A value stored twice is a violation, except a resent put's under at-least-once
    (``duplicates_expected``): those are counted in ``stats["duplicates_expected"]``."""
    out = []
    tolerated = duplicates_expected(history)
    resent_values = {op.get("value") for op in index.puts if resent(op)}
    for value, at in stored_twice(index).items():
        if tolerated and value in resent_values:
            continue
        why = "" if not tolerated else " (its put was never resent)"
        out.append({"kind": "duplicate", "value": value, "at": at,
                    "why": f"{value!r} appears {len(at)} times in the final logs{why}: {at}"})
    return out, sum(len(log.records) for log in index.logs.values())


def check_phantoms(history: History, index: Index) -> tuple[list[dict], int]:
    out = []
    invoked = {op.get("value") for op in history.ops if op.get("f") == "put" and op["type"] == "invoke"}
    invoked |= {w.value for w in index.kafka.writes if w.transactional}
    failed = {op.get("value"): op for op in index.puts if op["type"] == "fail"}
    succeeded_or_unknown = {op.get("value") for op in index.puts if op["type"] in ("ok", "info")}
    checked = 0
    for partition, log in index.logs.items():
        for offset, _size, _crc, value in log.records:
            if is_control(value):
                continue  # the broker's own record (an idempotent put's BATCH header)
            checked += 1
            if value not in invoked and not history.meta.get("foreign_values_ok"):
                out.append({"kind": "phantom", "partition": partition, "offset": offset, "value": value,
                            "why": f"{value!r} at {partition}@{offset} was never written by the workload"})
            elif value in failed and value not in succeeded_or_unknown:
                out.append({"kind": "failed_write_present", "partition": partition, "offset": offset,
                            "op": brief(failed[value]),
                            "why": f"{value!r} is in {partition}@{offset} although its put definitely failed"})
    return out, checked


def acked_in_final_log(index: Index) -> dict[str, set[int]]:
    """partition -> offsets of acked puts whose message is at that offset in the final log."""
    present: dict[str, set[int]] = defaultdict(set)
    for op in index.puts:
        offset = op.get("offset")
        if op["type"] == "ok" and offset is not None and offset in index.where(op.get("partition"), op.get("value")):
            present[op.get("partition")].add(offset)
    return present


@dataclass
class Liveness:
    violations: list[dict]
    warnings: list[dict]
    faults: list[dict]  # one record per (fault, group): recovery and unavailability times


def _liveness(history: History, index: Index) -> Liveness:
    return Liveness(*check_liveness(history, acked_in_final_log(index)))


CHECKS: dict[str, Callable[[History, Index], tuple[list[dict], int]]] = {
    "final_masters": check_final_masters,
    "acked_lost": check_acked_lost,
    "async_loss_bound": check_async_loss_bound,
    "order": check_order,
    "read_lost": check_read_lost,
    "split_brain": check_split_brain,
    "replica_prefix": check_replica_prefix,
    "duplicates": check_duplicates,
    "phantoms": check_phantoms,
    "liveness": lambda history, index: (index.liveness.violations, len(index.liveness.faults)),
    **anomalies.CHECKS,
    "inconsistent-offsets": check_inconsistent_offsets,  # in place: Jepsen's, plus the async allowance
}

#: The checks that are Jepsen's Kafka workload anomalies under another name here.
JEPSEN_NAMES = {"acked_lost": "lost-write"}


# --- result --------------------------------------------------------------------------


@dataclass
class CheckResult:
    mode: str
    checks: dict[str, dict[str, Any]]
    stats: dict[str, Any]
    warnings: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks.values())

    def violations(self, name: str | None = None) -> list[dict]:
        names = [name] if name else list(self.checks)
        return [v for n in names for v in self.checks[n]["violations"]]

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "mode": self.mode, "checks": self.checks, "stats": self.stats,
                "warnings": self.warnings}

    def report(self) -> str:
        lines = [f"chaos check: {'PASS' if self.ok else 'FAIL'} (mode {self.mode})"]
        s = self.stats
        lines.append(f"  puts: {s['puts_ok']} ok, {s['puts_fail']} failed, {s['puts_info']} unknown; "
                     f"reads: {s['reads']} messages in {s['gets']} fetches")
        lines.append(f"  faults: {s['faults_by_kind'] or 'none'}; failovers: {s['failovers']}; "
                     f"max gap between acks: {s['max_unavailable_s']:.2f}s; lost acked: {s['lost_acked']}"
                     + (f"; reads a failover took back (async): {s['async_reads_taken_back']}" if self.mode == "async" else ""))
        lines.append(f"  {duplicates_line(s)}; {resends_line(s)}")
        lines.append(f"  {anomalies_line(self.checks)}")
        for name, c in self.checks.items():
            mark = "ok  " if c["ok"] else "FAIL"
            expected = len(c.get("expected", []))
            lines.append(f"  [{mark}] {name}: {c['checked']} checked, {len(c['violations'])} violations"
                         + (f", {expected} expected" if expected else ""))
            for v in c["violations"][:MAX_SHOWN]:
                lines.append(f"         - {v['why']}")
            if len(c["violations"]) > MAX_SHOWN:
                lines.append(f"         ... and {len(c['violations']) - MAX_SHOWN} more")
        lines += render_table(s.get("unavailability", {}), s.get("liveness_bound_s", 0.0))
        for w in self.warnings[:MAX_SHOWN]:
            lines.append(f"  warning: {w['why']}")
        return "\n".join(lines)


def anomalies_line(checks: dict[str, dict[str, Any]]) -> str:
    """Every count of Jepsen's Kafka workload anomaly set on one line (expected ones in brackets)."""
    names = ["acked_lost", *anomalies.CHECKS]
    parts = []
    for name in names:
        c = checks.get(name)
        if c is None:
            continue
        expected = len(c.get("expected", []))
        parts.append(f"{JEPSEN_NAMES.get(name, name)} {len(c['violations'])}" + (f" (+{expected} expected)" if expected else ""))
    return "anomalies: " + ", ".join(parts)


def duplicates_line(stats: dict[str, Any]) -> str:
    """Duplicates, next to lost in every report: how many, and how many at-least-once allows."""
    expected = stats.get("duplicates_expected", 0)
    return (f"duplicates: {stats.get('duplicates', 0)}"
            + (f" ({expected} expected: resent unknown outcomes without idempotence)" if expected else ""))


def resends_line(stats: dict[str, Any]) -> str:
    return (f"unknown outcomes resent: {stats.get('unknown_outcomes_resent', 0)} resends of "
            f"{stats.get('puts_resent_after_unknown', 0)} puts ({stats.get('puts_resent_after_unknown_acked', 0)} "
            f"then acked, {stats.get('resends_acked_as_duplicate', 0)} of them as a duplicate of a stored attempt); "
            f"client puts retried: {stats.get('client_puts_retried', 0)}")


def _stats(history: History, index: Index) -> dict[str, Any]:
    puts = index.puts
    ok_times = sorted(op["time"] for op in puts if op["type"] == "ok")
    invoke_times = [op["time"] for op in history.ops if op.get("f") == "put" and op["type"] == "invoke"]
    gap = 0.0
    if invoke_times:
        points = [min(invoke_times)] + ok_times + [max(op["time"] for op in puts)] if puts else []
        gap = max((b - a for a, b in zip(points, points[1:])), default=0.0)
    lost, _moved, _n = index.lost_and_moved
    copies = stored_twice(index)
    resent_values = {op.get("value") for op in puts if resent(op)}
    raw_resends = [op for op in puts if op.get("resent_after_unknown")]
    return {
        "puts_ok": sum(op["type"] == "ok" for op in puts),
        "puts_fail": sum(op["type"] == "fail" for op in puts),
        "puts_info": sum(op["type"] == "info" for op in puts),
        "gets": len(index.gets),
        "reads": sum(len(op.get("reads", [])) for op in index.gets),
        "faults": len(history.faults),
        "faults_by_kind": dict(Counter(f.get("kind") for f in history.faults)),
        "failovers": len(history.failovers),
        "max_unavailable_s": round(gap, 3),
        "lost_acked": len(lost),
        # Records read that an async failover then took back inside its lag (not violations).
        "async_reads_taken_back": index.taken_back.count,
        # Extra copies: a value stored n times counts n - 1.
        "duplicates": sum(len(at) - 1 for at in copies.values()),
        "duplicates_expected": sum(len(at) - 1 for value, at in copies.items()
                                   if duplicates_expected(history) and value in resent_values),
        # Puts resent after an unknown outcome (raw producers, which know why they resend),
        # and how many of those ended acked; the client's retried puts (any reason).
        "puts_resent_after_unknown": len(raw_resends),
        "puts_resent_after_unknown_acked": sum(op["type"] == "ok" for op in raw_resends),
        "unknown_outcomes_resent": sum(int(op["resent_after_unknown"]) for op in raw_resends),
        # Resends the broker answered as a duplicate: an earlier attempt had been stored.
        "resends_acked_as_duplicate": sum(bool(op.get("duplicate")) for op in raw_resends),
        "client_puts_retried": sum(resent(op) for op in puts if "resent_after_unknown" not in op),
        "liveness_bound_s": liveness_bound(history),
        "unavailability": table(index.liveness.faults),
        "liveness_faults": index.liveness.faults,
    }


def check(history: History, only: list[str] | None = None) -> CheckResult:
    index = build_index(history)
    checks = {}
    for name, fn in CHECKS.items():
        if only and name not in only:
            continue
        violations, checked, *allowed = fn(history, index)
        # ``expected``: anomalies the mode allows (counted and shown, never a failure).
        checks[name] = {"ok": not violations, "checked": checked, "violations": violations,
                        "expected": allowed[0] if allowed else []}
    warnings = stale_acks(history, index) + index.liveness.warnings
    stats = _stats(history, index)
    stats["anomalies"] = {JEPSEN_NAMES.get(name, name): len(checks[name]["violations"])
                          for name in ["acked_lost", *anomalies.CHECKS] if name in checks}
    return CheckResult(history.meta.get("mode", "sync"), checks, stats, warnings)
