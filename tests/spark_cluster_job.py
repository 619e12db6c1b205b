"""A bulk publish and a read back on a standalone Spark cluster (run by test_spark_cluster).

    python -m tests.spark_cluster_job MASTER_URL DATABASE_URL

Prints one JSON line: the rows read back and the executors that ran the tasks.
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from django_sqlqueue.spark import register


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def main(master: str, url: str) -> int:
    spark = (SparkSession.builder.master(master).appName("sqlqueue-cluster-test")
             .config("spark.pyspark.python", sys.executable)
             .config("spark.executor.memory", "512m").config("spark.cores.max", "1")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        register(spark)
        rows = spark.range(100, numPartitions=2).select(
            F.to_json(F.struct("id")).alias("payload"), F.col("id").cast("string").alias("id"))
        (rows.write.format("sqlqueue").option("url", url).option("topic", "cluster")
         .option("partitions", "4").mode("append").save())
        read = (spark.read.format("sqlqueue").option("url", url).option("topic", "cluster")
                .option("numPartitions", "2").load())
        ids = sorted(int(r["id"]) for r in read.select("id").collect())
        # The JVM whose Python workers ran the tasks (a worker's parent is pyspark.daemon,
        # whose parent is that JVM).
        jvms = (spark.sparkContext.parallelize(range(2), 2)
                .map(lambda _: _parent(os.getppid())).distinct().collect())
        print(json.dumps({"ids": ids, "driver_jvm": spark.sparkContext._gateway.proc.pid,
                          "task_jvms": jvms}))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
