"""The archive job: export what every consumer group has consumed to Parquet.

    python -m django_sqlqueue.spark.archive --url URL --out DIR [--topics a,b]
    spark-submit -m ... (or the file) with the same arguments on a cluster

Per partition it exports the messages above the partition's archive mark and at or
below the lowest watermark of the topic's registered groups, to ``DIR/topic=T/date=D/``
(the day they were published, UTC), then moves the mark. A rerun exports only what is
new. Files are written to ``DIR/_staging/<run>`` first and moved into place under names
that start with the run id; should the job stop while moving, the next run removes that
run's files and exports the range again, so no message is archived twice.
With ``SQLQUEUE["ARCHIVE_BEFORE_GC"]`` GC deletes nothing above the marks.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    # Run by path, as ``spark-submit .../archive.py`` does: import this module's package
    # instead of its directory (whose modules would shadow top-level ones, and where the
    # relative imports below mean nothing).
    import os.path as _path
    import sys as _sys

    _here = _path.dirname(_path.abspath(__file__))
    _sys.path[:] = [p for p in _sys.path if _path.abspath(p or ".") != _here]
    __package__ = "django_sqlqueue.spark"  # PEP 366: resolve the relative imports
    import django_sqlqueue.spark  # noqa: F401 - the parent of the relative imports

import argparse
import os
import shutil
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..store import archive as archive_store
from ..store import dead_letters as dead_letter_store
from ..store import offsets as offset_store
from ..store import topics as topic_store
from ..store.connection import Connection, open_connection, redact

STAGING = "_staging"


@dataclass
class TopicSummary:
    topic: str
    messages: int = 0
    bytes: int = 0
    first: datetime | None = None
    last: datetime | None = None
    dead_letters: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        span = (f"{self.first:%Y-%m-%d %H:%M:%S} .. {self.last:%Y-%m-%d %H:%M:%S}"
                if self.first and self.last else "-")
        dead = ", ".join(f"{g}={n}" for g, n in sorted(self.dead_letters.items())) or "none"
        return (f"{self.topic}: {self.messages} messages, {self.bytes} bytes, {span}, "
                f"dead letters by group: {dead}")


def _recover(conn: Connection, out: Path) -> None:
    """Remove the files of a run that stopped while moving them into place."""
    for run in archive_store.pending_runs(conn):
        for path in out.glob(f"topic=*/date=*/{run}-*"):
            path.unlink()
        with conn.atomic():
            archive_store.abandon(conn, run)
    shutil.rmtree(out / STAGING, ignore_errors=True)


def _ranges(conn: Connection, topics: list[str]) -> list[tuple[str, int, int, int]]:
    """(topic, partition, after, up_to) of what is consumed and not yet archived."""
    result = []
    with conn.atomic():
        for topic in topics:
            archived = archive_store.marks(conn, topic)
            for partition, horizon in offset_store.gc_horizons(conn, topic).items():
                done = archived.get(partition, 0)
                if horizon > done:
                    result.append((topic, int(partition), done, horizon))
    return result


def archive(spark: Any, url: str, out: str, topics: list[str] | None = None) -> list[TopicSummary]:
    """Export what is consumed and not yet archived; return a summary per topic."""
    from pyspark.sql import functions as F

    from . import register

    register(spark)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    with open_connection(url) as conn:
        _recover(conn, root)
        with conn.atomic():
            names = topics or topic_store.recorded_topics(conn)
        ranges = _ranges(conn, names)
        summaries = {topic: TopicSummary(topic) for topic in names}
        if ranges:
            run = uuid.uuid4().hex[:12]
            staging = root / STAGING / run
            bounds = spark.createDataFrame(ranges, "topic string, partition int, after bigint, "
                                                   "up_to bigint")
            log = (spark.read.format("sqlqueue").option("url", url)
                   .option("topic", ",".join(sorted({r[0] for r in ranges})))
                   .option("startPosition", str(min(r[2] for r in ranges)))
                   .option("endPosition", str(max(r[3] for r in ranges))).load())
            chosen = (log.join(F.broadcast(bounds), ["topic", "partition"])
                      .where("position > after AND position <= up_to").drop("after", "up_to")
                      .withColumn("date", F.to_date("published_at")))
            chosen.write.partitionBy("topic", "date").parquet(str(staging))
            totals = []
            # No file when GC had deleted the range's messages already (an archive that
            # GC does not wait for): there is nothing to read back, only marks to move.
            if any(staging.glob("topic=*/date=*/*.parquet")):
                totals = spark.read.parquet(str(staging)).groupBy("topic").agg(
                    F.count("*").alias("n"),
                    F.sum(F.length("payload") + F.length("headers")).alias("bytes"),
                    F.min("published_at").alias("first"),
                    F.max("published_at").alias("last")).collect()
            for row in totals:
                summary = summaries[row["topic"]]
                summary.messages, summary.bytes = int(row["n"]), int(row["bytes"] or 0)
                summary.first, summary.last = row["first"], row["last"]
            with conn.atomic():
                for topic in {r[0] for r in ranges}:
                    archive_store.set_pending(
                        conn, topic, {str(p): up_to for t, p, _, up_to in ranges if t == topic}, run)
            for path in staging.glob("topic=*/date=*/*.parquet"):
                target = root / path.parent.parent.name / path.parent.name
                target.mkdir(parents=True, exist_ok=True)
                os.replace(path, target / f"{run}-{path.name}")
            with conn.atomic():
                archive_store.finish(conn, run)
            shutil.rmtree(root / STAGING, ignore_errors=True)
        with conn.atomic():
            for topic, summary in summaries.items():
                summary.dead_letters = dead_letter_store.by_group(conn, topic)
    return [summaries[topic] for topic in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m django_sqlqueue.spark.archive",
        description="Export the messages every consumer group has consumed to Parquet.")
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL"),
                        help="the queue's database (DATABASE_URL format; default: $DATABASE_URL)")
    parser.add_argument("--out", required=True, help="the archive's directory")
    parser.add_argument("--topics", nargs="*", default=None,
                        help="topics to archive (default: every recorded topic)")
    args = parser.parse_args(argv)
    if not args.url:
        parser.error("--url is required (or set DATABASE_URL)")
    topics = [t for part in (args.topics or []) for t in part.split(",") if t] or None
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()  # spark-submit's, or a caller's: left running
    spark = existing or SparkSession.builder.appName("sqlqueue-archive").getOrCreate()
    try:
        summaries = archive(spark, args.url, args.out, topics)
    finally:
        if existing is None:
            spark.stop()
    print(f"archived from {redact(args.url)} to {args.out}")
    for summary in summaries:
        print(summary.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
