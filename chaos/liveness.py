"""Liveness of a chaos history: after every fault, reads and writes resume within a bound.

The safety checks (``chaos.checker``) prove nothing acked is lost; this module proves the
service comes back. For every injected fault (an entry of ``history.faults`` carrying a
``step``; see ``chaos.runner``)::

    start  S = the fault's time
    end    E = its heal's time, or S when the fault never heals (``heals: false``)
    bound  B = history.meta["liveness_bound_s"], default 2 x session timeout + 1 s

and for every group it touches:

* **writes** (only when the fault entry says ``writes_expected``; a sync group with
  ``onSyncSlaveLoss=reject`` and no eligible slave left refuses writes by design): an acked
  put of the group completes within ``[E, E + B]``;
* **reads**: for every partition of the group, the newest message acked by ``E`` that is in
  the final log (an async failover may legitimately drop acked messages, bounded by the
  lag: ``async_loss_bound``) is read back, or a later one, within ``[E, E + B]`` (later
  when a transaction whose client gave up holds it back: below);
* with ``reads_during`` (ZooKeeper majority lost): reads never stop for longer than ``B``
  between ``S`` (or the partition's first ack, when that comes later: before it there is
  nothing to read) and ``E``, except those of a partition where a transaction undecided
  during the fault holds back the awaited message (below); with ``master_fixed``: no failover of the group
  between ``S`` and ``E``.

A transaction open at ``S`` with a record stored in a partition at or below the newest
message acked there by ``E`` (a master acks until it notices the quorum is gone, so a
message may be acked just after ``S``) pins the partition's last stable offset; so does one
begun after ``S``, before the master noticed, and left undecided for longer than ``B``
(``Timeline.holding_through``), from its invocation on: until then the ``reads_during`` rule
applies unchanged. Read-committed readers, on
the master and on the slaves alike, get nothing past that record until the transaction is
decided, and its decision (a COMMIT or ABORT marker, also the abort of a timeout) is a
write, which needs ZooKeeper's quorum. For such a partition the ``reads_during`` rule is
narrowed to what lies below the transaction's first record: the newest message acked there
below it is read within ``B`` of ``S`` (or of its ack, when acked during the fault); the
reads above it are bounded as writes are: by the **reads** rule, within ``B`` of ``E``. Each
such exemption is named in the fault's record (``reads_held_by_transaction``) and counted per
transaction in the checker's ``stats["reads_during_exemptions"]``.

When a transaction is decided (``decided_at``, per partition holding its first record):

* its client committed it, or heard it rolled back (``ok``; ``fail``, which the workloads
  record only for a confirmed abort): at that completion, the broker having written the
  marker before it answered;
* its client gave up (``info``, outcome unknown): only the broker's timer decides it, at
  ``invoke time + timeout_s + TICK_S`` (the branch starts at its first send, just after
  the invocation; its timer fires every ``TICK_S``). ``timeout_s`` is the one its ``txn``
  operation records; a history without it (older runs recorded it only for transactions
  left open on purpose) falls back to ``TXN_TIMEOUT_S``, what every other transaction of
  the runner's workload asks for, when ``meta["transactions"]`` says that workload ran,
  else to the client's completion (as strict as a decided transaction). An XA branch's
  timeout runs again from its prepare, which comes before its client's completion: for
  one the timeout counts from that completion instead;
* in any case, at the latest, when a read first reached its record or past it (a reader
  never gets past an undecided transaction's record; a client may learn of its decision
  late, a failover's reconcile may abort it before its timeout).

So a transaction whose client gave up holds its partition's reads until its timeout even
when the fault ended long before: for the **reads** rule, when such a transaction,
undecided at ``E``, holds the awaited message (its record at or below the awaited offset),
the awaited read is due within ``B`` of ``max(E, decided_at)``, not of ``E``
(``reads_wait_for_timeout`` in the fault's record names it). A transaction its client
committed or rolled back keeps the bound ``E + B``: its decision is the client's write.

If the history ends, or the next fault begins, before ``E + B`` and before the awaited
event, that is a warning (inconclusive), not a violation.

Unavailability of a fault, for writes and for reads separately, is the longest time
without a success (acks of the group; reads of the partition) from the last success before
``S`` to the first success after ``E``; ``table`` aggregates it per fault kind. Each
per-fault record also names the times around the fault: the last ack before ``S`` and the
first after ``E``, and per partition the last read before ``S`` and the first read of the
awaited message after ``E``.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from chaos.history import History, group_of
from chaos.transactions import TXN_TIMEOUT_S
from metaq.server.transactions import TICK_S

SKIPPED_KINDS = ("heal", "heal_all", "settle_timeout")


def default_bound(session_ms: float) -> float:
    """2 x the ZooKeeper session timeout + 1 s: one session for ZooKeeper to notice a lost
    member, one for the successor's election and first ack, a second of slack for the
    clients' retries."""
    return 2 * float(session_ms) / 1000 + 1.0


def liveness_bound(history: History) -> float:
    bound = history.meta.get("liveness_bound_s")
    if bound is not None:
        return float(bound)
    return default_bound(history.meta.get("session_ms", 1500))


@dataclass
class Window:
    """One fault: when it started, when it ended (healed, or started if it never heals)."""

    fault: dict[str, Any]
    start: float
    end: float
    next_start: float | None = None  # when the next fault was injected (it cuts this window short)

    @property
    def groups(self) -> list[int]:
        if self.fault.get("groups") is not None:
            return list(self.fault["groups"])
        return [int(self.fault["group"])] if self.fault.get("group") is not None else []


def fault_windows(history: History) -> list[Window]:
    """Every injected fault with its window; a healing fault whose heal is missing is left out."""
    out = []
    faults = history.faults
    for i, f in enumerate(faults):
        if f.get("kind") in SKIPPED_KINDS or f.get("target") == "none" or "step" not in f:
            continue
        following = next((g["time"] for g in faults[i + 1:] if "step" in g and g.get("kind") not in SKIPPED_KINDS), None)
        if not f.get("heals", True):
            out.append(Window(f, f["time"], f["time"], following))
            continue
        heal = next((h for h in faults[i + 1:] if h.get("kind") == "heal" and h.get("step") == f["step"]), None)
        if heal is not None:
            out.append(Window(f, f["time"], heal["time"], following))
    return out


def _gap(times: list[float], start: float, until: float | None, history_end: float) -> float:
    """Longest time without a success from the last success at or before ``start`` to ``until``
    (the recovery; the end of the history when there is none)."""
    stop = history_end if until is None else until
    i = bisect.bisect_right(times, start)
    points = ([times[i - 1]] if i else [start]) + [t for t in times[i:] if t <= stop] + [stop]
    return max((b - a for a, b in zip(points, points[1:])), default=0.0)


def _last_at_or_before(times: list[float], t: float) -> float | None:
    i = bisect.bisect_right(times, t)
    return times[i - 1] if i else None


def _first_at_or_after(times: list[float], t: float) -> float | None:
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) else None


@dataclass(frozen=True)
class HeldBy:
    """A transaction with a record in a partition: the read-committed readers of the
    partition get nothing at or past ``first`` from ``invoked`` until ``decided_at``."""

    name: str
    invoked: float
    decided_at: float
    first: int  # its first stored offset in the partition
    unknown: bool  # its client gave up: only the broker's timeout (or a read past it) shows the decision


def _decidable_at(op: dict[str, Any], meta: dict[str, Any]) -> float:
    """When the broker's timer can have decided a transaction whose client gave up (``op``:
    its ``info`` completion): its timeout after its start (XA: after its prepare, at the
    latest its client's completion), plus a tick of the timer. Without a recorded timeout
    (histories before every ``txn`` operation carried ``timeout_s``): the runner's workload
    asked for ``TXN_TIMEOUT_S`` unless it recorded another; an unknown producer's
    transaction counts as decided when its client completed it (the strict reading)."""
    timeout_s = op.get("timeout_s")
    if timeout_s is None and meta.get("transactions"):
        timeout_s = TXN_TIMEOUT_S
    if timeout_s is None:
        return op["time"]
    counted_from = op["time"] if op.get("xa") else op["invoke_time"]
    return counted_from + float(timeout_s) + TICK_S


class Timeline:
    """Success times of a history: acks per group, reads per partition (with what they reached)."""

    def __init__(self, history: History, present: dict[str, set[int]] | None,
                 stored: dict[str, tuple[str, int]] | None = None) -> None:
        self.acks: dict[int | None, list[float]] = defaultdict(list)
        self.acked: dict[str, list[tuple[float, int]]] = defaultdict(list)  # partition -> (ack time, offset)
        self.reads: dict[str, list[tuple[float, int]]] = defaultdict(list)  # partition -> (time, max offset read)
        for op in history.completions():
            if op.get("type") != "ok":
                continue
            partition = op.get("partition")
            if op.get("f") == "put":
                self.acks[group_of(partition)].append(op["time"])
                offset = op.get("offset")
                if offset is not None and (present is None or offset in present.get(partition, set())):
                    self.acked[partition].append((op["time"], int(offset)))
            elif op.get("f") == "get" and op.get("reads"):
                self.reads[partition].append((op["time"], max(int(o) for o, _v in op["reads"])))
        for lists in (self.acks, self.acked, self.reads):
            for key in lists:
                lists[key].sort()
        # partition -> (read times, the highest offset read by each): the second never falls,
        # so a bisection finds when a read first reached an offset.
        self.reached: dict[str, tuple[list[float], list[int]]] = {}
        for partition, reads in self.reads.items():
            highest = itertools.accumulate((top for _t, top in reads), max)
            self.reached[partition] = ([t for t, _top in reads], list(highest))
        # partition -> every transaction that stored a record there: undecided from its
        # invocation until ``decided_at`` (the module docstring says when that is).
        self.transactions: dict[str, list[HeldBy]] = defaultdict(list)
        for op in history.completions("txn"):
            first: dict[str, int] = {}
            for partition, offset, value in op.get("sends") or []:
                if offset is None and stored is not None and value in stored:
                    # Its ack was lost, but the record was stored: it holds the partition's
                    # reads as much as an acked one (campaign seed 6200).
                    partition, offset = stored[value]
                if partition is not None and offset is not None:
                    first[partition] = min(int(offset), first.get(partition, int(offset)))
            unknown = op.get("type") == "info"
            by_client = _decidable_at(op, history.meta) if unknown else op["time"]
            for partition, offset in first.items():
                read_past = self.first_read_reaching(partition, offset)
                decided_at = by_client if read_past is None else min(by_client, read_past)
                self.transactions[partition].append(
                    HeldBy(op.get("txn") or "", op["invoke_time"], decided_at, offset, unknown))
        self.end = max((op["time"] for op in history.ops), default=0.0)

    def partitions_of(self, group: int) -> list[str]:
        return sorted(p for p in set(self.acked) | set(self.reads) if group_of(p) == group)

    def newest_acked(self, partition: str, by: float) -> int | None:
        offsets = [o for t, o in self.acked.get(partition, []) if t <= by]
        return max(offsets) if offsets else None

    def first_acked_at(self, partition: str) -> float:
        """When the partition's first acked message (still in the final log) was acked; inf: none."""
        acked = self.acked.get(partition)
        return acked[0][0] if acked else float("inf")

    def newest_acked_below(self, partition: str, by: float, limit: int) -> tuple[float, int] | None:
        """(ack time, offset) of the newest message acked by ``by`` at an offset below ``limit``."""
        acked = [(o, t) for t, o in self.acked.get(partition, []) if t <= by and o < limit]
        if not acked:
            return None
        offset, t = max(acked)
        return t, offset

    def read_times(self, partition: str, reaching: int | None = None) -> list[float]:
        return [t for t, top in self.reads.get(partition, []) if reaching is None or top >= reaching]

    def first_read_reaching(self, partition: str, offset: int) -> float | None:
        """When a read of ``partition`` first got ``offset`` or a later one (None: never)."""
        times, highest = self.reached.get(partition, ([], []))
        i = bisect.bisect_left(highest, offset)
        return times[i] if i < len(times) else None

    def holding_back(self, partition: str, at: float, acked_by: float | None = None) -> list[HeldBy]:
        """The transactions undecided at ``at`` whose record in ``partition`` lies at or below
        the newest message acked there by ``acked_by`` (default: ``at``): the last stable
        offset keeps readers from that message until each is decided."""
        newest = self.newest_acked(partition, at if acked_by is None else acked_by)
        if newest is None:
            return []
        return [held for held in self.transactions.get(partition, [])
                if held.invoked <= at < held.decided_at and held.first <= newest]

    def holding_through(self, partition: str, start: float, end: float, bound: float) -> list[HeldBy]:
        """The transactions holding back ``partition``'s reads during a fault from ``start``
        to ``end``, lowest first record first: those undecided at ``start``, and those begun
        after it (by ``end``) and left undecided for longer than ``bound``. The fault's time
        is taken before its injection, and a master stores until it notices the quorum is
        gone: a transaction begun in between stores its records and cannot be decided
        without the quorum, so it holds the reads from its invocation on; one decided
        within the bound held them no longer than the bound allows a stop anyway
        (campaign seeds 7100, 7101, 7103: begun 0.06-0.12 s after ``S``, the master cut
        from ZooKeeper 0.2 s after ``S``, decided 5-7 s later)."""
        newest = self.newest_acked(partition, end)
        begun = {held for held in self.transactions.get(partition, [])
                 if start < held.invoked <= end and held.decided_at - held.invoked > bound
                 and newest is not None and held.first <= newest}
        return sorted(set(self.holding_back(partition, start, acked_by=end)) | begun, key=lambda h: (h.first, h.invoked))

    def waiting_for_timeout(self, partition: str, end: float) -> HeldBy | None:
        """Of the transactions holding back ``partition``'s reads at ``end``, the last to be
        decided among those only the broker's timeout (or a read past them) decides; None
        when there is none (every other hold is the reads rule's plain ``E + B``)."""
        by_timeout = [held for held in self.holding_back(partition, end) if held.unknown]
        return max(by_timeout, key=lambda held: held.decided_at, default=None)


def check_liveness(history: History, present: dict[str, set[int]] | None = None,
                   stored: dict[str, tuple[str, int]] | None = None) -> tuple[list[dict], list[dict], list[dict]]:
    """Returns (violations, warnings, per-fault records). ``present``: partition -> offsets of
    acked messages still in the final log (None: take every acked offset as present).
    ``stored``: value -> (partition, offset) in the final log of each transactional send
    whose ack was lost (recorded ``[None, None, value]``)."""
    bound = liveness_bound(history)
    timeline = Timeline(history, present, stored)
    violations: list[dict] = []
    warnings: list[dict] = []
    records: list[dict] = []
    for w in fault_windows(history):
        f = w.fault
        for group in w.groups:
            base = {"step": f.get("step"), "kind": f.get("kind"), "target": f.get("target"), "group": group,
                    "start": w.start, "end": w.end, "heals": f.get("heals", True)}
            rec = {**base, "writes_expected": bool(f.get("writes_expected", True))}
            what = f"{f.get('kind')} on {f.get('target')} at {w.start:.1f}s" + (
                f" (healed at {w.end:.1f}s)" if rec["heals"] else " (never healed)")

            def late(kind: str, first: float | None, detail: str, since: float = w.end) -> None:
                """``first`` (the awaited success) is due within ``bound`` of ``since``."""
                if first is not None and first - since <= bound:
                    return
                entry = {**base, "kind": kind, "fault": f.get("kind"), "bound_s": bound,
                         "why": f"group {group}: {detail} within {bound:g}s after {what}"
                                + (f"; first at +{first - w.end:.2f}s" if first is not None else "; none by the end")}
                cut = w.next_start is not None and w.next_start < since + bound and (first is None or first > w.next_start)
                if first is None and timeline.end < since + bound:
                    warnings.append({**entry, "why": entry["why"] + " (history ended before the bound: inconclusive)"})
                elif cut:
                    warnings.append({**entry, "why": entry["why"] + f" (the next fault began at {w.next_start:.1f}s, "
                                                                    "before the bound: inconclusive)"})
                else:
                    violations.append(entry)

            acks = timeline.acks.get(group, [])
            first_ack = _first_at_or_after(acks, w.end)
            rec["last_ack_before"] = _last_at_or_before(acks, w.start)
            rec["first_ack_after"] = first_ack
            rec["write_recovery_s"] = None if first_ack is None else round(first_ack - w.end, 3)
            rec["write_unavailable_s"] = round(_gap(acks, w.start, first_ack, timeline.end), 3)
            if rec["writes_expected"]:
                late("writes_stalled", first_ack, "no write acked")

            read_recovery, read_gap = 0.0, 0.0
            rec["last_read_before"], rec["first_read_after"] = {}, {}
            for partition in timeline.partitions_of(group):
                newest = timeline.newest_acked(partition, w.end)
                if newest is None:
                    continue
                first_read = _first_at_or_after(timeline.read_times(partition, newest), w.end)
                rec["first_read_after"][partition] = first_read
                rec["last_read_before"][partition] = _last_at_or_before(timeline.read_times(partition), w.start)
                # A transaction whose client gave up holds the awaited message until the
                # broker's timeout decides it, however early the fault ended (T1, V9).
                waiting = timeline.waiting_for_timeout(partition, w.end)
                if waiting is not None:
                    rec.setdefault("reads_wait_for_timeout", {})[partition] = {
                        "transaction": waiting.name, "decidable_at": round(waiting.decided_at, 3)}
                    late("reads_stalled", first_read,
                         f"{partition}: acked offset {newest} held by transaction {waiting.name} (outcome unknown, "
                         f"decided by {waiting.decided_at:.1f}s at the latest) not read back", waiting.decided_at)
                else:
                    late("reads_stalled", first_read, f"{partition}: acked offset {newest} not read back")
                every_read = timeline.read_times(partition)
                read_gap = max(read_gap, _gap(every_read, w.start, first_read, timeline.end))
                read_recovery = max(read_recovery, (first_read if first_read is not None else timeline.end) - w.end)
                if not f.get("reads_during"):
                    continue
                # Acked by the end, not only by the start: a master acks until it notices the
                # quorum is gone, and a message acked then above an open transaction's record
                # is held back as well (campaign seeds 3005, 3007: acked 0.08 s after S).
                held = timeline.holding_through(partition, w.start, w.end, bound)
                if held:
                    # Reads past an undecided transaction wait for its marker, a write: they
                    # are bounded like writes, by the reads rule above (within B of E, or of
                    # its timeout when only that decides it). Only those: what was acked
                    # below the transaction's first record is read throughout, within B of
                    # the fault's start (or of its ack, when acked during the fault).
                    first_held = held[0].first
                    rec.setdefault("reads_held_by_transaction", {})[partition] = held[0].name
                    below = timeline.newest_acked_below(partition, w.end, first_held)
                    if below is not None:
                        acked_at, offset = below
                        late("reads_stopped", timeline.first_read_reaching(partition, offset),
                             f"{partition}: acked offset {offset}, below transaction {held[0].name}'s first record "
                             f"{first_held}, not read", since=max(w.start, acked_at))
                # Throughout the fault, or from the partition's first ack when that came later
                # (a run's first seconds): before it there was nothing to read; up to the
                # invocation of the first holding transaction, when it began during the fault
                # (before it, nothing held the reads).
                since = max(w.start, timeline.first_acked_at(partition))
                until = max(w.start, min((h.invoked for h in held), default=w.end))
                during = _gap([t for t in every_read if since == w.start or t >= since], since, until,
                              timeline.end) if since < until else 0.0
                if during > bound:
                    violations.append({**base, "kind": "reads_stopped", "fault": f.get("kind"), "bound_s": bound,
                                       "why": f"group {group}: reads of {partition} stopped for {during:.2f}s "
                                              f"(> {bound:g}s) during {what}"})
            rec["read_recovery_s"] = round(read_recovery, 3)
            rec["read_unavailable_s"] = round(read_gap, 3)
            if f.get("master_fixed"):
                moved = [fo for fo in history.failovers if fo.get("group") == group and w.start <= fo["time"] <= w.end]
                if moved:
                    violations.append({**base, "kind": "master_changed", "fault": f.get("kind"),
                                       "why": f"group {group}: master changed during {what}: "
                                              f"{moved[0].get('old_master')} -> {moved[0].get('new_master')}"})
            records.append(rec)
    return violations, warnings, records


def table(records: list[dict]) -> dict[str, dict[str, Any]]:
    """Per fault kind: how many, the max unavailability and recovery after the end, writes and reads."""
    out: dict[str, dict[str, Any]] = {}
    for rec in records:
        row = out.setdefault(rec["kind"], {"faults": 0, "write_unavailable_s": 0.0, "write_recovery_s": 0.0,
                                           "read_unavailable_s": 0.0, "read_recovery_s": 0.0,
                                           "writes_expected": rec["writes_expected"]})
        row["faults"] += 1
        row["writes_expected"] = row["writes_expected"] and rec["writes_expected"]
        for key in ("write_unavailable_s", "read_unavailable_s", "read_recovery_s"):
            row[key] = max(row[key], rec[key])
        if rec["write_recovery_s"] is None:
            row["write_recovery_s"] = None
        elif row["write_recovery_s"] is not None:
            row["write_recovery_s"] = max(row["write_recovery_s"], rec["write_recovery_s"])
    return out


def render_table(rows: dict[str, dict[str, Any]], bound: float) -> list[str]:
    """The unavailability table as text lines. Seconds; "max" = the longest time without a
    success around the fault, "after end" = from the heal (or the start of a fault that never
    heals) to the first success; "writes due" = whether writes must resume at all."""
    if not rows:
        return ["  unavailability: no faults"]
    lines = [f"  unavailability per fault kind (seconds; liveness bound {bound:g}s after each fault ends):",
             f"    {'fault':<24} {'n':>3} {'writes due':>10} {'writes max':>10} {'after end':>9} "
             f"{'reads max':>9} {'after end':>9}"]
    for kind, row in sorted(rows.items()):
        after = "never" if row["write_recovery_s"] is None else f"{row['write_recovery_s']:.2f}"
        due = "yes" if row["writes_expected"] else "no"
        lines.append(f"    {kind:<24} {row['faults']:>3} {due:>10} {row['write_unavailable_s']:>10.2f} {after:>9} "
                     f"{row['read_unavailable_s']:>9.2f} {row['read_recovery_s']:>9.2f}")
    return lines
