import pytest

from chaos.checker import check
from chaos.history import History

from chaos.topic_ops import ALTERED_SETTING, SideTopicLoad, SideTopicState, apply_op, plan, refusal_problem
from metaq.protocol import commands as c


def test_plan_walks_the_cycle_and_recreates_smaller():
    steps = plan(10, initial_partitions=3)
    # Re-created once from a deleted topic and once straight from a live one, then round again.
    assert [k for k, _ in steps] == ["topic-create", "topic-add-partitions", "topic-alter", "topic-delete",
                                     "topic-recreate", "topic-add-partitions", "topic-alter", "topic-recreate",
                                     "topic-add-partitions", "topic-alter"]
    assert [s.partitions for _, s in steps] == [3, 4, 4, None, 1, 2, 2, 1, 2, 2]
    assert steps[2][1].settings == (ALTERED_SETTING,)


def test_illegal_operations_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="already exists"):
        apply_op(SideTopicState(2), "topic-create")
    with pytest.raises(ValueError, match="does not exist"):
        apply_op(SideTopicState(None), "topic-delete")
    with pytest.raises(ValueError, match="unknown topic operation"):
        apply_op(SideTopicState(2), "topic-nope")
    with pytest.raises(ValueError, match="at least 2"):
        apply_op(SideTopicState(None), "topic-create", initial_partitions=1)


def _history_with_topic_op(**completion) -> History:
    history = History({"mode": "sync"})
    op = history.invoke("topics", "topic-op", "topic-recreate", "side/0", group=0, partitions=1)
    history.ok(op, incarnation="abc", **completion)
    return history


def test_a_state_a_topic_operation_did_not_leave_is_a_topic_ops_violation():
    planted = _history_with_topic_op(problems=["g0-b: side-0 holds 3 message(s) of an earlier incarnation (x)"])
    result = check(planted, only=["topic-ops"])
    assert not result.ok and len(result.violations("topic-ops")) == 1
    assert "earlier incarnation" in result.violations("topic-ops")[0]["why"]
    assert result.stats["anomalies"]["topic-ops"] == 1


def test_deferred_and_clean_topic_operations_pass():
    # Deferred: the cluster had not settled (a fault held); the final check judges the state.
    assert check(_history_with_topic_op(problems=["g0-b: partition(s) [1] missing"], deferred=True),
                 only=["topic-ops"]).ok
    clean = check(_history_with_topic_op(), only=["topic-ops"])
    assert clean.ok and clean.checks["topic-ops"]["checked"] == 1


def test_a_served_partition_with_nothing_readable_yet_is_no_violation_but_an_unserved_one_is():
    # Campaign seeds 3002 and 3004: a topic re-created near the end, nothing written to it
    # since. The broker's no-data answer (handlers._no_data) says the partition is served.
    empty = c.reply_header(7, c.NOT_FOUND, "no new messages", committed=0, log_end=0, epoch=3)
    assert refusal_problem("g0-a", 0, empty["code"], empty["msg"], empty) is None
    behind = c.reply_header(7, c.NOT_FOUND, "offset 0 is beyond the committed offset 0", committed=0, log_end=120, epoch=3)
    assert refusal_problem("g0-a", 0, behind["code"], behind["msg"], behind) is None
    unknown = c.reply_header(7, c.NOT_FOUND, "unknown topic 'side' on broker 0")
    assert "side-0 not served: 404 unknown topic" in refusal_problem("g0-a", 0, unknown["code"], unknown["msg"], unknown)
    for code in (c.BAD_REQUEST, c.FORBIDDEN, c.SERVICE_UNAVAILABLE):
        refused = c.reply_header(7, code, "no")
        assert refusal_problem("g0-b", 1, refused["code"], refused["msg"], refused) is not None
    assert refusal_problem("g0-a", 0, c.OK, None, c.reply_header(7)) is None


class _Broker:
    def __init__(self, name: str, url: str, tmp_path) -> None:
        self.name, self.url, self.group = name, url, 0
        self._dir = tmp_path / name

    def data_dir(self):
        return self._dir


class _Cluster:
    num_groups = 1

    def __init__(self, mode: str) -> None:
        self.mode = mode


def _side_load(mode: str) -> SideTopicLoad:
    load = SideTopicLoad(_Cluster(mode), History({"mode": mode}), seed=1)
    load.life[0] = 1
    return load


def _ack(load, value: str, url: str) -> None:
    load.acked[0].setdefault(0, []).append(value)
    load.acked_by[value] = (url, load._failovers_of(0))


def test_async_a_message_acked_by_the_master_before_a_failover_is_not_required_of_the_next(tmp_path):
    # Campaign seed 3027: the re-create's messages were acked by g1-b, an async failover to
    # g1-a took them back (allowed: async_loss_bound judges it), then an add-partitions step
    # acked new messages on g1-a; the check then asked g1-a for the old ones too.
    from metaq.record import encode_batch

    load = _side_load("async")
    old_master, new_master = _Broker("g0-b", "meta://b", tmp_path), _Broker("g0-a", "meta://a", tmp_path)
    _ack(load, "side-g0-life1-p0-0-0", old_master.url)
    load.history.failover(0, old_master.url, new_master.url, 2, {})
    _ack(load, "side-g0-life1-p0-1-0", new_master.url)
    log = encode_batch([(b"side-g0-life1-p0-1-0", None)])
    assert load._partition_problems(0, new_master, 0, True, log, None) == []
    # What the new master acked itself is still due from it.
    assert "lacks 1 acked message(s) (side-g0-life1-p0-1-0)" in load._partition_problems(0, new_master, 0, True, b"", None)[0]
    # Back to the old master (a second failover truncated it): none of the earlier acks is due.
    load.history.failover(0, new_master.url, old_master.url, 3, {})
    assert load._partition_problems(0, old_master, 0, True, b"", None) == []


def test_sync_every_acked_message_is_due_from_every_later_master(tmp_path):
    load = _side_load("sync")
    old_master, new_master = _Broker("g0-b", "meta://b", tmp_path), _Broker("g0-a", "meta://a", tmp_path)
    _ack(load, "side-g0-life1-p0-0-0", old_master.url)
    load.history.failover(0, old_master.url, new_master.url, 2, {})
    problems = load._partition_problems(0, new_master, 0, True, b"", None)
    assert problems and "lacks 1 acked message(s) (side-g0-life1-p0-0-0)" in problems[0]


def test_a_put_not_sent_because_the_master_does_not_serve_the_new_life_yet_is_not_acked() -> None:
    # The campaign's sync runs from 05:47 on reported acked side-topic messages missing on
    # every broker: _put said False (not sent) where the caller tested "is not None", so a
    # put never sent counted as acked.
    import asyncio
    from types import SimpleNamespace

    load = _side_load("sync")
    load.state[0] = SideTopicState(1)
    load.incarnation[0] = "new-life"

    class Connection:
        sent: list[object] = []

        async def request(self, header, body=None, timeout=None):
            self.sent.append(header)
            # The master still serves the old life of the topic.
            header = {"code": 200, "topics": {"side": 1}, "incarnations": {"side": "old-life"}}
            return SimpleNamespace(ok=True, header=header, get=lambda key, default=None: header.get(key, default))

        def close(self) -> None:
            pass

    async def connect(url, timeout):
        return Connection()

    load.cluster.view = lambda group: SimpleNamespace(master="meta://a")
    load.cluster.connect = connect
    assert asyncio.run(load._put(0, 0, "side-g0-life1-p0-0-0")) is None
    assert [h["op"] for h in Connection.sent] == ["topics"]  # the put itself was never sent


def test_an_operation_whose_outcome_is_unknown_is_written_again_before_the_final_check() -> None:
    # Campaign seed 6200 (re-run): an add-partitions timed out while ZooKeeper had lost its
    # majority and was recorded "not written"; ZooKeeper applied it when the quorum came
    # back, both members served two partitions, and the final check expected one.
    from kazoo.exceptions import ConnectionLoss

    load = _side_load("sync")
    zookeeper: dict[str, int | None] = {"partitions": None}
    reply_lost = ["topic-add-partitions"]

    def apply(group: int, kind: str, expected: SideTopicState) -> str:
        zookeeper["partitions"] = expected.partitions  # written, whatever the client hears
        if kind in reply_lost:
            reply_lost.remove(kind)
            raise ConnectionLoss()
        return "life-1"

    load._apply = apply
    load._write_messages = lambda group, partitions: None
    load.verify = lambda group, stopping, final=False: ([], False, False)
    load.step(0)  # create: 2 partitions
    load.step(0)  # add a partition: applied, its reply lost
    (unknown,) = [op for op in load.history.ops if op["type"] == "info"]
    assert unknown["value"] == "topic-add-partitions" and "outcome unknown" in unknown["error"]
    assert load.unresolved[0] and zookeeper["partitions"] == 3
    load.final_check()
    (final,) = [op for op in load.history.ops if op.get("value") == "final-check" and op["type"] == "invoke"]
    assert final["partitions"] == zookeeper["partitions"] == 3
    assert not load.unresolved[0] and load.counts["topic-add-partitions"] == 1


def test_an_operation_still_unknown_at_the_final_check_is_a_problem(monkeypatch) -> None:
    from kazoo.exceptions import ConnectionLoss

    from chaos import topic_ops

    monkeypatch.setattr(topic_ops, "RESOLVE_WITHIN_S", 0.0)
    load = _side_load("sync")

    def apply(group: int, kind: str, expected: SideTopicState) -> str:
        raise ConnectionLoss()

    load._apply = apply
    load.verify = lambda group, stopping, final=False: ([], False, False)
    load.step(0)
    load.final_check()  # the create written again once, still without an answer
    (final,) = [op for op in load.history.ops if op.get("value") == "final-check" and op["type"] == "ok"]
    assert "its last operation, topic-create, could not be written again" in final["problems"][0]
