"""The metaq sink's options and columns: one-line errors naming what to fix (pure, no Spark)."""

from __future__ import annotations

import pytest

from metaq.spark.options_error import OptionError
from metaq.spark.sink_options import DEFAULT_BATCH_BYTES, SinkOptions

BASE = {"zkConnect": "127.0.0.1:2181", "topic": "out"}


def test_defaults_and_lower_cased_keys():
    options = SinkOptions.parse({"zkconnect": "zk:2181", "TOPIC": "out", "exactlyonce": "FALSE", "checkpointlocation": "/c"})
    assert (options.zk_connect, options.topic, options.zk_root) == ("zk:2181", "out", "/meta")
    assert options.exactly_once is False and options.checkpoint_location == "/c"
    assert SinkOptions.parse(BASE).exactly_once is True
    assert SinkOptions.parse(BASE).batch_bytes == DEFAULT_BATCH_BYTES
    assert SinkOptions.parse(BASE).max_message_size == 1024 * 1024  # the brokers' default maxMessageSize
    assert SinkOptions.parse({**BASE, "maxmessagesize": "500"}).max_message_size == 500


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"zkConnect": ""}, "option zkConnect is required"),
        ({"exactlyOnce": "yes"}, "option exactlyOnce: expected true or false, got 'yes'"),
        ({"batchBytes": "0"}, "option batchBytes: expected a positive integer"),
        ({"transactionTimeoutS": "soon"}, "option transactionTimeoutS: expected a positive integer"),
        ({"maxMessageSize": "-1"}, "option maxMessageSize: expected a positive integer, got '-1'"),
        ({"zkRoot": "meta"}, "option zkRoot must start with '/'"),
        ({"zkRoot": "/meta/.."}, "option zkRoot must not have a '.' or '..' component"),
        ({"password": "x"}, "unknown option(s) password; the metaq sink takes:"),
        ({"user": "app"}, "option user needs option passwordFile"),
    ],
)
def test_bad_options_fail_with_one_line_naming_them(extra, message):
    with pytest.raises(OptionError) as caught:
        SinkOptions.parse({**BASE, **extra})
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "columns, message",
    [
        ({"data": "binary"}, "needs a column 'value'"),
        ({"value": "int"}, "column 'value' must be binary or string, got int"),
        ({"value": "binary", "partition": "int"}, "column 'partition' must be string, got int"),
        ({"value": "binary", "key": "string", "partition": "string"}, "by its 'key' or by its 'partition' column, not both"),
    ],
)
def test_columns_are_checked_on_the_driver(columns, message):
    with pytest.raises(OptionError, match=message):
        SinkOptions.parse(BASE).check_columns(columns)


def test_a_topic_column_replaces_the_topic_option():
    options = SinkOptions.parse({"zkConnect": "zk:2181"})
    options.check_columns({"value": "binary", "topic": "string", "other": "int"})  # other columns are ignored
    with pytest.raises(OptionError, match="option topic is required unless the DataFrame has a 'topic' column"):
        options.check_columns({"value": "binary"})
