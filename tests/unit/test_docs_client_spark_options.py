"""docs/spark.md, "Options" and "Starting at a time": Kafka's time options are taken under
their documented names, although Spark hands the source its option keys lower-cased."""

from __future__ import annotations

import pytest

from metaq.spark.options import SourceOptions
from metaq.spark.options_error import OptionError


@pytest.mark.parametrize("key", ["startingTimestamp", "startingtimestamp", "STARTINGTIMESTAMP"])
def test_a_time_option_is_taken_under_any_case(key: str) -> None:
    options = {"zkconnect": "127.0.0.1:2181", "topic": "demo", key: "1700000000000"}
    parsed = SourceOptions.parse(options, streaming=False).starting_times
    assert parsed is not None and (parsed.option, parsed.every) == ("startingTimestamp", 1700000000000)


def test_time_options_follow_kafkas_precedence_and_are_checked() -> None:
    base = {"zkConnect": "127.0.0.1:2181", "topic": "demo"}
    both = SourceOptions.parse({**base, "startingTimestamp": "5", "startingOffsetsByTimestamp": '{"0-0": 7}'})
    assert both.starting_times is not None and both.starting_times.time_for("0-0") == 5  # the single time wins
    by_partition = SourceOptions.parse({**base, "endingoffsetsbytimestamp": '{"0-0": 7, "0-1": "8"}'}).ending_times
    assert by_partition is not None and (by_partition.time_for("0-1"), by_partition.time_for("9-9")) == (8, None)
    assert SourceOptions.parse(base).timestamp_strategy == "error"
    assert SourceOptions.parse({**base, "startingOffsetsByTimestampStrategy": "Latest"}).timestamp_strategy == "latest"
    for options, message in (
        ({"startingTimestamp": "yesterday"}, "option startingTimestamp: expected milliseconds since 1970"),
        ({"startingTimestamp": "-1"}, "option startingTimestamp: expected milliseconds since 1970"),
        ({"startingOffsetsByTimestamp": '{"p0": 1}'}, "'p0' is not a partition name"),
        ({"startingOffsetsByTimestamp": "[1]"}, "expected a JSON object of partition times"),
        ({"endingOffsetsByTimestamp": '{"0-0": true}'}, "endingOffsetsByTimestamp of partition 0-0: expected milliseconds"),
        ({"startingOffsetsByTimestampStrategy": "skip"}, "startingOffsetsByTimestampStrategy must be one of error, latest"),
    ):
        with pytest.raises(OptionError, match=message):
            SourceOptions.parse({**base, **options})
    with pytest.raises(OptionError, match="option endingTimestamp is for batch reads only"):
        SourceOptions.parse({**base, "endingTimestamp": "5"}, streaming=True)
    assert SourceOptions.parse({**base, "startingTimestamp": "5"}, streaming=True).starting_times is not None


def test_an_unknown_option_nobody_documents_is_still_named() -> None:
    with pytest.raises(OptionError, match=r"^unknown option\(s\) nosuchoption;"):
        SourceOptions.parse({"zkConnect": "z:1", "topic": "t", "nosuchoption": "1"}, streaming=True)


@pytest.mark.parametrize("location", ["hdfs://namenode:8020/ckpt/enrich", "s3a://bucket/ckpt"])
def test_the_exactly_once_sink_refuses_a_checkpoint_it_cannot_open_as_a_file(location: str) -> None:
    """docs/spark.md, "Limits": an hdfs:// or s3a:// checkpoint is refused with one line."""
    from metaq.spark.sink import Decisions

    with pytest.raises(OptionError, match=rf"^option checkpointLocation {location}: .* use exactlyOnce=false otherwise$"):
        Decisions(location)


def test_the_exactly_once_sink_takes_a_local_path_or_a_file_uri(tmp_path) -> None:
    from metaq.spark.sink import Decisions

    assert Decisions(str(tmp_path)).root == Decisions(f"file:{tmp_path}").root == Decisions(f"file://{tmp_path}").root == tmp_path


@pytest.mark.parametrize(("option", "value", "named"), [
    ("zkConnect", "host:abc", "option zkConnect: expected HOST:PORT"),
    ("topic", "a/b", "option topic: topic name 'a/b' may only use letters, digits"),
    ("topic", "x" * 201, "option topic: topic name .* at most 200"),
])
def test_a_bad_cluster_or_topic_option_fails_at_once_naming_it(option: str, value: str, named: str) -> None:
    """docs/spark.md: "Bad options fail the query at once with one clear line naming the option"."""
    from metaq.spark.sink_options import SinkOptions

    options = {"zkConnect": "127.0.0.1:2181", "topic": "demo", option: value}
    with pytest.raises(OptionError, match=named):
        SourceOptions.parse(options, streaming=False)
    with pytest.raises(OptionError, match=named):
        SinkOptions.parse(options)


def test_the_sinks_transaction_timeout_is_bounded_like_a_branchs() -> None:
    from metaq.spark.sink_options import SinkOptions

    base = {"zkConnect": "127.0.0.1:2181", "topic": "demo"}
    assert SinkOptions.parse({**base, "transactionTimeoutS": str((1 << 31) - 1)}).transaction_timeout_s == (1 << 31) - 1
    with pytest.raises(OptionError, match=r"^option transactionTimeoutS: at most 2147483647 seconds, got 2147483648$"):
        SinkOptions.parse({**base, "transactionTimeoutS": str(1 << 31)})
