#!/usr/bin/env python
"""The Spark data source against ``DATABASE_URL``: bulk publish and batch read of 1,000,000 rows.

    DATABASE_URL=mysql://root@127.0.0.1:3306/test python benchmarks/spark_bench.py
    python benchmarks/spark_bench.py --rows 200000 --json benchmarks/results/spark.json

It runs in the benchmarks' own database (see benchmarks/settings.py). Figures:

* write: a DataFrame of N rows (JSON payload, key, id) published with ``df.write`` on
  ``local[2]``, against the same rows inserted by this script with a plain batched
  multi-row INSERT (1,000 rows per statement and commit, one connection): the ratio is
  the Spark write's rows/s over the raw INSERT's (target >= 0.5);
* read: the N rows read back with ``spark.read`` (every column materialised), rows/s;
* memory: the peak resident size of the driver JVM (in local mode the executors run in
  it) and the peak total of the Python worker processes, sampled every 0.2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

TOPIC = "bench"
INSERT_ROWS = 1000


def payload_json(n: int) -> str:
    """Row n's payload, as Spark's to_json writes it for the DataFrame below."""
    return json.dumps({"id": n, "kind": "reindex", "note": "bulk publish benchmark row"},
                      separators=(",", ":"))


class MemorySampler:
    """Peak RSS of a JVM and of the Python processes under it, sampled in a thread."""

    def __init__(self, jvm_pid: int) -> None:
        self.jvm_pid = jvm_pid
        self.python_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _status(pid: int, field: str) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _descendants(self) -> list[int]:
        parents: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                    parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
                except (OSError, IndexError, ValueError):
                    continue
        found, todo = [], list(parents.get(self.jvm_pid, []))
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += parents.get(pid, [])
        return found

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            total = sum(self._status(pid, "VmRSS") for pid in self._descendants())
            self.python_peak = max(self.python_peak, total)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        mib = 1024 * 1024
        return {"driver_jvm_peak_mib": round(self._status(self.jvm_pid, "VmHWM") / mib),
                "python_workers_peak_mib": round(self.python_peak / mib)}


def raw_insert(url: str, rows: int) -> float:
    """Insert the same rows with plain multi-row INSERTs; seconds taken."""
    from benchmarks.baselines import message_insert_sql
    from django_sqlqueue.store.connection import open_connection

    with open_connection(url) as conn:
        sql = message_insert_sql(conn.vendor, INSERT_ROWS)
        began = time.monotonic()
        for start in range(0, rows, INSERT_ROWS):
            count = min(INSERT_ROWS, rows - start)
            statement = sql if count == INSERT_ROWS else message_insert_sql(conn.vendor, count)
            params: list[Any] = []
            for n in range(start, start + count):
                params += [TOPIC, f"k{n % 1000}", str(n), payload_json(n), "{}"]
            with conn.atomic():
                conn.execute(statement, params)
        return time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Spark data source benchmark")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from benchmarks import database
    from benchmarks.settings import DATABASES

    db = DATABASES["default"]
    database.ensure_database(db)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from django_sqlqueue.models import QueueMessage, Topic

    url = _url(db)
    database.truncate(db)
    Topic.objects.record({TOPIC: 16}, "default")

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from django_sqlqueue.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("sqlqueue-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "2g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    sampler = MemorySampler(spark.sparkContext._gateway.proc.pid)
    sampler.start()
    frame = spark.range(args.rows, numPartitions=2).select(
        F.to_json(F.struct(F.col("id"), F.lit("reindex").alias("kind"),
                           F.lit("bulk publish benchmark row").alias("note"))).alias("payload"),
        F.concat(F.lit("k"), (F.col("id") % 1000).cast("string")).alias("key"),
        F.col("id").cast("string").alias("id"))
    print(f"writing {args.rows} rows with Spark (local[2]) into {database.label(db)}", flush=True)
    began = time.monotonic()
    frame.write.format("sqlqueue").option("url", url).option("topic", TOPIC).mode("append").save()
    spark_write = time.monotonic() - began
    stored = QueueMessage.objects.filter(topic=TOPIC).count()
    print(f"  spark write: {spark_write:.1f} s ({stored} rows stored)", flush=True)

    began = time.monotonic()
    total = (spark.read.format("sqlqueue").option("url", url).option("topic", TOPIC)
             .option("numPartitions", "2").load()
             .selectExpr("count(*) AS n", "sum(length(payload)) AS bytes").collect()[0])
    read = time.monotonic() - began
    print(f"  spark read: {read:.1f} s ({total['n']} rows)", flush=True)
    memory = sampler.stop()
    spark.stop()

    database.truncate(db)
    print("writing the same rows with a raw batched INSERT", flush=True)
    raw = raw_insert(url, args.rows)
    print(f"  raw insert: {raw:.1f} s", flush=True)
    figures = {
        "rows": args.rows, "database": database.label(db),
        "spark_write_seconds": round(spark_write, 1), "raw_insert_seconds": round(raw, 1),
        "write_ratio": round(raw / spark_write, 2),
        "spark_write_rows_per_second": round(args.rows / spark_write),
        "raw_insert_rows_per_second": round(args.rows / raw),
        "read_seconds": round(read, 1), "read_rows_per_second": round(int(total["n"]) / read),
        **memory,
    }
    database.truncate(db)
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def _url(db: dict[str, Any]) -> str:
    from urllib.parse import quote

    kind = {"django.db.backends.mysql": "mysql", "django.db.backends.postgresql": "postgres",
            "django.db.backends.sqlite3": "sqlite"}[db["ENGINE"]]
    if kind == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = quote(db.get("USER") or "")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"{kind}://{auth}@{db.get('HOST') or '127.0.0.1'}{port}/{db['NAME']}"


if __name__ == "__main__":
    sys.exit(main())
