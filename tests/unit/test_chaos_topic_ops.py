import pytest

from chaos.topic_ops import SideTopicState, apply_op, plan


def test_plan_walks_the_cycle_and_recreates_smaller():
    steps = plan(6, initial_partitions=3)
    assert [k for k, _ in steps] == ["topic-create", "topic-add-partitions", "topic-alter",
                                     "topic-delete", "topic-recreate", "topic-recreate"]
    assert [s.partitions for _, s in steps] == [3, 4, 4, None, 1, 1]
    assert steps[2][1].settings == (("retention.hours", "1"),)


def test_illegal_operations_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="already exists"):
        apply_op(SideTopicState(2), "topic-create")
    with pytest.raises(ValueError, match="does not exist"):
        apply_op(SideTopicState(None), "topic-delete")
    with pytest.raises(ValueError, match="unknown topic operation"):
        apply_op(SideTopicState(2), "topic-nope")
    with pytest.raises(ValueError, match="at least 2"):
        apply_op(SideTopicState(None), "topic-create", initial_partitions=1)
