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
``async_loss_bound``(async) each acked write missing from the final log is excused only by
                    a failover of its group recorded after the ack, deposing the epoch it
                    was acked in, whose lag window holds its offset, and no failover by
                    more than its lag (messages, else bytes); every other loss is a
                    violation naming its offset, epoch and the failover compared.
``order``           per partition, if put A completed (ok) before put B was invoked, A's
                    final offset is below B's (real-time order survives failover).
``read_lost``       every message read (offset, value), by raw fetches, consumer polls and
                    transactions' reads, is in the final log at that offset: nobody read a
                    message that a failover later took back. (async: a read that a failover
                    of the group took back inside its lag window is expected, see
                    ``taken_back_reads``; counted in ``stats["async_reads_taken_back"]``.)
``split_brain``     no two masters acked writes in the same epoch of a group (from the
                    ``epoch``/``master`` that each ok put carries); a put acked at a lower
                    epoch after a higher-epoch ack had completed is a warning (``stale_ack``).
``replica_prefix``  after healing, every slave's log of every partition is a byte-identical
                    prefix of its master's (equal record lists: offset, size, CRC32 of the
                    whole record, value; no torn tail; not longer than the master) holding
                    every acked write (the cluster settled: an empty slave log is no proof).
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
``failover``        a master fault held at least the session timeout (or never healed) is
                    followed by a failover of its group.
``time_reads``      (``--time-reads``) each ``offset_for_time`` answer a master or slave gave,
                    offset O for time T with readable range [min_offset, max_offset) at that
                    moment, is judged against the final log: O lies in that range (``latest``:
                    O is its end); no record of the final log in [min_offset, O) has a time
                    >= T (``skipped_newer``: the answer passed over a readable record that
                    new); unless ``latest``, O starts a record of the final log
                    (``not_a_record``, ``past_final_end``) whose time is >= T
                    (``older_than_time``). A record's time is its msg id's time part. (async:
                    offsets at or past a failover's lag window are not judged, the replica
                    may have held records there that the failover took back: counted as
                    expected, ``taken_back``.)
``progress``        something worked: an acked put, a read, and for each workload the run
                    asked for (``meta``) a poll, a committed transaction, a topic operation.
``run``             what the runner saw (``meta["run_problems"]``: settle failures,
                    hostile-peer problems, refused-commit problems, crashed workload tasks).

``CheckResult.ok`` is the one verdict: the run's exit status and ``summary.json``'s ``ok``,
``python -m chaos check``'s exit status and the campaign's rows all are this.

Jepsen's Kafka workload anomalies (chaos/anomalies.py, by Jepsen's names; ``acked_lost`` is
its ``lost-write``): ``unseen``, ``duplicate``, ``inconsistent-offsets``, ``poll-skip``,
``nonmonotonic-poll``, ``nonmonotonic-send``, ``int-poll-skip``, ``int-nonmonotonic-poll``,
``precommitted-read``, ``aborted-read`` (G1a), ``intermediate-read`` (G1b), ``G1c`` (Jepsen's G0, write
cycles, is not checked: Kafka-style transactions do not isolate writes, so it could only be counted).
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
from chaos.liveness import check_liveness, fault_windows, liveness_bound, render_table, table

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

    @cached_property
    def async_losses(self) -> "AsyncLosses":
        """Async: which lost acks a failover excuses, and which none does (``async_loss_bound``)."""
        return judge_async_losses(self.history, self)

    @cached_property
    def puts_by_partition(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for op in self.puts:
            if op["type"] == "ok":
                out[op.get("partition")].append(op)
        return out

    def lag_windows(self, partition: str) -> list[tuple[int, dict[str, Any], tuple[float, float]]]:
        """Every failover of the partition's group that may have taken records of it back:
        ``(its index in history.failovers, the failover, its lag window)`` (``lag_window``)."""
        cache = self.__dict__.setdefault("_lag_windows", {})
        if partition not in cache:
            group = group_of(partition)
            cache[partition] = [(i, f, w) for i, f in enumerate(self.history.failovers)
                                if f.get("group") == group and (w := lag_window(self, f, partition)) is not None]
        return cache[partition]

    def in_lag_window(self, partition: str, offset: int) -> bool:
        """Async: whether a failover of the partition's group may have taken back its ``offset``."""
        if self.history.meta.get("mode", "sync") != "async":
            return False
        return any(lo <= offset < hi for _i, _f, (lo, hi) in self.lag_windows(partition))


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
        if w.transactional and (w.committed or w.client_committed) and w.partition is not None:
            writes.append({**w.op, "partition": w.partition, "offset": w.offset, "value": w.value,
                           "marker": w.marker})
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
        if op.get("marker") == "ABORT":
            # Its client heard the commit; the final log's marker says the broker aborted it.
            # What was lost is the COMMIT marker, whose offset is not known (async: an excuse
            # needs a failover after the commit with a lag in the partition, ``excuses_loss``).
            lost.append({**brief(op), "kind": "lost", "offset": None, "acked_offset": acked,
                         "why": f"transaction {op.get('txn')} committed by its client, "
                                f"but its marker in {partition} says ABORT"})
        elif acked is None:
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


@dataclass
class AsyncLosses:
    """Async mode: the acked writes missing from the final logs, judged one by one."""

    excused: dict[tuple[str, int], set[Any]]  # (partition, offset) -> values a failover took back there
    violations: list[dict]


def excuses_loss(index: Index, failover: dict[str, Any], window: tuple[float, float], op: dict[str, Any]) -> bool:
    """Whether ``failover`` (with its lag ``window`` in op's partition) may have taken back the
    lost ack ``op``: recorded after the ack, deposing the epoch the ack was made in (the
    failover's epoch is higher), and with the acked offset inside its lag window. An ack
    that carries no epoch (the real client's, a transaction's) is judged by time and
    window only; one with no offset by time, epoch and a lag in its partition."""
    if float(failover["time"]) < float(op.get("time", 0.0)):
        return False
    if op.get("epoch") is not None and (failover.get("epoch") is None or int(failover["epoch"]) <= int(op["epoch"])):
        return False
    offset = op.get("offset")
    return offset is None or window[0] <= offset < window[1]


def judge_async_losses(history: History, index: Index) -> AsyncLosses:
    """Each lost ack is excused only by a failover ``excuses_loss`` accepts (the first one,
    in the order recorded); a failover excuses no more lost acks of a partition than its lag
    there held (messages when recorded, else bytes). Everything else is a violation naming
    the offset, the epoch, and the failover it was compared with."""
    if history.meta.get("mode", "sync") != "async":
        return AsyncLosses({}, [])
    lost, _moved, _checked = index.lost_and_moved
    out: list[dict] = []
    charged: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for op in lost:
        partition = op.get("partition")
        candidates = index.lag_windows(partition) if partition in index.logs else []
        excuse = next((i for i, f, window in candidates if excuses_loss(index, f, window, op)), None)
        if excuse is not None:
            charged[(partition, excuse)].append(op)
            continue
        group = group_of(partition)
        later = [f for f in history.failovers if f.get("group") == group and float(f["time"]) >= float(op.get("time", 0))]
        compared = later[0] if later else None
        if compared is None:
            why = f"no failover of group {group} after it was acked"
        else:
            window = lag_window(index, compared, partition)
            why = (f"the failover at {compared['time']:.2f}s to epoch {compared.get('epoch')} "
                   + ("lost nothing there" if window is None else
                      f"took back offsets [{window[0]:g}, {window[1]:g}) only"
                      if op.get("epoch") is None or int(compared.get("epoch") or 0) > int(op["epoch"])
                      else "did not depose that epoch"))
        out.append({"kind": "loss_not_excused", "partition": partition, "offset": op.get("offset"),
                    "epoch": op.get("epoch"), "value": op.get("value"),
                    "failover": None if compared is None else {k: compared.get(k) for k in ("time", "epoch", "old_master",
                                                                                              "new_master", "lag")},
                    "why": f"{op.get('value')!r} acked at {partition}@{op.get('offset')} in epoch {op.get('epoch')} "
                           f"at {float(op.get('time', 0)):.2f}s is lost: {why}"})
    excused: dict[tuple[str, int], set[Any]] = defaultdict(set)
    for (partition, i), ops in sorted(charged.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        lag = history.failovers[i].get("lag", {}).get(partition) or {}
        if "messages" in lag:
            bound, amount, unit = int(lag["messages"]), len(ops), "messages"
        else:
            bound, unit = int(lag.get("bytes", 0)), "bytes"
            amount = sum(int(o.get("size") or 20 + len(str(o.get("value", "")).encode())) for o in ops)
        if amount > bound:
            out.append({"kind": "loss_over_lag", "partition": partition, "lost": len(ops), "lost_amount": amount,
                        "lag_bound": bound, "unit": unit, "failover_time": history.failovers[i]["time"],
                        "values": [o.get("value") for o in ops[:MAX_SHOWN]],
                        "why": f"lost {amount} {unit} in {partition} to the failover at "
                               f"{history.failovers[i]['time']:.2f}s, more than its lag of {bound}"})
            continue
        for o in ops:
            if o.get("offset") is not None:
                excused[(partition, int(o["offset"]))].add(o.get("value"))
    return AsyncLosses(dict(excused), out)


def check_async_loss_bound(history: History, index: Index) -> tuple[list[dict], int]:
    if history.meta.get("mode", "sync") != "async":
        return [], 0
    _lost, _moved, checked = index.lost_and_moved
    return index.async_losses.violations, checked


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
    """Every read, raw fetches and consumer polls alike, got what the final log holds there;
    async: a read a failover took back inside its lag is expected (``taken_back_reads``)."""
    out, expected, checked = [], [], 0
    excused = index.taken_back.excused
    for batch in index.kafka.batches:
        partition = batch.partition
        log = index.logs.get(partition)
        for offset, value in batch.pairs:
            checked += 1
            at = log.by_offset.get(offset) if log else None
            if at is None or at[0] != value:
                case = {"kind": "read_lost", "partition": partition, "offset": offset, "value": value,
                        "f": batch.op.get("f"), "process": batch.op.get("process"),
                        "replica": batch.op.get("replica"), "read_time": batch.op.get("time"),
                        "final_there": at[0] if at else None,
                        "why": f"{batch.op.get('process')} read {value!r} at {partition}@{offset}, the final log has "
                               + (f"{at[0]!r}" if at else "nothing") + " there"}
                (expected if value in excused.get((partition, offset), ()) else out).append(case)
    return out, checked, expected


# --- reads an async failover took back -----------------------------------------------


@dataclass
class TakenBack:
    """Read records the final log no longer holds at their offset that an async failover of
    their group took back inside its replication lag (docs/guarantees.md, async reads)."""

    excused: dict[tuple[str, int], set[Any]]  # (partition, offset) -> the values read there
    #: (partition, offset, value) -> the index in ``history.failovers`` of the failover that took it back.
    by: dict[tuple[str, int, Any], int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(values) for values in self.excused.values())

    def failover_of(self, partition: str, offset: int, value: Any) -> int | None:
        """The failover (its index in ``history.failovers``) that took back the read record
        ``value`` at ``partition@offset`` inside its lag window; None when none did."""
        return self.by.get((partition, offset, value))



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
    for op in index.puts_by_partition.get(partition, []):  # acked puts of the partition
        offset, acked_in = op.get("offset"), op.get("epoch")
        if offset is None or acked_in is None:
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
    failover's lag window (``lag_window``) and that failover's lag in messages (when
    recorded) holds all the reads it is charged with (each read is charged to the first
    failover whose window holds it). Anything else stays a violation of the checks that
    found it."""
    if history.meta.get("mode", "sync") != "async":
        return TakenBack({}, {})
    gone: dict[str, set[tuple[int, Any]]] = defaultdict(set)
    for batch in index.kafka.batches:
        log = index.logs.get(batch.partition)
        for offset, value in batch.pairs:
            at = log.by_offset.get(offset) if log else None
            if at is None or at[0] != value:
                gone[batch.partition].add((offset, value))
    excused: dict[tuple[str, int], set[Any]] = defaultdict(set)
    by: dict[tuple[str, int, Any], int] = {}
    for partition, reads in gone.items():
        charged: dict[int, list[tuple[int, Any]]] = defaultdict(list)
        windows = index.lag_windows(partition)
        for offset, value in sorted(reads, key=lambda r: (r[0], str(r[1]))):
            first = next((i for i, _f, (lo, hi) in windows if lo <= offset < hi), None)
            if first is not None:
                charged[first].append((offset, value))
        for i, inside in charged.items():
            lag = history.failovers[i].get("lag", {}).get(partition) or {}
            if "messages" in lag and len({o for o, _v in inside}) > int(lag["messages"]):
                continue  # more offsets taken back than the lag held: none of it is explained
            for offset, value in inside:
                excused[(partition, offset)].add(value)
                by[(partition, offset, value)] = i
    return TakenBack(dict(excused), by)


def check_inconsistent_offsets(history: History, index: Index) -> tuple[list[dict], int, list[dict]]:
    """Jepsen's ``inconsistent-offsets`` (chaos.anomalies); in async mode an offset is
    expected to have held other values than the final log's only when each of them is a read
    a failover took back inside its lag (``taken_back_reads``) or an ack it took back
    (``judge_async_losses``): every case is judged so, whatever the anomaly check said."""
    out, checked, allowed = anomalies.check_inconsistent_offsets(history, index)
    final = index.kafka.final_value
    violations, expected = [], []
    for case in out + allowed:
        partition, offset = case["partition"], case["offset"]
        taken_back = {str(v) for v in index.taken_back.excused.get((partition, offset), ())}
        taken_back |= {str(v) for v in index.async_losses.excused.get((partition, offset), ())}
        others = set(case["values"]) - {str(final.get(partition, {}).get(offset))}
        (expected if others <= taken_back else violations).append(case)
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


def acked_ends(index: Index) -> dict[str, int]:
    """partition -> where the last acked write still at its offset in the final log ends."""
    ends: dict[str, int] = {}
    for op in acked_writes(index):
        partition, offset = op.get("partition"), op.get("offset")
        log = index.logs.get(partition)
        at = log.by_offset.get(offset) if log is not None and offset is not None else None
        if at is not None and at[0] == op.get("value"):
            ends[partition] = max(ends.get(partition, 0), offset + at[1])
    return ends


def check_replica_prefix(history: History, index: Index) -> tuple[list[dict], int]:
    """Every slave's log is a byte-identical prefix of its master's, and holds every acked
    write: the snapshot is taken after the cluster settled (slaves caught up, the load
    stopped), so a slave shorter than the last acked write, or without the partition at all,
    is not "a prefix" but a replica that lost or never got acked data (an empty slave log is
    a prefix of anything, and would otherwise pass)."""
    out, checked = [], 0
    replicas = history.final.get("replicas", {})
    must_hold = acked_ends(index)
    for group, names in index.masters.items():
        if len(names) != 1:
            continue
        master = replicas[names[0]]
        for name, rep in replicas.items():
            if int(rep["group"]) != group or name == names[0]:
                continue
            for partition, end in sorted(must_hold.items()):
                if group_of(partition) != group or partition not in master.get("partitions", {}):
                    continue
                held = (rep.get("partitions", {}).get(partition) or {}).get("end", 0)
                if held < end:
                    out.append({"kind": "prefix", "group": group, "slave": name, "master": names[0],
                                "partition": partition, "slave_end": held, "acked_end": end,
                                "why": f"slave {name} holds {partition} up to {held} only, short of the last acked "
                                       f"write (ending at {end}) after the cluster settled"})
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
            if value not in invoked:
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


# --- the run's own signals: progress, failovers, what the runner saw ------------------


def check_progress(history: History, index: Index) -> tuple[list[dict], int]:
    """A run where nothing worked proves nothing: at least one acked put and one read, and
    for each workload the run asked for (``meta``: ``consumer_group``, ``transactions``,
    ``topic_ops``) at least one poll that returned messages, one committed transaction, one
    topic operation done."""
    completions = [op for op in history.completions() if op["type"] == "ok"]
    read_ids = {batch.op["id"] for batch in index.kafka.batches if batch.pairs}
    wanted = [("puts", "acked put", lambda op: op.get("f") == "put"),
              ("reads", "read that returned messages (a fetch, a consumer poll or a transaction's read)",
               lambda op: op["id"] in read_ids)]
    if history.meta.get("consumer_group"):
        wanted.append(("polls", "consumer poll that returned messages",
                       lambda op: op.get("f") == "poll" and any((op.get("polls") or {}).values())))
    if history.meta.get("transactions"):
        wanted.append(("transactions", "committed transaction", lambda op: op.get("f") == "txn"))
    if history.meta.get("time_reads"):
        wanted.append(("time_reads", "answered offset_for_time", lambda op: op.get("f") == "time_read"))
    if history.meta.get("topic_ops"):
        wanted.append(("topic_ops", "topic operation done", lambda op: op.get("f") == "topic-op"))
    out = []
    for workload, what, done in wanted:
        if not any(done(op) for op in completions):
            out.append({"kind": "no_progress", "workload": workload,
                        "why": f"no {what} in the whole run: the {workload} workload never worked"})
    return out, len(wanted)


#: Faults that take the master away from ZooKeeper (killed, stopped, cut off, silenced):
#: held past the session timeout, the group must fail over.
MASTER_LOSS_FAULTS = ("kill-master", "lose-master", "pause-master", "partition-master-zk", "silence-master",
                      "power-loss-master", "corrupt-master", "truncate-master")


def check_master_failover(history: History, index: Index) -> tuple[list[dict], int]:
    """Every fault that takes a master away from ZooKeeper for at least the session timeout
    (or for good) is followed by a failover of its group, recorded between the fault's start
    and the liveness bound after its end (its heal; its start when it never heals): its
    session has expired by its heal, and the slave is elected before the old master, just
    restarted or resumed, can register again. Held shorter, the master may keep its
    session: no failover is due; nor is one when the runner recorded that no slave was
    eligible just before the fault (``eligible_slaves`` 0: in sync mode an empty sync set,
    the master having acked alone, V4)."""
    session_s = float(history.meta.get("session_ms", 1500)) / 1000
    bound = liveness_bound(history)
    history_end = max((float(e["time"]) for e in [*history.ops, *history.faults]), default=0.0)
    out, checked = [], 0
    for w in fault_windows(history):
        f = w.fault
        if f.get("kind") not in MASTER_LOSS_FAULTS or f.get("group") is None:
            continue
        if f.get("heals", True) and float(f.get("hold_s") or 0.0) < session_s:
            continue
        if f.get("eligible_slaves") == 0:
            continue  # no slave could take over (sync: an empty sync set), by design (V4)
        failed_over = any(fo.get("group") == f["group"] and w.start <= float(fo["time"]) <= w.end + bound
                          for fo in history.failovers)
        if not failed_over and history_end < w.end + bound:
            continue  # the history ended before the bound: inconclusive (liveness warns of it)
        checked += 1
        if not failed_over:
            out.append({"kind": "no_failover", "fault": f.get("kind"), "target": f.get("target"),
                        "group": f["group"], "start": w.start, "end": w.end,
                        "why": f"{f.get('kind')} on {f.get('target')} at {w.start:.1f}s "
                               + (f"(held {float(f['hold_s']):.1f}s) " if f.get("heals", True) else "(never healed) ")
                               + f"was not followed by a failover of group {f['group']} within {bound:g}s of its end"})
    return out, checked


#: What the runner saw that the history's operations do not show, recorded in
#: ``meta["run_problems"]`` (chaos/runner.py): each entry is a violation.
RUN_PROBLEMS = {
    "settle_failures": "the cluster did not settle",
    "hostile_problems": "hostile peers",
    "txn_problems": "a commit the broker should have refused",
    "workload_crashes": "a workload task crashed",
}


def check_run_problems(history: History, index: Index) -> tuple[list[dict], int]:
    """The runner's own findings (settle failures, accepted forgeries or memory growth under
    hostile peers, commits past a timeout or by a fenced instance, crashed workload tasks).
    A history recorded before the runner kept them has at least its steps' settle failures
    (``settle_timeout`` faults)."""
    problems = history.meta.get("run_problems")
    if problems is None:
        problems = {"settle_failures": [f"after {f.get('of')} on {f.get('target')}: {f.get('why')}"
                                        for f in history.faults if f.get("kind") == "settle_timeout"]}
    out = [{"kind": key, "why": f"{RUN_PROBLEMS.get(key, key)}: {text}"}
           for key in RUN_PROBLEMS for text in problems.get(key) or []]
    return out, sum(len(v or []) for v in problems.values())


@dataclass
class Liveness:
    violations: list[dict]
    warnings: list[dict]
    faults: list[dict]  # one record per (fault, group): recovery and unavailability times


def _liveness(history: History, index: Index) -> Liveness:
    return Liveness(*check_liveness(history, acked_in_final_log(index), unacked_sends_stored(history, index)))


def unacked_sends_stored(history: History, index: Index) -> dict[str, tuple[str, int]]:
    """value -> (partition, offset) in the final log of each transactional send whose ack was
    lost (``[None, None, value]``) but whose record was stored: its transaction holds that
    partition's reads like one whose send was acked (``chaos.liveness``)."""
    unacked = {value for op in history.completions("txn") for _p, offset, value in op.get("sends") or []
               if offset is None}
    stored: dict[str, tuple[str, int]] = {}
    for partition, log in sorted(index.logs.items()):
        for value in unacked & log.by_value.keys():
            stored.setdefault(value, (partition, min(log.by_value[value])))
    return stored


# --- time reads ----------------------------------------------------------------------


@dataclass
class TimedLog:
    """A final log's record offsets and times, with the running maximum of the times."""

    starts: list[int]
    times: list[int]
    running_max: list[int]

    @classmethod
    def of(cls, log: LogIndex, times: list[int]) -> "TimedLog":
        starts = [int(r[0]) for r in log.records[:len(times)]]
        running, top = [], -1
        for t in times:
            top = max(top, t)
            running.append(top)
        return cls(starts, [int(t) for t in times], running)

    def first_newer(self, lo: int, hi: int, time_ms: int) -> int | None:
        """Index of the first record starting in [lo, hi) whose time is >= ``time_ms``."""
        i, j = bisect.bisect_left(self.starts, lo), bisect.bisect_left(self.starts, hi)
        if i >= j or (i == 0 and self.running_max[j - 1] < time_ms):
            return None
        return next((k for k in range(i, j) if self.times[k] >= time_ms), None)


def _timed_logs(history: History, index: Index) -> dict[str, TimedLog]:
    out = {}
    for group, names in index.masters.items():
        if len(names) != 1:
            continue
        for partition, snap in history.final["replicas"][names[0]].get("partitions", {}).items():
            if isinstance(snap.get("times"), list) and partition in index.logs:
                out[partition] = TimedLog.of(index.logs[partition], snap["times"])
    return out


def judge_time_read(op: dict[str, Any], log: TimedLog, cut: float) -> tuple[str, dict[str, Any]] | None:
    """The violation kind (and its details) of one ``offset_for_time`` answer, None when it
    is right. ``cut``: offsets at or past it may have held records a failover took back."""
    asked, offset, latest = int(op["time_ms"]), int(op["offset"]), bool(op.get("latest"))
    low, readable = int(op.get("min_offset", 0)), int(op.get("max_offset", offset))
    if not low <= offset <= readable or (latest and offset != readable):
        return "outside_readable", {"why": f"offset {offset} is not in the readable range [{low}, {readable}]"
                                           + (" or not its end though latest" if latest else "")}
    newer = log.first_newer(low, min(offset, cut), asked)
    if newer is not None:
        at, t = log.starts[newer], log.times[newer]
        return "skipped_newer", {"record": at, "record_time": t,
                                 "why": f"the record at {at} (time {t} >= {asked}) was readable before the answer {offset}"}
    if latest or offset >= cut:
        return None
    k = bisect.bisect_left(log.starts, offset)
    if k == len(log.starts) or log.starts[k] != offset:
        past = k == len(log.starts)
        return ("past_final_end" if past else "not_a_record"), {
            "why": f"offset {offset} is " + ("past the final log's last record" if past
                                               else "not the start of a record in the final log")}
    if log.times[k] < asked:
        return "older_than_time", {"record_time": log.times[k],
                                   "why": f"the record at {offset} has time {log.times[k]} < {asked}"}
    return None


def check_time_reads(history: History, index: Index) -> tuple[list[dict], int, list[dict]]:
    """Every answered ``time_read`` against the final master log of its partition (see the
    module docstring, ``time_reads``)."""
    answers = [op for op in history.completions("time_read") if op["type"] == "ok" and op.get("offset") is not None]
    logs = _timed_logs(history, index) if answers else {}
    is_async = history.meta.get("mode", "sync") == "async"
    out, expected = [], []
    for op in answers:
        partition = op.get("partition")
        log = logs.get(partition)
        case = {**brief(op), "replica": op.get("replica"), "time_ms": op.get("time_ms"), "latest": op.get("latest"),
                "min_offset": op.get("min_offset"), "max_offset": op.get("max_offset")}
        if log is None:
            out.append({"kind": "no_final_times", **case,
                        "why": "no final master log with record times to judge the answer against"})
            continue
        cut = min((lo for _i, _f, (lo, _hi) in index.lag_windows(partition)), default=float("inf")) \
            if is_async else float("inf")
        verdict = judge_time_read(op, log, cut)
        if verdict is not None:
            out.append({"kind": verdict[0], **case, **verdict[1]})
        elif not op.get("latest") and int(op["offset"]) >= cut:
            expected.append({"kind": "taken_back", **case,
                             "why": "answer inside a failover's lag window: not judged"})
    return out, len(answers), expected


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
    "failover": check_master_failover,
    "time_reads": check_time_reads,
    "progress": check_progress,
    "run": check_run_problems,
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
        if s.get("reads_during_exemptions"):
            lines.append("  reads-throughout rule narrowed by open transactions (faults each): "
                         + ", ".join(f"{name} {n}" for name, n in s["reads_during_exemptions"].items()))
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


def reads_during_exemptions(records: list[dict]) -> dict[str, int]:
    """transaction -> the number of faults whose "reads throughout" rule it narrowed to the
    reads below its first record (in any partition)."""
    counts: Counter[str] = Counter()
    for rec in records:
        for name in set((rec.get("reads_held_by_transaction") or {}).values()):
            counts[name] += 1
    return dict(sorted(counts.items()))


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
        # What each workload got done (the campaign's table shows them beside the verdict).
        "workloads": {
            "polls": sum(1 for op in history.ops if op.get("f") == "poll" and op["type"] == "ok"
                         and any((op.get("polls") or {}).values())),
            "transactions_committed": sum(1 for op in history.ops if op.get("f") == "txn" and op["type"] == "ok"),
            "transactions_unknown": sum(1 for op in history.ops if op.get("f") == "txn" and op["type"] == "info"),
            "topic_ops": sum(1 for op in history.ops if op.get("f") == "topic-op" and op["type"] == "ok"),
        },
        "liveness_bound_s": liveness_bound(history),
        # Per transaction: how many faults' reads_during rule it narrowed (V9, chaos/liveness.py).
        "reads_during_exemptions": reads_during_exemptions(index.liveness.faults),
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
