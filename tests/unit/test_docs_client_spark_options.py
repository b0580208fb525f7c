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
