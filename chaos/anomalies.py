"""The anomaly set of Jepsen's Kafka workload, checked on a chaos history (chaos.history).

Each check is ``history, index -> (violations, checked[, expected])`` like the checks of
chaos.checker, which registers them under Jepsen's names; ``expected`` lists anomalies
the mode allows (they are counted, never a failure). ``lost-write`` is chaos.checker's
``acked_lost``. The final master logs (``index.logs``) are the committed logs: "a
committed message" is a record there that the reader's isolation shows (a read-committed
consumer never sees control records, rolled-back transactions' messages, or messages of
transactions whose outcome is unknown, so skipping those is no skip).

Reads come in *batches*: one poll of one partition by a consumer (``f: poll``), one raw
fetch (``f: get``, read uncommitted), or the reads of a consume-transform-produce
transaction (``f: txn``). A consumer's *stream* is its batches of one partition within one
assignment epoch (``process``, ``generation``): only there does its position carry over.

In async mode a failover may take back acked messages (bounded by ``async_loss_bound``);
a skip, a step back or a rewritten offset is then expected only when a failover explains it
by its lag window (``index.lag_windows``): a read beside a skip is one it took back
(``index.taken_back``) and what was skipped lies in its window (``skip_taken_back_by``),
what was stepped back over is a read it took back, a rewritten offset's other values are
reads or acks it took back (chaos.checker judges that last one), an aborted read follows a
COMMIT marker it took back. A transaction whose client gave up is judged by its COMMIT or
ABORT marker in the final logs (``transaction_marker``).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

import networkx as nx

from chaos.history import CONTROL_PREFIX, History, brief, group_of, is_control
from chaos.topic_ops import check_topic_ops
from metaq.txn.control import ControlError, Kind, decode_body

READ_COMMITTED = "read_committed"


@dataclass
class Batch:
    """Messages one read returned from one partition, in the order returned."""

    op: dict[str, Any]
    partition: str
    pairs: list[tuple[int, Any]]
    isolation: str

    @property
    def stream(self) -> tuple[str, Any, str] | None:
        """(process, generation, partition) for a consumer's poll; None for other reads."""
        if self.op.get("f") != "poll":
            return None
        return (self.op.get("process"), self.op.get("generation"), self.partition)

    @property
    def committed_only(self) -> bool:
        return self.isolation == READ_COMMITTED


@dataclass
class Write:
    """One message a producer sent: a plain put, or one send of a transaction."""

    op: dict[str, Any]
    partition: str | None
    offset: int | None
    value: Any
    #: A transaction's outcome as its COMMIT or ABORT marker in the final logs says (None:
    #: no marker found, or a plain put). The marker is the truth: it is what readers obey.
    marker: str | None = None

    @property
    def transactional(self) -> bool:
        return self.op.get("f") == "txn"

    @property
    def client_committed(self) -> bool:
        """Its client was told it was acked (a put) or committed (a transaction)."""
        return self.op["type"] == "ok"

    @property
    def committed(self) -> bool:
        """Acked put, or committed transaction (by its marker, else by what its client was
        told): its message must be read (committed)."""
        if self.marker is not None:
            return self.marker == "COMMIT"
        return self.op["type"] == "ok"

    @property
    def aborted(self) -> bool:
        """Definitely not committed: a failed put, a rolled-back or timed-out transaction (by
        its marker, else by what its client was told)."""
        if self.marker is not None:
            return self.marker == "ABORT"
        return self.op["type"] == "fail"


@dataclass
class View:
    """What every anomaly check reads, built once per history."""

    batches: list[Batch]
    writes: list[Write]
    writer: dict[Any, Write]  # value -> its write (workload values are unique)
    txns: list[dict[str, Any]]  # completed transactions
    committed_offsets: dict[str, list[int]]  # partition -> sorted offsets of the final log's records
    final_value: dict[str, dict[int, Any]]  # partition -> offset -> value in the final log
    final_offset: dict[tuple[str, Any], int]  # (partition, value) -> its first offset in the final log
    failover_times: dict[int | None, list[float]] = field(default_factory=dict)


def build_view(history: History, logs: dict[str, Any]) -> View:
    completions = history.completions()
    batches: list[Batch] = []
    writes: list[Write] = []
    txns: list[dict[str, Any]] = []
    for op in completions:
        f = op.get("f")
        if f == "get" and op["type"] == "ok":
            batches.append(Batch(op, op.get("partition"), _pairs(op.get("reads")), op.get("isolation", "read_uncommitted")))
        elif f == "poll" and op["type"] == "ok":
            for partition, pairs in (op.get("polls") or {}).items():
                batches.append(Batch(op, partition, _pairs(pairs), op.get("isolation", READ_COMMITTED)))
        elif f == "put":
            writes.append(Write(op, op.get("partition"), op.get("offset"), op.get("value")))
        elif f == "txn":
            txns.append(op)
            marker = transaction_marker(logs, op)
            for partition, offset, value in op.get("sends") or []:
                writes.append(Write(op, partition, offset, value, marker))
            if op["type"] == "ok":
                for partition, pairs in (op.get("reads") or {}).items():
                    batches.append(Batch(op, partition, _pairs(pairs), READ_COMMITTED))
    committed_offsets = {p: [r[0] for r in log.records] for p, log in logs.items()}
    final_value = {p: {r[0]: r[3] for r in log.records} for p, log in logs.items()}
    final_offset: dict[tuple[str, Any], int] = {}
    for p, values in final_value.items():
        for offset, value in values.items():
            final_offset.setdefault((p, value), offset)
    failover_times: dict[int | None, list[float]] = defaultdict(list)
    for fo in history.failovers:
        failover_times[fo.get("group")].append(float(fo["time"]))
    return View(batches, writes, {w.value: w for w in writes}, txns, committed_offsets, final_value, final_offset,
                {g: sorted(ts) for g, ts in failover_times.items()})


def _controls(log: Any) -> tuple[list[int], list[Any]]:
    """A final log's control records, decoded: (their offsets, sorted; the controls)."""
    cached = getattr(log, "_controls", None)
    if cached is None:
        offsets, controls = [], []
        for offset, _size, _crc, value in log.records:
            if is_control(value):
                try:
                    controls.append(decode_body(bytes.fromhex(value[len(CONTROL_PREFIX):])))
                except (ValueError, ControlError):
                    continue
                offsets.append(offset)
        cached = log._controls = (offsets, controls)
    return cached


def transaction_marker(logs: dict[str, Any], op: dict[str, Any]) -> str | None:
    """``"COMMIT"`` / ``"ABORT"``: what the final logs' markers say of transaction ``op``, whatever
    its client saw (None: no stored message of it, or no marker after one). Each stored
    message is found at its acked offset (else by its value), the BATCH header before it
    names its producer and transactional id, and the first COMMIT or ABORT marker of that
    producer and id after it decides it; markers that disagree between partitions leave it
    undecided (the ``aborted-read`` and ``acked_lost`` checks then judge by the client)."""
    found: set[str] = set()
    for log, i, batch in _stored_batches(logs, op):
        _offsets, controls = _controls(log)
        end = next((c for c in controls[i:] if c.kind in (Kind.COMMIT, Kind.ABORT)
                    and c.txid == batch.txid and c.producer_id == batch.producer_id), None)
        if end is not None:
            found.add(end.kind.name)
    return found.pop() if len(found) == 1 else None


def transaction_ids(logs: dict[str, Any], op: dict[str, Any]) -> set[tuple[str, int]]:
    """``(txid, producer id)`` of transaction ``op`` as the BATCH headers of its stored
    messages in the final logs name it (empty when none of its messages was stored)."""
    return {(batch.txid, batch.producer_id) for _log, _i, batch in _stored_batches(logs, op)}


def _stored_batches(logs: dict[str, Any], op: dict[str, Any]) -> Iterable[tuple[Any, int, Any]]:
    """For each stored message of transaction ``op`` (at its acked offset, else found by its
    value): its final log, the index of the first control record after it, and the BATCH
    header before it (when that header names a transaction)."""
    for partition, offset, value in op.get("sends") or []:
        log = logs.get(partition)
        if log is None:
            continue
        if offset is None or not any(r[0] == offset and r[3] == value for r in _record_at(log, offset)):
            offset = next((r[0] for r in log.records if r[3] == value), None)
            if offset is None:
                continue
        offsets, controls = _controls(log)
        i = bisect.bisect_left(offsets, offset)
        batch = next((controls[j] for j in range(i - 1, -1, -1) if controls[j].kind == Kind.BATCH), None)
        if batch is not None and batch.txid:
            yield log, i, batch


def _record_at(log: Any, offset: int) -> list[list[Any]]:
    at = log.by_offset.get(offset)
    return [[offset, at[1], at[2], at[0]]] if at is not None else []


def _pairs(raw: Iterable[Any] | None) -> list[tuple[int, Any]]:
    return [(int(o), v) for o, v in raw or []]


def _async(history: History) -> bool:
    return history.meta.get("mode", "sync") == "async"


#: How much later than the failover itself the monitor may record it: it polls ZooKeeper
#: every 0.1 s, and on a loaded machine a poll can take most of a second. Campaign seed 3026:
#: a reader got the new master's record at an offset 0.04 s before the failover was recorded.
FAILOVER_SEEN_LATE_S = 1.0


def failover_between(history: History, view: View, partition: str | None, t0: float, t1: float) -> bool:
    """Async only: whether a failover of the partition's group happened in [t0, t1] (as
    recorded: up to FAILOVER_SEEN_LATE_S after it happened); it may have taken back what
    was read or acked before it, so what follows may differ."""
    if not _async(history):
        return False
    times = view.failover_times.get(group_of(partition), [])
    i = bisect.bisect_left(times, min(t0, t1))
    return i < len(times) and times[i] <= max(t0, t1) + FAILOVER_SEEN_LATE_S


def must_see(view: View, batch: Batch, value: Any) -> bool:
    """Whether the reader of ``batch`` must be shown a final-log record holding ``value``."""
    if not batch.committed_only:
        return True  # a raw read returns every record, control records included
    if is_control(value):
        return False
    write = view.writer.get(value)
    if write is None or not write.transactional:
        return True  # a plain put (any outcome: it is in the final log) or a foreign record
    return write.committed  # rolled-back and unknown transactions are filtered


def skipped(view: View, batch: Batch, after: int, before: int) -> list[tuple[int, Any]]:
    """Final-log records strictly between two offsets that the reader of ``batch`` must see."""
    offsets = view.committed_offsets.get(batch.partition, [])
    lo, hi = bisect.bisect_right(offsets, after), bisect.bisect_left(offsets, before)
    values = view.final_value[batch.partition] if offsets else {}
    return [(o, values[o]) for o in offsets[lo:hi] if must_see(view, batch, values[o])]


def _streams(view: View) -> dict[tuple[str, Any, str], list[Batch]]:
    streams: dict[tuple[str, Any, str], list[Batch]] = defaultdict(list)
    for batch in view.batches:
        if batch.stream is not None and batch.pairs:
            streams[batch.stream].append(batch)
    return streams


def _case(kind: str, why: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, **fields, "why": why}


# --- the checks --------------------------------------------------------------------------------


def check_unseen(history: History, index: Any) -> tuple[list[dict], int, list[dict]]:
    """Every acked put and committed transactional message in the final log was delivered to
    every consumer group that ran to the end (``meta["consumer_groups"][g]["drained"]``).

    Async only, expected (docs/guarantees.md, A3): a message at an offset inside a failover's
    lag window (``index.in_lag_window``) that the group had already read past on records
    that failover took back (reads ``index.taken_back`` excuses). The group's committed
    offset moved past them; the new master writes other messages at those offsets, and the
    group, not knowing its position's log was cut, goes on from where it was (campaign seed
    3026). Any other message the group never got is a violation."""
    view: View = index.kafka
    drained = [g for g, info in (history.meta.get("consumer_groups") or {}).items() if info.get("drained")]
    out, expected, checked = [], [], 0
    taken_back = index.taken_back.excused
    for group in sorted(drained):
        delivered: set[Any] = set()
        topics: set[str] = set()
        #: partition -> the highest offset the group read a record at that a failover took back.
        read_past: dict[str, int] = {}
        for batch in view.batches:
            if batch.op.get("f") == "poll" and batch.op.get("group") == group:
                delivered.update(v for _o, v in batch.pairs)
                topics.add(batch.partition.rsplit("/", 1)[0])
                for offset, value in batch.pairs:
                    if value in taken_back.get((batch.partition, offset), ()):
                        read_past[batch.partition] = max(offset, read_past.get(batch.partition, -1))
        for w in view.writes:
            if not w.committed or w.partition is None or w.partition.rsplit("/", 1)[0] not in topics:
                continue
            final_offset = view.final_offset.get((w.partition, w.value))
            if final_offset is None:
                continue  # not in the final log: lost-write's case, not unseen's
            checked += 1
            if w.value not in delivered:
                case = _case("unseen", f"{w.value!r} ({w.partition}@{final_offset}) was acked but never delivered "
                                       f"to group {group}",
                             group=group, value=w.value, partition=w.partition, offset=final_offset,
                             writer=brief(w.op))
                replaced_taken_back = (final_offset <= read_past.get(w.partition, -1)
                                       and index.in_lag_window(w.partition, final_offset))
                (expected if replaced_taken_back else out).append(case)
    return out, checked, expected


def check_duplicate(history: History, index: Any) -> tuple[list[dict], int, list[dict]]:
    """No consumer is given one message twice within one assignment epoch (a redelivery after a
    rebalance, crash or restart starts a new epoch and is allowed; a value *stored* twice is
    the ``duplicates`` check).

    Given once from each of two offsets that both hold the value in the final log, the
    consumer was given two stored copies, not one message twice: expected here, and the
    ``duplicates`` check judges whether storing it twice was allowed (a resent put under at
    least once) or a violation (exactly once, or a put that was never resent)."""
    view: View = index.kafka
    out, checked, expected = [], 0, []
    for stream, batches in _streams(view).items():
        final = view.final_value.get(stream[2], {})
        first_seen: dict[Any, tuple[int, dict]] = {}
        for batch in batches:
            for offset, value in batch.pairs:
                checked += 1
                if value in first_seen:
                    at, op = first_seen[value]
                    case = _case("duplicate", f"{stream[0]} was given {value!r} twice in generation {stream[1]} "
                                              f"of {stream[2]}: at {at} and at {offset}",
                                 process=stream[0], generation=stream[1], partition=stream[2], value=value,
                                 offsets=[at, offset], ops=[brief(op), brief(batch.op)])
                    two_stored_copies = at != offset and final.get(at) == value and final.get(offset) == value
                    (expected if two_stored_copies else out).append(case)
                else:
                    first_seen[value] = (offset, batch.op)
    return out, checked, expected


def check_inconsistent_offsets(history: History, index: Any) -> tuple[list[dict], int, list[dict]]:
    """Every observation of one (partition, offset) names one value: acked sends, every read,
    and the final log (Jepsen's version-order divergence)."""
    view: View = index.kafka
    seen: dict[tuple[str, int], dict[Any, float]] = defaultdict(dict)  # -> value -> first time observed
    end = max((op["time"] for op in history.ops), default=0.0)
    for w in view.writes:
        if w.committed and w.offset is not None and w.partition is not None:
            seen[(w.partition, w.offset)].setdefault(w.value, w.op["time"])
    for batch in view.batches:
        for offset, value in batch.pairs:
            seen[(batch.partition, offset)].setdefault(value, batch.op["time"])
    for partition, values in view.final_value.items():
        for offset, value in values.items():
            seen[(partition, offset)].setdefault(value, end)
    out, expected = [], []
    for (partition, offset), values in sorted(seen.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        if len(values) < 2:
            continue
        times = sorted(values.values())
        case = _case("inconsistent-offsets", f"{partition}@{offset} was seen holding {len(values)} values: "
                                             f"{sorted(map(str, values))}",
                     partition=partition, offset=offset, values=sorted(map(str, values)))
        (expected if failover_between(history, view, partition, times[0], times[-1]) else out).append(case)
    return out, len(seen), expected


def _poll_order(history: History, index: Any, kind: str) -> tuple[list[dict], int, list[dict]]:
    """``poll-skip`` / ``nonmonotonic-poll``: a consumer's next poll of a partition, within one
    assignment epoch, starts right after where its previous poll of it ended."""
    view: View = index.kafka
    out, expected, checked = [], [], 0
    for (process, generation, partition), batches in _streams(view).items():
        for prev, batch in zip(batches, batches[1:]):
            checked += 1
            last, first = prev.pairs[-1][0], batch.pairs[0][0]
            fields = {"process": process, "generation": generation, "partition": partition,
                      "ops": [brief(prev.op), brief(batch.op)]}
            if kind == "nonmonotonic-poll" and first <= last:
                case = _case(kind, f"{process} polled {partition} at {first} after a poll ending at {last} "
                                   f"(generation {generation})", offsets=[last, first], **fields)
            elif kind == "poll-skip" and first > last and (gap := skipped(view, batch, last, first)):
                case = _case(kind, f"{process} polled {partition} up to {last}, then from {first}: skipped "
                                   f"{len(gap)} committed messages {gap[:5]} (generation {generation})",
                             offsets=[last, first], skipped=gap, **fields)
            else:
                continue
            if kind == "poll-skip":
                # A skip is a failover's when the read on either side of the gap is one it took back.
                excused = _excuse_skip(index, case, [prev.pairs[-1], batch.pairs[0]])
            else:
                window = (prev.op["time"], batch.op["time"])
                excused = (failover_between(history, view, partition, *window)
                           and _taken_back_over(index, partition, prev.pairs, first))
            (expected if excused else out).append(case)
    return out, checked, expected


def failover_name(failover: dict[str, Any]) -> str:
    """How a report names a failover: when it was recorded, its epoch, old and new master."""
    return (f"the failover at {float(failover['time']):.2f}s to epoch {failover.get('epoch')} "
            f"({failover.get('old_master')} -> {failover.get('new_master')})")


def skip_taken_back_by(index: Any, partition: str, edges: list[tuple[int, Any]],
                       skipped_records: list[tuple[int, Any]]) -> dict[str, Any] | None:
    """Async: the failover that explains a reader passing over ``skipped_records`` (final-log
    records) in ``partition``, or None. ``edges`` are the reads on either side of the gap
    (the last record before it, the first after it). The failover explains it when one of
    them is a read it took back inside its lag window (``index.taken_back``: the reader was
    reading the old master's log, which had other records there, or none the reader is
    shown) and every skipped record lies in that failover's lag window (the new master
    wrote it where the taken-back records had been). The rule of ``read_lost``: a failover
    whose lag window does not hold the reads excuses nothing, whenever it came."""
    for offset, value in edges:
        i = index.taken_back.failover_of(partition, offset, value)
        window = next((w for j, _f, w in index.lag_windows(partition) if j == i), None) if i is not None else None
        if window is not None and all(window[0] <= o < window[1] for o, _v in skipped_records):
            return index.history.failovers[i]
    return None


def _excuse_skip(index: Any, case: dict[str, Any], edges: list[tuple[int, Any]]) -> bool:
    """Whether a failover explains the skip ``case`` (``skip_taken_back_by``); if so, the case
    names it (``taken_back_by``)."""
    failover = skip_taken_back_by(index, case["partition"], edges, case.get("skipped", []))
    if failover is not None:
        case["taken_back_by"] = failover_name(failover)
        case["why"] += f" (reads of records {failover_name(failover)} took back)"
    return failover is not None


def _taken_back_over(index: Any, partition: str, earlier: list[tuple[int, Any]], next_offset: int) -> bool:
    """Async: whether a failover explains a reader's step back in ``partition``: every record
    it had read at or past ``next_offset`` (where it went on from) is a read a failover took
    back inside its lag window."""
    taken = index.taken_back.excused
    stepped_over = [(o, v) for o, v in earlier if o >= next_offset]
    return all(v in taken.get((partition, o), ()) for o, v in stepped_over)


def check_poll_skip(history: History, index: Any) -> tuple[list[dict], int, list[dict]]:
    return _poll_order(history, index, "poll-skip")


def check_nonmonotonic_poll(history: History, index: Any) -> tuple[list[dict], int, list[dict]]:
    return _poll_order(history, index, "nonmonotonic-poll")


def check_nonmonotonic_send(history: History, index: Any) -> tuple[list[dict], int, list[dict]]:
    """One producer's acked sends to one partition, in the order they completed, have rising
    offsets."""
    view: View = index.kafka
    last: dict[tuple[Any, str], Write] = {}
    out, expected, checked = [], [], 0
    for w in sorted((w for w in view.writes if w.committed and w.offset is not None), key=lambda w: w.op["time"]):
        key = (w.op.get("process"), w.partition)
        before = last.get(key)
        if before is not None and before.op is w.op:
            # One transaction's sends share a completion: the next send is judged
            # against the highest of them.
            last[key] = max(before, w, key=lambda x: x.offset)
            continue
        last[key] = w
        if before is None:
            continue
        checked += 1
        if w.offset <= before.offset:  # type: ignore[operator]
            case = _case("nonmonotonic-send", f"{key[0]} had {w.value!r} acked at {w.partition}@{w.offset} after "
                                              f"{before.value!r} at {before.offset}",
                         process=key[0], partition=w.partition, offsets=[before.offset, w.offset],
                         ops=[brief(before.op), brief(w.op)])
            window = (before.op["time"], w.op["time"])
            # A step back is a failover's only when the earlier ack is one it took back.
            taken = index.async_losses.excused.get((w.partition, before.offset), ())
            (expected if failover_between(history, view, w.partition, *window) and before.value in taken
             else out).append(case)
    return out, checked, expected


def _within_batch(history: History, index: Any, kind: str) -> tuple[list[dict], int, list[dict]]:
    """``int-poll-skip`` / ``int-nonmonotonic-poll``: inside one read's batch, each message
    follows the previous one directly (no committed message between, never backwards)."""
    view: View = index.kafka
    out, expected, checked = [], [], 0
    for batch in view.batches:
        for (a, va), (b, vb) in zip(batch.pairs, batch.pairs[1:]):
            checked += 1
            fields = {"partition": batch.partition, "op": brief(batch.op), "offsets": [a, b]}
            if kind == "int-nonmonotonic-poll" and b <= a:
                case = _case(kind, f"one read of {batch.partition} by {batch.op.get('process')} went from "
                                   f"{a} ({va!r}) to {b} ({vb!r})", **fields)
            elif kind == "int-poll-skip" and b > a and (gap := skipped(view, batch, a, b)):
                case = _case(kind, f"one read of {batch.partition} by {batch.op.get('process')} went from {a} to "
                                   f"{b}, skipping {len(gap)} committed messages {gap[:5]}", skipped=gap, **fields)
            else:
                continue
            if kind == "int-poll-skip":
                excused = _excuse_skip(index, case, [(a, va), (b, vb)])
            else:
                t = batch.op["time"]
                excused = (failover_between(history, view, batch.partition, t, t)
                           and _taken_back_over(index, batch.partition, [(a, va)], b))
            (expected if excused else out).append(case)
    return out, checked, expected


def check_int_poll_skip(history: History, index: Any) -> tuple[list[dict], int, list[dict]]:
    return _within_batch(history, index, "int-poll-skip")


def check_int_nonmonotonic_poll(history: History, index: Any) -> tuple[list[dict], int, list[dict]]:
    return _within_batch(history, index, "int-nonmonotonic-poll")


def check_precommitted_read(history: History, index: Any) -> tuple[list[dict], int]:
    """No read-committed read shows a transaction's message before that transaction commits:
    neither a read that completed before its commit was invoked, nor a transaction reading
    its own writes (Jepsen's case: in Kafka's model a send is invisible to every poll until
    its transaction commits)."""
    view: View = index.kafka
    out, checked = [], 0
    for batch in view.batches:
        if not batch.committed_only:
            continue
        for offset, value in batch.pairs:
            write = view.writer.get(value)
            if write is None or not write.transactional:
                continue
            checked += 1
            commit_time = write.op.get("commit_time")
            if write.op is batch.op:
                why = f"transaction {write.op.get('txn')} read its own message {value!r} at {batch.partition}@{offset}"
            elif commit_time is not None and batch.op["time"] < commit_time:
                why = (f"{batch.op.get('process')} read {value!r} at {batch.partition}@{offset} at "
                       f"{batch.op['time']}, before transaction {write.op.get('txn')} began to commit ({commit_time})")
            else:
                continue
            out.append(_case("precommitted-read", why, partition=batch.partition, offset=offset, value=value,
                             reader=brief(batch.op), writer=brief(write.op)))
    return out, checked


def check_aborted_read(history: History, index: Any) -> tuple[list[dict], int, list[dict]]:
    """G1a: no read shows a message whose write definitely failed; no read-committed read shows
    a message of a rolled-back or timed-out transaction.

    Async only, expected: a message of a transaction whose client was not told it failed,
    one of whose COMMIT markers a reader got and a failover then took back inside its lag
    window (``index.taken_back``), when that failover's lag window reaches into the read's
    partition: the reader read the old master's log, where the transaction had committed;
    the new master lacked the marker and decided it otherwise (an unprepared transaction is
    aborted at the takeover, a prepared one rolled back at its timeout). A client told the
    transaction failed while its COMMIT marker was served is never excused: a definite
    failure must mean not committed."""
    view: View = index.kafka
    out, expected, checked = [], [], 0
    commits = _commits_taken_back(index) if _async(history) else {}
    for batch in view.batches:
        for offset, value in batch.pairs:
            write = view.writer.get(value)
            if write is None or (write.transactional and not batch.committed_only):
                continue  # a raw read shows an aborted transaction's records (the abort marker hides them)
            checked += 1
            if not write.aborted:
                continue
            if not write.transactional:
                what = "put failed"
            elif write.op["type"] == "fail":
                what = f"transaction {write.op.get('txn')} failed"
            else:
                what = (f"transaction {write.op.get('txn')} was rolled back (its final marker: ABORT; "
                        f"its client was told {'committed' if write.op['type'] == 'ok' else 'nothing sure'})")
            case = _case("aborted-read", f"{batch.op.get('process')} read {value!r} at {batch.partition}@{offset}, "
                                         f"whose {what}",
                         partition=batch.partition, offset=offset, value=value,
                         reader=brief(batch.op), writer=brief(write.op))
            failover = None
            if write.transactional and write.op["type"] != "fail":
                failover = _commit_taken_back_by(index, commits, write, batch.partition)
            if failover is not None:
                case["taken_back_by"] = failover_name(failover)
                case["why"] += f": a COMMIT marker of it was read, and {failover_name(failover)} took it back"
            (expected if failover is not None else out).append(case)
    return out, checked, expected


def _commits_taken_back(index: Any) -> dict[tuple[str, int], int]:
    """``(txid, producer id)`` -> the failover (its index in ``history.failovers``) that took
    back, inside its lag window, a COMMIT marker of that transaction which a raw reader got."""
    out: dict[tuple[str, int], int] = {}
    for batch in index.kafka.batches:
        for offset, value in batch.pairs:
            if not is_control(value):
                continue
            i = index.taken_back.failover_of(batch.partition, offset, value)
            if i is None:
                continue
            try:
                control = decode_body(bytes.fromhex(value[len(CONTROL_PREFIX):]))
            except (ValueError, ControlError):
                continue
            if control.kind == Kind.COMMIT and control.txid:
                out.setdefault((control.txid, control.producer_id), i)
    return out


def _commit_taken_back_by(index: Any, commits: dict[tuple[str, int], int], write: Write,
                          partition: str) -> dict[str, Any] | None:
    """The failover that took back a COMMIT marker of ``write``'s transaction (``commits``),
    if its lag window reaches into ``partition``; None otherwise."""
    for ids in transaction_ids(index.logs, write.op):
        i = commits.get(ids)
        if i is not None and any(j == i for j, _f, _w in index.lag_windows(partition)):
            return index.history.failovers[i]
    return None


def check_intermediate_read(history: History, index: Any) -> tuple[list[dict], int]:
    """G1b: a read-committed consumer that saw a committed transaction's message in a partition
    and read past that transaction's last message there saw all its messages there (within
    one assignment epoch, or one consume-transform-produce transaction): no torn transaction."""
    view: View = index.kafka
    txn_offsets: dict[tuple[int, str], dict[int, Any]] = defaultdict(dict)  # (txn op id, partition) -> offset -> value
    for w in view.writes:
        if w.transactional and w.committed and w.partition is not None:
            offset = w.offset if w.offset is not None else view.final_offset.get((w.partition, w.value))
            if offset is not None:
                txn_offsets[(w.op["id"], w.partition)][offset] = w.value
    readers: dict[Any, list[Batch]] = defaultdict(list)
    for batch in view.batches:
        if batch.committed_only and batch.pairs:
            readers[batch.stream or ("txn", batch.op["id"], batch.partition)].append(batch)
    out, checked = [], 0
    for stream, batches in readers.items():
        pairs = [pair for b in batches for pair in b.pairs]
        read = {o for o, _v in pairs}
        lo, hi = min(read), max(read)
        partition = batches[0].partition
        for txn_id in {view.writer[v].op["id"] for _o, v in pairs
                       if v in view.writer and view.writer[v].transactional and view.writer[v].committed}:
            mine = txn_offsets.get((txn_id, partition), {})
            if not mine or max(mine) > hi:
                continue  # the reader has not read past this transaction's end yet
            checked += 1
            missed = sorted(o for o in mine if lo <= o <= hi and o not in read)
            if missed:
                name = next(t.get("txn") for t in view.txns if t["id"] == txn_id)
                out.append(_case("intermediate-read", f"{batches[0].op.get('process')} read part of transaction "
                                                      f"{name} in {partition} and went past it, missing offsets "
                                                      f"{missed[:5]}",
                                 partition=partition, txn=name, missed=missed, reader=brief(batches[-1].op)))
    return out, checked


def dependency_graphs(view: View) -> tuple[nx.DiGraph, nx.DiGraph]:
    """(ww, wr) over committed transactions and read-committed reads (nodes: op ids).

    ww: T1 -> T2 when T2's message directly follows T1's in a partition's order among
    committed transactional messages (final log, else acked offsets). wr: T -> R when R
    (a read-committed poll, or a transaction's own reads) read a message T wrote."""
    ww, wr = nx.DiGraph(), nx.DiGraph()
    by_partition: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for w in view.writes:
        if w.transactional and w.committed and w.partition is not None:
            offset = view.final_offset.get((w.partition, w.value), w.offset)
            if offset is not None:
                by_partition[w.partition].append((offset, w.op["id"]))
    for entries in by_partition.values():
        ordered = [txn for _o, txn in sorted(entries)]
        ww.add_edges_from((a, b) for a, b in zip(ordered, ordered[1:]) if a != b)
    for batch in view.batches:
        if not batch.committed_only:
            continue
        for _offset, value in batch.pairs:
            write = view.writer.get(value)
            if write is not None and write.transactional and write.committed and write.op["id"] != batch.op["id"]:
                wr.add_edge(write.op["id"], batch.op["id"])
    return ww, wr


def _cycles(graph: nx.DiGraph) -> list[list[Any]]:
    return [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]


def _txn_names(view: View, ids: list[Any]) -> list[Any]:
    names = {t["id"]: t.get("txn", t["id"]) for t in view.txns}
    return [names.get(i, f"read {i}") for i in ids]


def check_g1c(history: History, index: Any) -> tuple[list[dict], int, list[dict]]:
    """G1c (circular information flow): a cycle of wr edges, each transaction reading what the
    next one wrote. At read committed it cannot happen (each read follows its writer's
    commit, which follows that writer's own reads). Cycles that need ww edges as well are
    expected (Kafka-style transactions do not isolate writes: two transactions' sends
    interleave in every partition they share, as Jepsen allows) and only counted."""
    view: View = index.kafka
    ww, wr = index.kafka_graphs
    pure = _cycles(wr)
    out = [_case("G1c", f"transactions {_txn_names(view, c)} each read another's write", txns=_txn_names(view, c))
           for c in pure]
    in_pure = {n for c in pure for n in c}
    both = nx.compose(ww, wr)
    mixed = [c for c in _cycles(both) if not in_pure & set(c) and any(wr.has_edge(a, b) for a in c for b in c)]
    expected = [_case("G1c", f"ww/wr cycle between {_txn_names(view, c)}", txns=_txn_names(view, c)) for c in mixed]
    return out, both.number_of_nodes(), expected


#: Jepsen's Kafka workload anomalies, by Jepsen's names (``lost-write`` is chaos.checker's ``acked_lost``).
CHECKS = {
    "unseen": check_unseen,
    "duplicate": check_duplicate,
    "inconsistent-offsets": check_inconsistent_offsets,
    "poll-skip": check_poll_skip,
    "nonmonotonic-poll": check_nonmonotonic_poll,
    "nonmonotonic-send": check_nonmonotonic_send,
    "int-poll-skip": check_int_poll_skip,
    "int-nonmonotonic-poll": check_int_nonmonotonic_poll,
    "precommitted-read": check_precommitted_read,
    "aborted-read": check_aborted_read,
    "intermediate-read": check_intermediate_read,
    "G1c": check_g1c,
    # Not Jepsen's: every topic operation of the run left its state on every member (chaos/topic_ops.py).
    "topic-ops": check_topic_ops,
}
