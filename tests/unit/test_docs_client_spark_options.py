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
