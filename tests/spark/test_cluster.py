"""Spark with separate executor JVMs (``local-cluster[2,1,1024]``), the source and the sink.

In ``local[N]`` every task runs in the driver's JVM and its Python workers share the driver's
environment and files; here two executors are launched as their own processes, as on a real
cluster, so what a task needs must travel in the plan: the pickled options and readers, the
password file's path and the CA bundle's (read by each task on its executor), the worker's
interpreter and PYTHONPATH (``spark.executorEnv.*``, set by ``metaq.spark.session``).
The job is the repository's example pipeline (examples/spark_orders_pipeline.py), run as a
script against a secured group with TLS: from the slave as ``app``, exactly once into
``orders-enriched``, checked by reading both topics back.

Starting the two executor JVMs makes it take 40-60 s on a busy 2-core machine, so the test is marked
``spark_cluster`` and deselected by default (pyproject's addopts); README and docs/spark.md
say how to run it: ``python -m pytest -m spark_cluster tests/spark/test_cluster.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.trust_support import PASSWORDS, start_tls_pair
from tests.spark.conftest import REPO

pytestmark = [pytest.mark.spark, pytest.mark.spark_cluster]
ORDERS = 600


@pytest.mark.timeout(600)
def test_example_pipeline_on_two_executor_jvms_with_a_login_over_tls(broker_factory, zk, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("pyspark")
    _group, ca, _master, _slave = start_tls_pair(broker_factory, zk_client, zk_root, tmp_path, {"orders": 2, "orders-enriched": 2})
    password_file = tmp_path / "app.password"
    password_file.write_text(PASSWORDS["app"] + "\n")
    # The script's directory, not the repository, is its sys.path[0]: point it at this checkout.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "spark_orders_pipeline.py"), "--spark-master", "local-cluster[2,1,1024]",
         "--zk", zk.connect_string, "--zk-root", zk_root, "--user", "app", "--password-file", str(password_file),
         "--tls-ca", str(ca.cert_file), "--seed", str(ORDERS), "--checkpoint", str(tmp_path / "checkpoint")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert f"orders-enriched: {ORDERS} orders, each exactly once (2 executors)" in result.stdout, result.stdout
