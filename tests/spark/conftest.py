"""One local SparkSession for all Spark tests (local[2], no UI, loopback), and the marker."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in item.path.resolve().parents:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator["object"]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    # Executors are Python workers started by the JVM: they inherit this environment.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *paths])
    from pyspark.sql import SparkSession

    from metaq.spark import MetaQDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("metaq-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(MetaQDataSource)
    try:
        yield session
    finally:
        session.stop()
