"""A PySpark data source for the queue's log: bulk publish, analytics reads, streams.

Needs the ``spark`` extra (pyspark and pyarrow)::

    from django_sqlqueue.spark import register
    register(spark)
    spark.read.format("sqlqueue").option("url", url).option("topic", "orders").load()

No Django settings are needed on the driver or the executors: they connect with the
``url`` option (``DATABASE_URL`` format). See docs/spark.md.
"""

from __future__ import annotations

from typing import Any

from .options import SparkOptionError

__all__ = ["SparkOptionError", "register"]


def register(spark: Any) -> None:
    """Register the ``sqlqueue`` format with a SparkSession."""
    from .source import SqlQueueDataSource

    spark.dataSource.register(SqlQueueDataSource)
