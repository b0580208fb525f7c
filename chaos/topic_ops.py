"""Topic operations during a chaos run: a side topic created, grown, altered, deleted and re-created.

Beside the faults and the workload, ``SideTopicLoad`` walks each broker group's side topic
(``side``, never read by the checked workload, so deleting it is legal) through the cycle
create -> add a partition -> alter a setting -> delete -> re-create with fewer partitions,
writing the group's topic configuration in ZooKeeper as ``metaq topics create|alter|delete``
does (compare-and-set, with the group's ZooKeeper login when security is on). After each
operation it writes a few messages to every partition of the topic through the master
(logged in as the workload's user) and checks the state the operation must leave on every
member, master and slaves (``problems``):

* the partitions present on disk are exactly those of the expected state (a deleted topic's,
  or a shrunk one's, are gone), each marked with the topic's current incarnation;
* no member holds, or serves to a reader, a message of an earlier incarnation (a re-created
  topic starts empty: a reader of the new one sees only new messages);
* every acked message of this incarnation is on the master, and every slave's log of every
  partition is byte-identical to the master's (added partitions replicate);
* consumer offsets stored for the topic before a delete, or committed again between the
  delete and the re-create (a consumer that ran on), are gone: the new incarnation's
  consumers start from their start position.

Each operation is one history operation ``f: topic-op`` (``value``: its kind); its
completion carries ``problems``. A state that does not hold within ``verify_s`` while the
cluster has settled is a violation (the ``topic-ops`` check, ``check_topic_ops``); one that
does not hold while a fault keeps the group unsettled is *deferred*, and the state the last
operation left is checked again on every member once the run has healed and settled
(``final_check``, recorded as ``value: final-check``).
"""
from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from metaq.protocol.messages import GetRequest, PutRequest, TopicsRequest
from metaq.protocol.replies import TopicsReply
from metaq.record import encode_batch, iter_records
from metaq.store.incarnation import read_marker

from .history import History, record_value

log = logging.getLogger("chaos.topic_ops")

#: The side topic of every broker group (the workload's topic is chaos.cluster.TOPIC).
SIDE_TOPIC = "side"
#: The consumer group whose stored offsets of the side topic must not outlive an incarnation.
SIDE_CONSUMER_GROUP = "side-readers"
#: Messages written to each partition after an operation.
MESSAGES_PER_PARTITION = 3
#: The setting ``topic-alter`` changes (a shared topic key with no effect on the run).
ALTERED_SETTING = ("deletePolicy", "delete,168")

#: The operations a run walks, per group: create, grow, alter, delete, re-create smaller, then
#: round again from the grow, with the re-create once from a deleted topic and once straight
#: from a live one (delete and create written back to back). Re-creating with fewer partitions
#: than before is the case the broker's topic incarnations exist for.
TOPIC_OP_KINDS = ["topic-create", "topic-add-partitions", "topic-alter", "topic-delete", "topic-recreate"]
CYCLE = [*TOPIC_OP_KINDS, "topic-add-partitions", "topic-alter", "topic-recreate"]
#: Past the run's end the loop goes on, at most this long, until each group's side topic has
#: had every kind of operation once (the first len(TOPIC_OP_KINDS) steps of CYCLE): on a
#: loaded machine operations take longer, and a 10 s run ended before its first topic-recreate.
FULL_PASS_GRACE_S = 30.0
#: How long the final check writes again an operation whose outcome is unknown before it
#: gives up (ZooKeeper has its quorum back by then: one write normally settles it).
RESOLVE_WITHIN_S = 60.0


@dataclass(frozen=True)
class SideTopicState:
    """What every member of the group must serve for the side topic: None partitions = dropped."""
    partitions: int | None
    settings: tuple[tuple[str, str], ...] = ()

    @property
    def exists(self) -> bool:
        return self.partitions is not None


def apply_op(state: SideTopicState, kind: str, initial_partitions: int = 2) -> SideTopicState:
    """The expected state after ``kind``; a clear ValueError when the op is illegal in ``state``."""
    if kind not in TOPIC_OP_KINDS:
        raise ValueError(f"unknown topic operation {kind!r} (one of {', '.join(TOPIC_OP_KINDS)})")
    if initial_partitions < 2:
        # topic-recreate must shrink the topic, so it needs at least two to shrink from.
        raise ValueError(f"side topic needs at least 2 partitions, got {initial_partitions}")
    if kind == "topic-create":
        if state.exists:
            raise ValueError("topic-create: the side topic already exists")
        return SideTopicState(initial_partitions)
    if not state.exists and kind != "topic-recreate":
        raise ValueError(f"{kind}: the side topic does not exist")
    if kind == "topic-add-partitions":
        return SideTopicState(state.partitions + 1, state.settings)
    if kind == "topic-alter":
        return SideTopicState(state.partitions, (ALTERED_SETTING,))
    if kind == "topic-delete":
        return SideTopicState(None)
    # topic-recreate: delete (if present) then create with fewer partitions than ever before.
    return SideTopicState(1)


def kind_at(step: int) -> str:
    """The ``step``-th operation (from 0) on a group's side topic: the cycle, repeated from its grow."""
    return CYCLE[0] if step == 0 else CYCLE[1 + (step - 1) % (len(CYCLE) - 1)]


def plan(steps: int, initial_partitions: int = 2) -> list[tuple[str, SideTopicState]]:
    """``steps`` operations walking the cycle, each paired with the state it must leave."""
    state, out = SideTopicState(None), []
    for step in range(steps):
        kind = kind_at(step)
        state = apply_op(state, kind, initial_partitions)
        out.append((kind, state))
    return out


# --- the check ---------------------------------------------------------------------------


def check_topic_ops(history: History, index: Any) -> tuple[list[dict], int]:
    """Every topic operation left its state on every member (deferred ones: checked at the end)."""
    ops = [op for op in history.completions("topic-op") if op["type"] == "ok"]
    violations = [{"kind": "topic-ops", "op": op.get("value"), "group": op.get("group"), "problem": problem,
                   "why": f"{op.get('value')} of {op.get('partition')} at {op['time']:.1f}s: {problem}"}
                  for op in ops if not op.get("deferred") for problem in op.get("problems") or []]
    return violations, len(ops)


# --- driving it against a cluster ----------------------------------------------------------


class SideTopicLoad:
    """Runs the cycle on every group's side topic while faults and the workload run (a thread)."""

    def __init__(self, cluster: Any, history: History, seed: int, verify_s: float = 45.0,
                 gap_s: tuple[float, float] = (0.5, 2.0)) -> None:
        self.cluster = cluster
        self.history = history
        self.rng = random.Random(f"topic-ops/{seed}")
        self.verify_s = verify_s
        self.gap_s = gap_s
        groups = range(cluster.num_groups)
        self.state = {g: SideTopicState(None) for g in groups}
        self.last_kind: dict[int, str | None] = {g: None for g in groups}
        self.steps = {g: 0 for g in groups}  # operations written, per group
        self.incarnation: dict[int, str | None] = {g: None for g in groups}
        #: Which life of the side topic this is (tags the values written), per group.
        self.life = {g: 0 for g in groups}
        self.acked: dict[int, dict[int, list[str]]] = {g: {} for g in groups}
        #: Who acked each message: (master URL, failovers of its group seen by then). In
        #: async mode a failover may take acked messages back (the workload's
        #: async_loss_bound judges that), so a message is awaited only while no failover of
        #: its group came after its ack. Per message, not per group: a later step's messages
        #: acked by the next master do not make the earlier ones its due (campaign seed 3027:
        #: a re-create's messages acked by the old master, taken back by an async failover,
        #: were then required of the new one after an add-partitions).
        self.acked_by: dict[str, tuple[str, int]] = {}
        #: Offset nodes a consumer of an ended incarnation left: each must be gone.
        self.stale_offsets: dict[int, list[str]] = {g: [] for g in groups}
        #: The partition count of the side topic's last life, once it ended (for the offsets it leaves).
        self.life_partitions: dict[int, int] = {}
        #: The group's last write has an unknown outcome (its reply lost, or timed out: ZooKeeper
        #: may have applied it, even after the client gave up). What the members must serve is
        #: unknown until the same operation is written again (every one is idempotent).
        self.unresolved = {g: False for g in groups}
        self.counts: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()  # verified, partly (a member down), deferred, violated
        self._clients: dict[int, Any] = {}
        self._security: dict[int, Any] = {}

    # --- the loop --------------------------------------------------------------------------

    def run(self, stop_at: float, stopping: Any) -> None:
        stopping.wait(1.0)  # plain load first
        while not stopping.is_set() and (time.monotonic() < stop_at or (
                not self._every_kind_done() and time.monotonic() < stop_at + FULL_PASS_GRACE_S)):
            for group in range(self.cluster.num_groups):
                if stopping.is_set():
                    break
                self.step(group, stopping)
            stopping.wait(self.rng.uniform(*self.gap_s))

    def _every_kind_done(self) -> bool:
        return all(self.steps[group] >= len(TOPIC_OP_KINDS) for group in range(self.cluster.num_groups))

    def step(self, group: int, stopping: Any = None) -> None:
        state = self.state[group]
        kind = kind_at(self.steps[group])
        expected = apply_op(state, kind)
        op = self.history.invoke("topics", "topic-op", kind, f"{SIDE_TOPIC}/{group}", group=group,
                                 partitions=expected.partitions)
        try:
            incarnation = self._apply(group, kind, expected)
        except Exception as exc:  # ZooKeeper without a quorum, a session moving: written or not, try again
            # Not "not written": a write whose reply was lost, or that the client stopped
            # waiting for, may be applied all the same, later even (campaign seed 6200: an
            # add-partitions timed out during a quorum loss, was applied when the quorum came
            # back, and the final check expected the partition count before it).
            self.unresolved[group] = True
            self.history.info(op, f"outcome unknown: {exc!r}")
            return
        self.unresolved[group] = False
        self.counts[kind] += 1
        self.steps[group] += 1
        if state.exists:
            self.life_partitions[group] = state.partitions
        self.last_kind[group], self.state[group], self.incarnation[group] = kind, expected, incarnation
        if kind in ("topic-create", "topic-recreate"):
            self.life[group] += 1
            self.acked[group] = {}
        if expected.exists:
            self._write_messages(group, expected.partitions)
        problems, deferred, partly = self.verify(group, stopping)
        outcome = "deferred" if deferred else "violated" if problems else "partly" if partly else "verified"
        self.outcomes[outcome] += 1
        if problems:
            log.warning("%s of %s/%d: %s%s", kind, SIDE_TOPIC, group, "; ".join(problems[:5]),
                        " (deferred: the cluster had not settled)" if deferred else "")
        self.history.ok(op, incarnation=incarnation, problems=problems or None, deferred=deferred or None,
                        checked=outcome)

    def final_check(self) -> None:
        """Once healed and settled: the state each group's last operation left, on every member.
        An operation whose outcome is unknown is written again first (``resolve``)."""
        for group in range(self.cluster.num_groups):
            self.resolve(group)
            if self.last_kind[group] is None and not self.unresolved[group]:
                continue
            op = self.history.invoke("topics", "topic-op", "final-check", f"{SIDE_TOPIC}/{group}", group=group,
                                     partitions=self.state[group].partitions)
            problems, _deferred, partly = self.verify(group, None, final=True)
            if partly:
                problems = problems + ["a member was not running at the final check"]
            if self.unresolved[group]:
                problems = problems + [f"its last operation, {kind_at(self.steps[group])}, could not be written "
                                       f"again within {RESOLVE_WITHIN_S:g}s: what the members must serve is unknown"]
            self.outcomes["violated" if problems else "verified"] += 1
            self.history.ok(op, incarnation=self.incarnation[group], problems=problems or None, checked="final")

    def resolve(self, group: int) -> None:
        """Write the group's last operation again while its outcome is unknown: each is
        idempotent (a create or add names the topic's count, a delete or re-create ends
        whatever life is there), so once one write is answered the expected state is known."""
        deadline = time.monotonic() + RESOLVE_WITHIN_S
        while self.unresolved[group]:
            self.step(group)
            if not self.unresolved[group] or time.monotonic() > deadline:
                return
            time.sleep(1.0)

    def close(self) -> None:
        for client in self._clients.values():
            try:
                client.stop()
                client.close()
            except Exception:  # pragma: no cover - best effort
                pass
        self._clients.clear()

    def summary(self) -> dict[str, Any]:
        return {"ops": dict(sorted(self.counts.items())), "outcomes": dict(sorted(self.outcomes.items()))}

    def line(self) -> str:
        o = self.outcomes
        return (f"topic operations on '{SIDE_TOPIC}': {sum(self.counts.values())} {dict(sorted(self.counts.items()))}; "
                f"checks: {o['verified']} verified on every member, {o['partly']} on the running members, "
                f"{o['deferred']} deferred to the final check, {o['violated']} violated")

    # --- operations ------------------------------------------------------------------------

    def _client(self, group: int) -> Any:
        """A ZooKeeper client with the group's login (security on), as ``metaq topics --group-secret`` has."""
        client = self._clients.get(group)
        if client is None:
            from metaq.security.group import GroupSecret
            from metaq.zk.acl import ZkSecurity, client_kwargs
            from metaq.zk.tls import make_kazoo_client

            security = None
            secret_file = self.cluster.group_secret_file(group)
            if secret_file is not None:
                security = ZkSecurity(self.cluster.zk_root, group, GroupSecret.load(secret_file, group).zookeeper_password())
            client = make_kazoo_client(self.cluster.zk_connect, timeout=10, **client_kwargs(security))
            client.start(timeout=30)
            self._clients[group], self._security[group] = client, security
        return client

    def _apply(self, group: int, kind: str, expected: SideTopicState) -> str | None:
        """Write the operation to the group's topic configuration; the topic's incarnation after it."""
        from metaq.zk.topic_config import delete_group_offsets, update_group_topics

        client = self._client(group)
        paths = self.cluster.paths

        def write(change: Any) -> Any:
            return update_group_topics(client, paths, group, change, security=self._security[group])

        ending = self.state[group].partitions or self.life_partitions.get(group, 0)
        if kind in ("topic-delete", "topic-recreate") and self.state[group].exists:
            self._leave_offsets(group, ending)  # a consumer's place in the incarnation that ends
            write(lambda g: g.without_topic(SIDE_TOPIC) if SIDE_TOPIC in g.topics else None)
            delete_group_offsets(client, paths, group, SIDE_TOPIC)  # as metaq topics delete does
        if kind == "topic-recreate":
            self._leave_offsets(group, ending)  # ... committed again by a consumer that ran on after the delete
        if not expected.exists:
            return None
        settings = {"numPartitions": str(expected.partitions), **dict(expected.settings)}
        if kind in ("topic-create", "topic-recreate"):
            # Absent since the delete just written: a create, so a new incarnation.
            done = write(lambda g: g.with_topic(SIDE_TOPIC, settings) if SIDE_TOPIC not in g.topics else None)
            delete_group_offsets(client, paths, group, SIDE_TOPIC)  # as metaq topics create does
        else:
            done = write(lambda g: g.with_topic(SIDE_TOPIC, {**g.topics.get(SIDE_TOPIC, {}), **settings}))
        return done.incarnations.get(SIDE_TOPIC)

    def _leave_offsets(self, group: int, partitions: int) -> None:
        """Commit a place in the side topic as a consumer does (no group login: open ACL)."""
        from metaq.zk.paths import format_offset

        client = self.cluster.zk

        for n in range(partitions):
            path = self.cluster.paths.offset(SIDE_CONSUMER_GROUP, SIDE_TOPIC, f"{group}-{n}")
            value = format_offset(-1, 7).encode()
            if client.exists(path):
                client.set(path, value)
            else:
                client.create(path, value, makepath=True)
            if path not in self.stale_offsets[group]:
                self.stale_offsets[group].append(path)

    def _prefix(self, group: int) -> str:
        return f"side-g{group}-life{self.life[group]}-"

    def _write_messages(self, group: int, partitions: int, within_s: float = 15.0) -> None:
        """A few messages to every partition through the group's master (retried through a fault)."""
        async def put_all() -> None:
            deadline = time.monotonic() + within_s
            for n in range(partitions):
                for j in range(MESSAGES_PER_PARTITION):
                    value = f"{self._prefix(group)}p{n}-{len(self.acked[group].get(n, []))}-{j}"
                    while time.monotonic() < deadline:
                        acker = await self._put(group, n, value)
                        if acker is not None:
                            self.acked[group].setdefault(n, []).append(value)
                            self.acked_by[value] = (acker, self._failovers_of(group))
                            break
                        await asyncio.sleep(0.2)

        asyncio.run(put_all())

    async def _put(self, group: int, n: int, value: str) -> str | None:
        """One put to the master, once it serves the operation's result (as ``metaq topics --wait``
        waits for): a put that reached it before it applied a re-create went to the old
        incarnation, deleted with it, and is no message of the new one. Returns the URL of
        the master that acked it, None when it was not acked."""
        url = self.cluster.view(group).master
        if url is None:
            return None
        try:
            conn = await self.cluster.connect(url, 2.0)
            try:
                topics = await conn.request(TopicsRequest().to_header(), timeout=3.0)
                if not topics.ok or not self._serves_now(group, topics):
                    return None  # not sent: not acked (a False here once counted as an ack)
                header = PutRequest(topic=SIDE_TOPIC, partition=n, count=1).to_header()
                reply = await conn.request(header, encode_batch([(value.encode(), None)]), timeout=3.0)
            finally:
                conn.close()
        except Exception:
            return None
        return url if reply.ok else None

    def _serves_now(self, group: int, topics_reply: Any) -> bool:
        """Whether a member's topics reply shows the side topic as the last operation left it."""
        return TopicsReply.of(topics_reply).serves(SIDE_TOPIC, self.state[group].partitions, self.incarnation[group])

    # --- checking --------------------------------------------------------------------------

    def verify(self, group: int, stopping: Any, final: bool = False) -> tuple[list[str], bool, bool]:
        """``(problems, deferred, partly)``: poll the state until it holds or ``verify_s`` passes."""
        deadline = time.monotonic() + self.verify_s
        while True:
            try:
                problems, partly = self.problems(group)
            except Exception as exc:  # ZooKeeper away, a file renamed under us: look again
                problems, partly = [f"could not look: {exc!r}"], True
            if not problems:
                return [], False, partly
            if time.monotonic() > deadline or (stopping is not None and stopping.is_set()):
                break
            time.sleep(0.25)
        if final:
            return problems, False, partly
        # A member cut off or between masters cannot apply a change: only a settled cluster fails.
        deferred = partly or self.cluster.settle_problem() is not None
        return problems, deferred, partly

    def problems(self, group: int) -> tuple[list[str], bool]:
        """What the group does not (yet) show of the expected state; and whether a member was
        not running (its disk is checked again at the final check)."""
        state, incarnation = self.state[group], self.incarnation[group]
        wanted = set(range(state.partitions or 0))
        master = self.cluster.master_of(group)
        if master is None:
            return ["no master registered"], True
        out: list[str] = []
        partly = False
        master_logs = {n: master.disk_log(SIDE_TOPIC, n) if n in wanted else b"" for n in wanted}
        for b in self.cluster.group_brokers(group):
            if not b.process.alive or b.paused:
                partly = True
                continue
            on_disk = side_partitions_on_disk(b.data_dir())
            if on_disk - wanted:
                out.append(f"{b.name}: partition(s) {sorted(on_disk - wanted)} still on disk (expected {sorted(wanted)})")
            if wanted - on_disk:
                out.append(f"{b.name}: partition(s) {sorted(wanted - on_disk)} missing")
            for n in sorted(wanted & on_disk):
                out += self._partition_problems(group, b, n, b is master, master_logs[n], incarnation)
        out += self._served_problems(group, wanted)
        for path in self.stale_offsets[group]:
            if self.cluster.zk.exists(path):
                out.append(f"stored consumer offset {path} of an ended incarnation is still there")
        return out, partly

    def _partition_problems(self, group: int, b: Any, n: int, is_master: bool, master_log: bytes,
                            incarnation: str | None) -> list[str]:
        out = []
        marker = read_marker(b.data_dir() / f"{SIDE_TOPIC}-{n}")
        if incarnation and marker != incarnation:
            out.append(f"{b.name}: {SIDE_TOPIC}-{n} holds incarnation {marker}, not {incarnation}")
        data = master_log if is_master else b.disk_log(SIDE_TOPIC, n)
        values = [record_value(r.attribute, r.data) for r in iter_records(data, 0, verify=False)]
        old = [v for v in values if not v.startswith(self._prefix(group))]
        if old:
            out.append(f"{b.name}: {SIDE_TOPIC}-{n} holds {len(old)} message(s) of an earlier incarnation ({old[0]})")
        if is_master:
            missing = [v for v in self.acked[group].get(n, []) if self._ack_must_survive(v, b) and v not in values]
            if missing:
                out.append(f"{b.name} (master): {SIDE_TOPIC}-{n} lacks {len(missing)} acked message(s) ({missing[0]})")
        elif data != master_log:
            out.append(f"{b.name}: {SIDE_TOPIC}-{n} is not byte-identical to the master's "
                       f"({len(data)} bytes, master {len(master_log)})")
        return out

    def _ack_must_survive(self, value: str, master: Any) -> bool:
        """Sync: every ack survives any failover. Async: only while the master that acked it
        leads, with no failover of its group since (one away and back truncates it)."""
        if self.cluster.mode == "sync":
            return True
        acker = self.acked_by.get(value)
        return acker is not None and acker == (master.url, self._failovers_of(master.group))

    def _failovers_of(self, group: int) -> int:
        return sum(1 for f in self.history.failovers if f.get("group") == group)

    def _served_problems(self, group: int, wanted: set[int]) -> list[str]:
        """A reader of each running member (through the network, as a consumer) sees only this life."""
        async def ask_all() -> list[str]:
            out = []
            for b in self.cluster.group_brokers(group):
                if not b.process.alive or b.paused:
                    continue
                for n in sorted(wanted):
                    try:
                        conn = await self.cluster.connect(b.url, 2.0)
                        try:
                            get = GetRequest(topic=SIDE_TOPIC, partition=n, offset=0, max_size=1024 * 1024)
                            reply = await conn.request(get.to_header(), timeout=3.0)
                        finally:
                            conn.close()
                    except Exception as exc:
                        out.append(f"{b.name}: {SIDE_TOPIC}-{n} not readable: {exc!r}")
                        continue
                    problem = refusal_problem(b.name, n, reply.code, reply.message, reply.header)
                    if problem is not None:
                        out.append(problem)
                    if not reply.ok:
                        continue
                    old = [record_value(r.attribute, r.data) for r in iter_records(bytes(reply.body), 0, verify=False)]
                    old = [v for v in old if not v.startswith(self._prefix(group))]
                    if old:
                        out.append(f"{b.name}: a reader of {SIDE_TOPIC}-{n} was given {len(old)} message(s) of an "
                                   f"earlier incarnation ({old[0]})")
            return out

        return asyncio.run(ask_all())


def refusal_problem(member: str, partition: int, code: int, message: str | None, header: dict) -> str | None:
    """What a consumer's get at offset 0 of a side partition says is wrong, or None.

    A partition served with nothing readable at offset 0 yet (a re-created topic nobody
    wrote to since, or writes not yet committed) answers ``404`` *with* its ``log_end``
    and ``committed``: served, and a reader is given no earlier incarnation's message.
    Any other refusal (an unknown topic or partition: 404 without them, 403, 503) means the
    member does not serve the partition the operation left.
    """
    if code == 200:
        return None
    if code == 404 and "log_end" in header and "committed" in header:
        return None
    return f"{member}: {SIDE_TOPIC}-{partition} not served: {code} {message}"


_PARTITION_DIR = re.compile(rf"^{SIDE_TOPIC}-(\d+)$")


def side_partitions_on_disk(data_dir: Any) -> set[int]:
    """The side topic's partition directories a broker has (not those being deleted)."""
    if not data_dir.is_dir():
        return set()
    return {int(m.group(1)) for p in data_dir.iterdir() if (m := _PARTITION_DIR.match(p.name)) and p.is_dir()}
