"""The example pipeline (examples/spark_orders_pipeline.py, docs/spark.md "Example pipeline") run
against a sync master and slave of the test harness, in the shared local SparkSession: orders read
from the slave, enriched, written to ``orders-enriched`` exactly once, twice over one checkpoint
(the second run takes only the new orders)."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from tests.spark.conftest import REPO
from tests.spark.support import committed, get_counters

pytestmark = pytest.mark.spark
TOPICS = {"orders": 2, "orders-enriched": 2}


def _example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("spark_orders_pipeline", REPO / "examples" / "spark_orders_pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _slave_caught_up(master, slave, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    """The job reads the slave up to its committed offsets: wait until they are the master's."""
    deadline = time.monotonic() + timeout
    while any(committed(slave, "orders", n) < committed(master, "orders", n) for n in range(TOPICS["orders"])):
        assert time.monotonic() < deadline, "the slave did not catch up with the master"
        time.sleep(0.1)


def test_orders_pipeline_enriches_each_order_exactly_once(spark, broker_factory, zk, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    example = _example()
    master = broker_factory(0, TOPICS, {"unflushThreshold": 0})
    slave = broker_factory(0, TOPICS, {"unflushThreshold": 0}, {"slaveId": 0})
    options = example.login_options(example.argparse.Namespace(zk=zk.connect_string, zk_root=zk_root, user=None, password_file=None, tls_ca=None))
    checkpoint = str(tmp_path / "checkpoint")

    for first, count in ((0, 500), (500, 300)):  # the second run over the same checkpoint: only the new orders
        example.seed_orders(options, "orders", count, first=first)
        _slave_caught_up(master, slave)
        gets_before = get_counters(master)
        example.enrich(spark, options, "orders", "orders-enriched", checkpoint)
        assert get_counters(master) == gets_before  # the job read the orders from the slave only
        assert example.check(spark, options, "orders", "orders-enriched") == first + count

    rows = spark.read.format("metaq").options(**options).option("topic", "orders-enriched").option("readFrom", "master").load().collect()
    enriched = {(record := json.loads(bytes(r.data)))["order_id"]: (record, r.attribute, r.partition) for r in rows}
    assert sorted(enriched) == list(range(800))  # each order once
    partition_of_customer: dict[str, str] = {}
    for n, (record, attribute, partition) in enriched.items():
        amount = (n * 137) % 20000
        assert record["customer"] == f"customer-{n % 17}" and record["amount_cents"] == amount
        assert record["region"] == ("eu", "us", "apac")[n % 3]
        assert attribute == record["size"] == ("large" if amount >= 10000 else "medium" if amount >= 1000 else "small")
        # keyed by customer: all of a customer's orders in one partition
        assert partition_of_customer.setdefault(record["customer"], partition) == partition
