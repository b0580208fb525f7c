"""Unit tests: MetaQ's start-offset rule (ConsumerConfig) and message filters."""

from __future__ import annotations

import pytest

from metaq.client import AttributeFilter, ConsumerConfig, Message
from metaq.client.filters import accept_function, accepted


def test_new_group_starts_at_the_oldest_message_by_default() -> None:
    config = ConsumerConfig(group="g")
    assert config.start_offset(100, 900) == 100
    assert not config.consume_from_max_offset and not config.always_consume_from_max_offset


def test_consume_from_max_offset_starts_at_the_newest() -> None:
    assert ConsumerConfig(group="g", consume_from_max_offset=True).start_offset(100, 900) == 900
    config = ConsumerConfig(group="g").set_consume_from_max_offset(always=True)
    assert config.start_offset(100, 900) == 900 and config.always_consume_from_max_offset
    # always implies from the max offset
    assert ConsumerConfig(group="g", always_consume_from_max_offset=True).consume_from_max_offset


def test_explicit_offset_is_moved_into_the_partition_range() -> None:
    config = ConsumerConfig(group="g", offset=500)
    assert config.start_offset(100, 900) == 500
    assert config.start_offset(600, 900) == 600  # before the log start: the oldest
    assert config.start_offset(0, 300) == 300  # past the end: the newest
    with pytest.raises(ValueError, match="offset must be >= 0"):
        ConsumerConfig(group="g", offset=-1)


def test_from_beginning_is_deprecated_and_keeps_its_meaning() -> None:
    with pytest.warns(DeprecationWarning, match="consume_from_max_offset"):
        assert ConsumerConfig(group="g", from_beginning=True).start_offset(100, 900) == 100
    with pytest.warns(DeprecationWarning):
        assert ConsumerConfig(group="g", from_beginning=False).start_offset(100, 900) == 900


def message(attribute: str | None, offset: int) -> Message:
    return Message("t", b"x", attribute=attribute, offset=offset)


def test_attribute_filter_and_callable_filters() -> None:
    batch = [message("a", 0), message("b", 10), message(None, 20), message("a", 30)]
    assert [m.offset for m in accepted(accept_function(AttributeFilter("a")), "g", batch)] == [0, 30]
    assert [m.offset for m in accepted(accept_function(AttributeFilter("b", None)), "g", batch)] == [10, 20]
    by_group = accept_function(lambda group, m: group == "audit")
    assert accepted(by_group, "billing", batch) == [] and len(accepted(by_group, "audit", batch)) == 4
    with pytest.raises(TypeError, match="accept"):
        accept_function(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        AttributeFilter()


def test_a_raising_filter_lets_the_message_through() -> None:
    def broken(group: str, m: Message) -> bool:
        if m.offset == 10:
            raise RuntimeError("boom")
        return False

    assert [m.offset for m in accepted(broken, "g", [message("a", 0), message("a", 10)])] == [10]


def test_a_filter_broken_for_every_message_logs_one_traceback_per_fetch(caplog: pytest.LogCaptureFixture) -> None:
    def broken(group: str, m: Message) -> bool:
        raise RuntimeError("boom")

    fetch = [message("a", offset) for offset in range(0, 500, 10)]
    with caplog.at_level("ERROR", logger="metaq.client.filters"):
        assert accepted(broken, "g", fetch) == fetch  # nothing vanishes
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and tracebacks[0].getMessage().endswith("@0; delivering the message")
    assert [r.getMessage() for r in caplog.records if not r.exc_info] == [
        "message filter failed on 49 more message(s) of the same fetch; delivered them"]
