"""Offset-range planning, option validation, decoding, and a reader that meets a dead replica first."""

from __future__ import annotations

import random

import pytest

from metaq.client.routing import BrokerAddresses, Replica
from metaq.record import RecordError, decode_columns, encode_record, record_ends
from metaq.spark.fetch import OffsetInfo
from metaq.spark.options import OffsetSpec, OptionError, SourceOptions, parse_offsets
from metaq.spark.planning import check_partition_names, ordered_replicas, resolve_offset, split_range
from metaq.zk.embedded import free_port

pytestmark = pytest.mark.spark

BASE = {"zkConnect": "127.0.0.1:2181", "topic": "t"}


# --- options ------------------------------------------------------------------------------


def test_defaults_and_case_insensitive_keys():
    opts = SourceOptions.parse({"zkconnect": "h:1", "TOPIC": "t", "readfrom": "Prefer-Slave", "maxbytesperpartition": "100"})
    assert (opts.zk_connect, opts.topic, opts.zk_root, opts.read_from) == ("h:1", "t", "/meta", "prefer-slave")
    assert opts.max_bytes_per_partition == 100
    assert opts.starting == OffsetSpec("earliest") and opts.ending == OffsetSpec("latest")
    assert SourceOptions.parse(BASE, streaming=True).starting == OffsetSpec("latest")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"topic": "t"}, "zkConnect is required"),
        ({"zkConnect": "h:1"}, "topic is required"),
        ({**BASE, "readFrom": "replica"}, "readFrom must be one of slave, prefer-slave, master"),
        ({**BASE, "zkRoot": "meta"}, "zkRoot must start with '/'"),
        ({**BASE, "startingOffsets": "{0-0: 1}"}, "startingOffsets: not 'earliest', 'latest' or a JSON object"),
        ({**BASE, "startingOffsets": "[1, 2]"}, "expected a JSON object"),
        ({**BASE, "startingOffsets": '{"p0": 1}'}, "'p0' is not a partition name"),
        ({**BASE, "endingOffsets": '{"0-0": -5}'}, "offset of partition 0-0 must be a byte offset"),
        ({**BASE, "endingOffsets": '{"0-0": "soon"}'}, "offset of partition 0-0 must be"),
        ({**BASE, "endingOffsets": "earliest"}, "'earliest' is not an end"),
        ({**BASE, "maxBytesPerPartition": "0"}, "maxBytesPerPartition: expected a positive integer"),
        ({**BASE, "fetchBytes": "lots"}, "fetchBytes: expected a positive integer"),
        ({**BASE, "topics": "t"}, "unknown option(s) topics"),
        ({**BASE, "startingTimestamp": "in an hour"}, "startingTimestamp: expected milliseconds since 1970"),
        ({**BASE, "maxMessagesPerTrigger": "100"}, "maxMessagesPerTrigger is for streams only"),
        ({**BASE, "maxBytesPerTrigger": "1MB"}, "maxBytesPerTrigger is for streams only"),
    ],
)
def test_bad_options_have_clear_errors(options, message):
    with pytest.raises(OptionError) as info:
        SourceOptions.parse(options)
    assert message in str(info.value)


def test_rate_limits_and_data_loss_policy_of_streams():
    options = SourceOptions.parse({**BASE, "maxmessagespertrigger": "500", "maxBytesPerTrigger": "65536"}, streaming=True)
    assert (options.max_messages_per_trigger, options.max_bytes_per_trigger) == (500, 65536)
    with pytest.raises(OptionError, match="maxBytesPerTrigger: expected a positive integer"):
        SourceOptions.parse({**BASE, "maxBytesPerTrigger": "-1"}, streaming=True)
    assert SourceOptions.parse(BASE, streaming=True).fail_on_data_loss is True
    assert SourceOptions.parse({**BASE, "failondataloss": "False"}, streaming=True).fail_on_data_loss is False
    with pytest.raises(OptionError, match="option failOnDataLoss: expected true or false, got 'no'"):
        SourceOptions.parse({**BASE, "failOnDataLoss": "no"}, streaming=True)


def test_ending_offsets_rejected_for_streams():
    with pytest.raises(OptionError, match="endingOffsets is for batch reads only"):
        SourceOptions.parse({**BASE, "endingOffsets": "latest"}, streaming=True)


def test_offset_json_with_keywords_and_kafka_spelling():
    spec = parse_offsets('{"0-0": 10, "0-1": "EARLIEST", "1-0": -1, "1-1": -2}', "startingOffsets", "earliest")
    assert spec.per_partition == {"0-0": 10, "0-1": "earliest", "1-0": "latest", "1-1": "earliest"}
    assert spec.value_for("0-0") == 10 and spec.value_for("5-5") == "earliest"


def test_resolve_offsets_against_a_replica():
    info = OffsetInfo(min_offset=100, committed=5000)
    assert resolve_offset("earliest", info, "startingOffsets", "0-0") == 100
    assert resolve_offset("latest", info, "endingOffsets", "0-0") == 5000
    assert resolve_offset(300, info, "startingOffsets", "0-0") == 300
    with pytest.raises(OptionError, match="before the first available offset 100"):
        resolve_offset(50, info, "startingOffsets", "0-0")
    with pytest.raises(OptionError, match="beyond its committed offset 5000"):
        resolve_offset(6000, info, "endingOffsets", "0-0")
    with pytest.raises(OptionError, match="has no partition '0-9' \\(it has 0-0, 0-1, 10-0\\)"):
        check_partition_names(OffsetSpec("earliest", {"0-9": 1}), ["10-0", "0-1", "0-0"], "startingOffsets", "t")


# --- splitting ----------------------------------------------------------------------------------


def _log(sizes):
    """Record boundaries of a synthetic log with the given payload sizes."""
    buf = b"".join(encode_record(bytes(n)) for n in sizes)
    return [0] + record_ends(buf)


def _boundary_fn(boundaries, calls=None):
    def boundary(known, target):
        assert known in boundaries and known <= target  # always walks from a real boundary
        if calls is not None:
            calls.append((known, target))
        return next(b for b in boundaries if b >= target)

    return boundary


@pytest.mark.parametrize("seed", range(5))
def test_split_points_are_boundaries_and_cover_the_range_once(seed):
    rng = random.Random(seed)
    boundaries = _log([rng.randint(0, 3000) for _ in range(400)])
    start_i, end_i = rng.randint(0, 50), rng.randint(300, 400)
    start, end = boundaries[start_i], boundaries[end_i]
    max_bytes = rng.choice([1, 500, 4096, 20_000, 10**9])
    ranges = split_range(start, end, max_bytes, _boundary_fn(boundaries))
    assert ranges[0][0] == start and ranges[-1][1] == end
    for (a, b), (c, _d) in zip(ranges, ranges[1:]):
        assert b == c  # contiguous: every record in exactly one range
    for a, b in ranges:
        assert a < b and a in boundaries and b in boundaries
    for a, b in ranges[:-1]:
        assert b - a >= max_bytes  # at least max_bytes, at most max_bytes + one record
        assert b - a < max_bytes + 3000 + 20


def test_no_split_without_the_option_or_for_small_ranges():
    boundaries = _log([100] * 10)
    assert split_range(0, boundaries[-1], None, _boundary_fn(boundaries)) == [(0, boundaries[-1])]
    assert split_range(0, boundaries[-1], 10**6, _boundary_fn(boundaries)) == [(0, boundaries[-1])]
    assert split_range(5, 5, 1, _boundary_fn(boundaries)) == []


def test_split_with_one_huge_record_at_the_end():
    boundaries = _log([10, 10, 10, 100_000])
    ranges = split_range(0, boundaries[-1], 50, _boundary_fn(boundaries))
    assert ranges[-1][1] == boundaries[-1]
    assert all(a in boundaries and b in boundaries for a, b in ranges)


# --- replicas ------------------------------------------------------------------------------------


def test_replica_order_follows_read_from():
    addresses = BrokerAddresses(3, "meta://127.0.0.1:1000", ((0, "meta://127.0.0.1:1001"), (1, "meta://127.0.0.1:1002")))
    rng = random.Random(1)
    slave_order = ordered_replicas(addresses, "slave", rng)
    assert sorted(r.role for r in slave_order) == ["slave0", "slave1"]
    prefer = ordered_replicas(addresses, "prefer-slave", rng)
    assert [r.role for r in prefer][-1] == "master" and len(prefer) == 3
    master = ordered_replicas(addresses, "master", rng)
    assert master[0].role == "master" and len(master) == 3
    assert ordered_replicas(BrokerAddresses(3, "meta://127.0.0.1:1000"), "slave", rng) == ()
    assert ordered_replicas(None, "master", rng) == ()


# --- decoding -------------------------------------------------------------------------------------


def test_decode_columns_keeps_a_partial_tail_and_checks_crc():
    records = [encode_record(b"x" * 30, "tag"), encode_record(b"", None), encode_record(b"yz", "")]
    buf = b"".join(records)
    offsets, ids, attrs, datas, consumed = decode_columns(buf[:-3], 1000)
    assert offsets == [1000, 1000 + len(records[0])] and attrs == ["tag", None] and datas == [b"x" * 30, b""]
    assert consumed == len(records[0]) + len(records[1])
    corrupt = bytearray(buf)
    corrupt[len(records[0]) - 1] ^= 0xFF
    with pytest.raises(RecordError, match="record at offset 1000: checksum mismatch"):
        decode_columns(bytes(corrupt), 1000)


# --- with real processes -----------------------------------------------------------------------------


def test_reader_skips_a_dead_replica(broker_factory):
    from metaq.spark.reader import MetaQInputPartition, RangeReader
    from tests.spark.support import partition_ends, produce, replica, wait_caught_up

    master = broker_factory(0, {"t": 1}, {"unflushInterval": 100})
    slave = broker_factory(0, {"t": 1}, {"unflushInterval": 100}, slave_props={"slaveId": 0})
    produced = produce(master, "t", partitions=1, count=2000)
    end = partition_ends(produced)[0]
    wait_caught_up([master, slave], "t", {0: end})
    dead = Replica(0, "slave7", "127.0.0.1", free_port("127.0.0.1"))  # nobody listens there
    part = MetaQInputPartition(
        "t", "0-0", 0, 0, 0, end, (dead, replica(slave)), "slave", broker_factory.zk_connect, broker_factory.zk_root, 4096, 10_000
    )
    reader = RangeReader(part)
    batches = list(reader.batches())
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == [m.offset for m in produced]
    assert reader.used == [slave.url] and len(reader.errors) == 1 and "127.0.0.1" in reader.errors[0]


def test_spark_reports_option_and_cluster_errors(spark, zk, zk_root):
    with pytest.raises(Exception, match="zkConnect is required"):
        spark.read.format("metaq").option("topic", "t").load().collect()
    with pytest.raises(Exception, match="readFrom must be one of"):
        spark.read.format("metaq").option("zkConnect", zk.connect_string).option("topic", "t").option("readFrom", "any").load().collect()
    with pytest.raises(Exception, match="topic 'nope' not found"):
        spark.read.format("metaq").option("zkConnect", zk.connect_string).option("zkRoot", zk_root).option("topic", "nope").load().collect()
