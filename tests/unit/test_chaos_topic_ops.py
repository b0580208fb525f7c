import pytest

from chaos.checker import check
from chaos.history import History

from chaos.topic_ops import ALTERED_SETTING, SideTopicState, apply_op, plan, refusal_problem
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
