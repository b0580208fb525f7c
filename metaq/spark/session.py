"""A local SparkSession ready for the ``metaq`` source (tests, benchmarks, examples).

PySpark runs Python workers started by the JVM, which inherit this process's
environment: the worker interpreter must be this one (``PYSPARK_PYTHON``), must
find the ``metaq`` package (``PYTHONPATH``), and Spark must bind to loopback
(``SPARK_LOCAL_IP``) on machines without a routable hostname.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def prepare_environment() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(PACKAGE_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *paths])


def local_session(app_name: str = "metaq", cores: int = 2, master: str | None = None, **config: str) -> Any:
    """``local[cores]`` (or ``master``, e.g. ``local-cluster[2,1,1024]``), no UI, driver on
    127.0.0.1, the ``metaq`` source registered."""
    prepare_environment()
    from pyspark.sql import SparkSession

    from .source import MetaQDataSource

    builder = (
        SparkSession.builder.master(master or f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        # Executors in their own JVMs (local-cluster, a real cluster) start their Python
        # workers from the executor's environment, not the driver's: pass both explicitly.
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    )
    for key, value in config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(MetaQDataSource)
    return session
