"""Spark reads topics from slaves: the ``metaq`` PySpark data source (batch and streaming).

    from metaq.spark import MetaQDataSource
    spark.dataSource.register(MetaQDataSource)

See docs/spark.md. ``MetaQDataSource`` is imported lazily so that the pure parts
(options, planning helpers) load without pyspark.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MetaQDataSource"]


def __getattr__(name: str) -> Any:
    if name == "MetaQDataSource":
        from .source import MetaQDataSource

        return MetaQDataSource
    raise AttributeError(name)
