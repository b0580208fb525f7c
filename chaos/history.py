"""The history of a chaos run: every operation, every fault, the final logs.

One JSON document (``History.save`` / ``History.load``)::

    {
      "format": "metaq-chaos-history/1",
      "meta":   {"mode": "sync"|"async", "scenario": ..., "seed": ..., "topic": ..., ...},
      "ops":    [op, ...],          # in the order they were recorded (real-time order)
      "faults": [fault, ...],
      "failovers": [failover, ...],
      "final":  {"replicas": {name: replica, ...}}
    }

An operation is recorded as an invocation and then exactly one completion, Jepsen style
(both are entries of ``ops``, linked by ``id``)::

    {"id": 17, "type": "invoke", "process": "p0", "f": "put", "value": "p0-17",
     "partition": "t/0-0", "time": 1.234}
    {"id": 17, "type": "ok",   ..., "offset": 4096, "epoch": 3, "master": "meta://127.0.0.1:8123"}
    {"id": 17, "type": "fail", ..., "error": "403 ..."}   # definitely NOT written
    {"id": 17, "type": "info", ..., "error": "timeout"}   # unknown outcome: may or may not be written

``partition`` is ``"{topic}/{brokerId}-{n}"`` (the same name on a master and its slaves).
A put's ``ok`` carries the acked ``offset`` (the record's start offset), and, when the
reply says so, the ``epoch`` and ``master`` that acked it. A ``fail`` must only be used
when the write is known not to have happened (refused before any append); anything else
(timeouts, connection lost after sending, sync wait expired) is ``info``.

A read is one completed ``get``::

    {"id": 40, "type": "ok", "process": "c0", "f": "get", "partition": "t/0-0",
     "replica": "meta://...", "reads": [[offset, value], ...], "time": ...}

A raw read (every record, read uncommitted) carries no ``isolation``; a reader that filters
as a read-committed consumer does records ``"isolation": "read_committed"``.

A consumer (a member of a consumer group, ``process`` is one consumer process) records
each assignment it is given and each poll it makes; the group's name is ``group``::

    {"id": 50, "type": "ok", "process": "g0-c1", "f": "assign", "group": "g0",
     "generation": 3, "partitions": ["t/0-0", "t/0-1"], "time": ...}
    {"id": 51, "type": "ok", "process": "g0-c1", "f": "poll", "group": "g0", "generation": 3,
     "isolation": "read_committed"|"read_uncommitted", "replica": "meta://...",
     "polls": {"t/0-0": [[offset, value], ...], ...}, "time": ...}

``generation`` is the assignment epoch: the consumer's position in a partition carries
over from one poll to the next only within one generation (a rebalance, a crash or a
restart starts a new one, from the committed offset). A consumer group that ran to the
end (its last consumers read every partition up to the end of the final log) is named
in ``meta["consumer_groups"]`` with ``{"drained": true}`` (``History.group_drained``).

A transaction (local or XA) is one operation, invoked when it begins and completed when
its outcome is known: ``ok`` committed, ``fail`` rolled back, aborted or timed out (its
messages must never be read committed), ``info`` unknown::

    {"id": 60, "type": "invoke", "process": "t0", "f": "txn", "txn": "t0-4", "time": ...}
    {"id": 60, "type": "ok", ..., "sends": [[partition, offset, value], ...],
     "reads": {partition: [[offset, value], ...]},   # consume-transform-produce only
     "commit_time": t}                                  # when commit was invoked

A fault::  {"time": t, "kind": "kill"|"pause"|"resume"|"restart"|"partition"|"heal"|"toxic"|...,
            "target": "broker-0-m", ...details}

A failover::  {"time": t, "group": 0, "old_master": url, "new_master": url, "epoch": 4,
               "lag": {"t/0-0": {"bytes": B, "messages": M}, ...}}   # lag at the moment of failure

A final replica snapshot (taken after healing, when replication has caught up)::

    {"group": 0, "role": "master"|"slave", "url": ..., "epoch": 4,
     "partitions": {"t/0-0": {"end": N, "sha256": hex of the bytes [0, end),
                              "records": [[offset, size, crc32 of the whole record, value], ...],
                              "tail": bytes after the last whole record (0 when clean),
                              "times": [record time ms, ...]}}}   # msg-id time of each record

A time read (``--time-reads``, chaos/time_reads.py) is one ``offset_for_time`` asked of a
master or a slave: ``time_ms`` asked, the answered ``offset``, ``latest`` (no readable
record that new: ``offset`` is the readable end), ``min_offset`` and ``max_offset`` (the
replica's readable end at that moment)::

    {"id": 70, "type": "ok", "process": "time-g0", "f": "time_read", "partition": "t/0-0",
     "replica": "meta://...", "time_ms": 1765000000123, "offset": 4096, "latest": false,
     "min_offset": 0, "max_offset": 8192, "time": ...}

Record-level CRCs over the whole record (header with msgId, and payload) let the checker
prove "byte-identical prefix" without storing the logs in the history.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Iterable

FORMAT = "metaq-chaos-history/1"


def value_of(data: bytes) -> str:
    """How a message payload is named in a history: UTF-8 text, else ``hex:...``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + data.hex()


#: How a control record (an idempotent put's BATCH header, a transaction marker: the
#: broker's own records, never a workload message) is named: this prefix and its data in hex.
CONTROL_PREFIX = "control:"


def record_value(attribute: str | None, data: bytes) -> str:
    """How a record is named in a history: ``value_of`` its data, or ``control:...``."""
    from metaq.txn.control import CONTROL_ATTRIBUTE

    if attribute == CONTROL_ATTRIBUTE:
        return CONTROL_PREFIX + bytes(data).hex()
    return value_of(data)


def is_control(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(CONTROL_PREFIX)


def brief(op: dict[str, Any]) -> dict[str, Any]:
    """The fields of an operation a violation report shows."""
    keys = ("id", "process", "value", "partition", "offset", "epoch", "master", "time", "invoke_time", "error",
            "txn", "group", "generation")
    return {k: op[k] for k in keys if k in op}


def group_of(partition: str | None) -> int | None:
    """The broker group of a partition name: ``"topic/3-0"`` -> 3."""
    if not partition:
        return None
    try:
        return int(partition.rsplit("/", 1)[-1].split("-", 1)[0])
    except ValueError:
        return None


def snapshot_partition(log_bytes: bytes, base: int = 0) -> dict[str, Any]:
    """The snapshot of one partition log (bytes from offset ``base``) for ``final``."""
    from metaq.record import HEADER, HEADER_SIZE, decode_payload

    from metaq.store.msgid import msg_id_timestamp_ms

    records: list[list[Any]] = []
    times: list[int] = []
    view = memoryview(log_bytes)
    pos, end = 0, len(view)
    while end - pos >= HEADER_SIZE:
        length, _crc, msg_id, flag = HEADER.unpack_from(view, pos)
        stop = pos + HEADER_SIZE + length
        if length < 0 or stop > end:
            break
        try:
            attribute, data = decode_payload(flag, view[pos + HEADER_SIZE : stop])
            value = record_value(attribute, data)
        except ValueError:
            value = None
        records.append([base + pos, stop - pos, zlib.crc32(view[pos:stop]), value])
        times.append(msg_id_timestamp_ms(msg_id))
        pos = stop
    return {
        "end": base + end,
        "sha256": hashlib.sha256(log_bytes).hexdigest(),
        "records": records,
        "times": times,
        "tail": end - pos,
    }


OP_TYPES = ("invoke", "ok", "fail", "info")


def check_shape(doc: dict[str, Any]) -> None:
    """Refuse (``ValueError`` naming the first bad entry) a document whose sections are not
    shaped as the module docstring says, so that ``python -m chaos check`` reports a broken
    file as unreadable instead of failing inside a check on a missing field."""
    for section, kind in (("meta", dict), ("ops", list), ("faults", list), ("failovers", list), ("final", dict)):
        if doc.get(section) is not None and not isinstance(doc[section], kind):
            raise ValueError(f"{section!r} is not a JSON {'object' if kind is dict else 'array'}")
    for i, op in enumerate(doc.get("ops") or []):
        if not isinstance(op, dict):
            raise ValueError(f"ops[{i}] is not a JSON object")
        if op.get("type") not in OP_TYPES:
            raise ValueError(f"ops[{i}] has type {op.get('type')!r}, not one of {', '.join(OP_TYPES)}")
        if not isinstance(op.get("id"), int) or not isinstance(op.get("time"), (int, float)):
            raise ValueError(f"ops[{i}] lacks an integer 'id' or a numeric 'time'")
    for section in ("faults", "failovers"):
        for i, entry in enumerate(doc.get(section) or []):
            if not isinstance(entry, dict) or not isinstance(entry.get("time"), (int, float)):
                raise ValueError(f"{section}[{i}] is not a JSON object with a numeric 'time'")
    replicas = (doc.get("final") or {}).get("replicas") or {}
    if not isinstance(replicas, dict):
        raise ValueError("final.replicas is not a JSON object")
    for name, replica in replicas.items():
        if (not isinstance(replica, dict) or not isinstance(replica.get("group"), int)
                or replica.get("role") not in ("master", "slave") or not isinstance(replica.get("partitions"), dict)):
            raise ValueError(f"final.replicas[{name!r}] lacks an integer 'group', a 'role' (master or slave) "
                             "or a 'partitions' object")
        for partition, snap in replica["partitions"].items():
            if not isinstance(snap, dict) or not isinstance(snap.get("records"), list):
                raise ValueError(f"final.replicas[{name!r}].partitions[{partition!r}] lacks a 'records' array")


class History:
    """A recorder (thread-safe) and the loaded form of a history."""

    def __init__(self, meta: dict[str, Any] | None = None, clock: Any = None) -> None:
        self.meta: dict[str, Any] = dict(meta or {})
        self.ops: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.failovers: list[dict[str, Any]] = []
        self.final: dict[str, Any] = {"replicas": {}}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._open: dict[int, dict[str, Any]] = {}
        self._t0 = time.monotonic()
        self._clock = clock  # a callable returning seconds; tests pass a fake one

    def now(self) -> float:
        if self._clock is not None:
            return float(self._clock())
        return round(time.monotonic() - self._t0, 6)

    # --- recording ---

    def invoke(self, process: str, f: str, value: Any = None, partition: str | None = None, **extra: Any) -> int:
        with self._lock:
            op_id = next(self._ids)
            op = {"id": op_id, "type": "invoke", "process": process, "f": f, "value": value,
                  "partition": partition, "time": self.now(), **extra}
            self.ops.append(op)
            self._open[op_id] = op
            return op_id

    def _complete(self, op_id: int, kind: str, fields: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            invoked = self._open.pop(op_id)
            op = {**invoked, **{k: v for k, v in fields.items() if v is not None}, "type": kind, "time": self.now()}
            self.ops.append(op)
            return op

    def ok(self, op_id: int, offset: int | None = None, epoch: int | None = None, master: str | None = None,
           partition: str | None = None, **extra: Any) -> dict[str, Any]:
        return self._complete(op_id, "ok", {"offset": offset, "epoch": epoch, "master": master,
                                            "partition": partition, **extra})

    def fail(self, op_id: int, error: str, **extra: Any) -> dict[str, Any]:
        return self._complete(op_id, "fail", {"error": error, **extra})

    def info(self, op_id: int, error: str, **extra: Any) -> dict[str, Any]:
        return self._complete(op_id, "info", {"error": error, **extra})

    def read(self, process: str, partition: str, reads: Iterable[tuple[int, Any]], replica: str | None = None,
             isolation: str | None = None) -> None:
        """One fetch's records; ``isolation`` ``"read_committed"`` for a reader that filters
        as a read-committed consumer does (else a raw read: read uncommitted)."""
        with self._lock:
            t = self.now()
            op_id = next(self._ids)
            base = {"id": op_id, "process": process, "f": "get", "partition": partition, "replica": replica}
            if isolation is not None:
                base["isolation"] = isolation
            self.ops.append({**base, "type": "invoke", "time": t})
            self.ops.append({**base, "type": "ok", "time": t, "reads": [[int(o), v] for o, v in reads]})

    @property
    def t0(self) -> float:
        """The origin of ``time`` on the monotonic clock (shared by processes on this host)."""
        return self._t0

    def assign(self, process: str, group: str, generation: int, partitions: Iterable[str],
               at: float | None = None) -> None:
        """A consumer of ``group`` was given ``partitions`` in assignment epoch ``generation``."""
        self._instant(process, "assign", at, group=group, generation=int(generation), partitions=sorted(partitions))

    def poll(self, process: str, group: str, generation: int, polls: dict[str, Iterable[tuple[int, Any]]],
             isolation: str = "read_committed", replica: str | None = None, at: float | None = None) -> None:
        """One poll of a consumer of ``group``: its batch per partition, in the order delivered."""
        batches = {p: [[int(o), v] for o, v in pairs] for p, pairs in polls.items()}
        self._instant(process, "poll", at, group=group, generation=int(generation), isolation=isolation,
                      replica=replica, polls=batches)

    def merge_consumer_records(self, group: str, records: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Records a consumer process wrote itself (chaos/group_consumer.py: ``(process, record)``,
        each with its own ``time`` on this history's clock), then every operation in time order
        (a stable sort: an invocation stays before its completion)."""
        for process, rec in records:
            if rec.get("f") == "assign":
                self.assign(process, group, rec["generation"], rec["partitions"], at=rec["time"])
            elif rec.get("f") == "poll":
                self.poll(process, group, rec["generation"], {rec["partition"]: rec["pairs"]}, at=rec["time"])
        with self._lock:
            self.ops.sort(key=lambda op: op["time"])

    def group_drained(self, group: str) -> None:
        """Consumer group ``group`` read every partition to the end of the final log."""
        with self._lock:
            self.meta.setdefault("consumer_groups", {}).setdefault(group, {})["drained"] = True

    def _instant(self, process: str, f: str, at: float | None = None, **fields: Any) -> None:
        """An operation that completes as it is recorded (invoke and ok at one time: ``at``, or now)."""
        with self._lock:
            t = self.now() if at is None else float(at)
            base = {"id": next(self._ids), "process": process, "f": f}
            self.ops.append({**base, "type": "invoke", "time": t})
            self.ops.append({**base, **fields, "type": "ok", "time": t})

    def fault(self, kind: str, target: str, at: float | None = None, **details: Any) -> None:
        """``at``: when the fault began (``now()`` then), if recording it came later: a kill
        followed by a power-loss replay or a corruption takes seconds to inject, and what it
        caused (a fast takeover, say) is seen meanwhile. Kept in time order."""
        record = {"time": self.now() if at is None else at, "kind": kind, "target": target, **details}
        with self._lock:
            index = len(self.faults)
            while index and self.faults[index - 1]["time"] > record["time"]:
                index -= 1
            self.faults.insert(index, record)

    def failover(self, group: int, old_master: str | None, new_master: str | None, epoch: int | None,
                 lag: dict[str, dict[str, int]] | None = None, at: float | None = None, **details: Any) -> None:
        """``at``: when it was seen (``now()`` then), if recording it came later."""
        with self._lock:
            self.failovers.append({"time": self.now() if at is None else at, "group": group, "old_master": old_master,
                                   "new_master": new_master, "epoch": epoch, "lag": lag or {}, **details})

    def snapshot(self, name: str, group: int, role: str, partitions: dict[str, bytes], url: str | None = None,
                 epoch: int | None = None) -> None:
        """Record a replica's final logs: ``partitions`` maps partition name -> log bytes from 0."""
        self.final["replicas"][name] = {
            "group": group, "role": role, "url": url, "epoch": epoch,
            "partitions": {p: snapshot_partition(b) for p, b in partitions.items()},
        }

    def close_open(self, error: str = "run ended before completion") -> None:
        """Mark every operation still in flight as unknown-outcome."""
        for op_id in list(self._open):
            self.info(op_id, error)

    # --- persistence ---

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "meta": self.meta, "ops": self.ops, "faults": self.faults,
                "failovers": self.failovers, "final": self.final}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=None, separators=(",", ":")) + "\n")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "History":
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document")
        check_shape(doc)
        history = cls(doc.get("meta"))
        history.ops = list(doc.get("ops", []))
        history.faults = list(doc.get("faults", []))
        history.failovers = list(doc.get("failovers", []))
        history.final = doc.get("final") or {"replicas": {}}
        history.final.setdefault("replicas", {})
        return history

    @classmethod
    def load(cls, path: str | Path) -> "History":
        return cls.from_json(json.loads(Path(path).read_text()))

    # --- views used by the checker ---

    def completions(self, f: str | None = None) -> list[dict[str, Any]]:
        """Completed operations (ok/fail/info), each merged with its invocation time."""
        invoked: dict[int, float] = {}
        out = []
        for op in self.ops:
            if op["type"] == "invoke":
                invoked[op["id"]] = op["time"]
            elif f is None or op.get("f") == f:
                out.append({**op, "invoke_time": invoked.get(op["id"], op["time"])})
        return out
