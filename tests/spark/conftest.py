"""One local SparkSession for all Spark tests (local[2], no UI, loopback)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark() -> Iterator["object"]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from metaq.spark.session import local_session

    session = local_session(
        "metaq-spark-tests",
        **{"spark.sql.shuffle.partitions": "2", "spark.sql.streaming.stopTimeout": "10s"},
    )
    try:
        yield session
    finally:
        session.stop()
