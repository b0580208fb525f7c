"""docs/spark.md, "Starting at a time": the refusal names `startingTimestamp` as written,
although Spark hands the source its option keys lower-cased."""

from __future__ import annotations

import pytest

from metaq.spark.options import SourceOptions
from metaq.spark.options_error import OptionError


@pytest.mark.parametrize("key", ["startingTimestamp", "startingtimestamp", "STARTINGOFFSETSBYTIMESTAMP"])
def test_a_time_option_is_refused_under_its_documented_name(key: str) -> None:
    options = {"zkconnect": "127.0.0.1:2181", "topic": "demo", key: "1700000000000"}
    with pytest.raises(OptionError, match=r"^unknown option\(s\) starting(Timestamp|OffsetsByTimestamp); the metaq source takes: zkConnect"):
        SourceOptions.parse(options, streaming=False)


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
