#!/usr/bin/env python
"""Time the operator's reads and bulk actions on a big log.

    DATABASE_URL=mysql://root@127.0.0.1:3306/ops_bench python benchmarks/operations.py

Uses the database named in ``DATABASE_URL`` as it is (migrates it and empties the queue
tables: give it a database of its own). Fills ``queue_messages`` with ``--messages`` rows of
topic ``orders`` (16 partitions) and ``--dead-letters`` dead letters of group ``billing``
directly in SQL, then times ``overview()``, dead-letter counts and samples, and a bulk
replay of every dead letter, reporting the longest batch (the longest any transaction held
its locks) and the peak Python memory of the replay.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

PARTITIONS = 16


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--dead-letters", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=500)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_sqlqueue import operations as ops
    from django_sqlqueue.models import ConsumerOffset

    call_command("migrate", verbosity=0, interactive=False)
    fill(connection, args.messages, args.dead_letters)
    names = [str(p) for p in range(PARTITIONS)]
    for group in ("billing", "shipping"):
        ConsumerOffset.objects.ensure(group, "orders", names, "default")
    # shipping is half-way through each partition; billing has consumed nothing.
    ConsumerOffset.objects.filter(consumer_group="shipping").update(
        offset_acked=args.messages // 2)

    def timed(label: str, fn, repeat: int = 3):  # type: ignore[no-untyped-def]
        best, value = float("inf"), None
        for _ in range(repeat):
            t0 = time.perf_counter()
            value = fn()
            best = min(best, time.perf_counter() - t0)
        print(f"{label}: {best * 1000:.0f} ms (best of {repeat})")
        return value

    rows = timed("overview (2 groups, 1 topic)", lambda: ops.overview(topic="orders"))
    for row in rows:
        print(f"  {row.group}: lag={'~' if row.lag_estimated else ''}{row.lag} "
              f"dead_letters={row.dead_letters} oldest={row.oldest_pending_age_seconds}")
    f = ops.DeadLetterFilter
    timed("count all dead letters", lambda: ops.count(f()))
    timed("count by error text", lambda: ops.count(f(error_contains="declined 7")))
    timed("sample of 10 (dry run)", lambda: ops.sample(f(group="billing")))
    longest = [0.0]
    last = [time.perf_counter()]

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        longest[0] = max(longest[0], now - last[0])
        last[0] = now

    tracemalloc.start()
    t0 = time.perf_counter()
    last[0] = t0
    outcome = ops.replay(f(topic="orders"), batch_size=args.batch_size, progress=progress)
    took = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"replay of {outcome.replayed} dead letters: {took:.1f} s, "
          f"{outcome.replayed / took:.0f}/s, longest batch {longest[0] * 1000:.0f} ms, "
          f"peak Python memory {peak / 1e6:.1f} MB")
    return 0


def fill(connection, messages: int, dead_letters: int) -> None:  # type: ignore[no-untyped-def]
    """Insert the rows in SQL from a digits table cross-joined with itself."""
    q = connection.ops.quote_name
    tables = ["queue_messages", "queue_delivery_state", "queue_offsets", "queue_partition_leases",
              "queue_subscriber_heartbeats", "queue_sequencer", "queue_topics",
              "queue_group_controls", "queue_throughput"]
    t0 = time.perf_counter()
    with connection.cursor() as c:
        for table in tables:
            c.execute(f"DELETE FROM {q(table)}")  # noqa: S608 - our own table names
        c.execute("DROP TABLE IF EXISTS ops_digits")
        c.execute("CREATE TABLE ops_digits (d INTEGER)")
        c.execute("INSERT INTO ops_digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)")
        numbers = ("SELECT a.d + 10*b.d + 100*c.d + 1000*e.d + 10000*f.d + 100000*g.d + 1 AS n "
                   "FROM ops_digits a, ops_digits b, ops_digits c, ops_digits e, ops_digits f, "
                   "ops_digits g")
        text = "CAST(n AS CHAR)" if connection.vendor == "mysql" else "CAST(n AS TEXT)"
        cols = ", ".join(q(c) for c in (
            "topic", "message_key", "partition_key", "id", "payload", "metadata", "failed_at",
            "failure_count", "last_error", "original_topic", "original_offset", "consumer_group",
            "created_at", "published_at", "deliver_at", "position", "original_id"))
        now = int(time.time() * 1000)
        json_obj = "CAST('{}' AS jsonb)" if connection.vendor == "postgresql" else "'{}'"
        c.execute(
            f"INSERT INTO {q('queue_messages')} ({cols}) SELECT 'orders', {text}, "  # noqa: S608 - benchmark SQL, constants only
            f"{text.replace('n AS', f'n %% {PARTITIONS} AS')}, {text}, {json_obj}, {json_obj}, "
            f"0, 0, '', '', 0, '', {now}, {now} - n, {now} - n, n, '' "
            f"FROM ({numbers}) AS s WHERE n <= %s", [messages])
        payload = ("CAST('{\"customer_id\": 7}' AS jsonb)" if connection.vendor == "postgresql"
                   else "'{\"customer_id\": 7}'")
        c.execute(
            f"INSERT INTO {q('queue_messages')} ({cols}) SELECT 'orders_dlq', {text}, "  # noqa: S608 - benchmark SQL, constants only
            f"{text.replace('n AS', f'n %% {PARTITIONS} AS')}, "
            + ("CONCAT('billing:', " + text + ")" if connection.vendor == "mysql"
               else "'billing:' || " + text)
            + f", {payload}, {json_obj}, {now} - n, 5, "
            + ("CONCAT('card declined ', " + text + ")" if connection.vendor == "mysql"
               else "'card declined ' || " + text)
            + f", 'orders', n, 'billing', {now}, {now} - n, {now}, %s + n, {text} "
            f"FROM ({numbers}) AS s WHERE n <= %s", [messages, dead_letters])
        c.execute(f"INSERT INTO {q('queue_sequencer')} ({q('name')}, {q('last_position')}, "  # noqa: S608 - benchmark SQL
                  f"{q('sequenced_by')}, {q('sequenced_at')}) VALUES ('default', %s, '', 0)",
                  [messages + dead_letters])
        c.execute(f"INSERT INTO {q('queue_topics')} ({q('topic')}, {q('partitions')}, "  # noqa: S608 - benchmark SQL
                  f"{q('created_at')}, {q('updated_at')}) VALUES ('orders', %s, 0, 0), "
                  f"('orders_dlq', %s, 0, 0)", [PARTITIONS, PARTITIONS])
        c.execute("DROP TABLE ops_digits")
        if connection.vendor == "postgresql":
            c.execute("ANALYZE")
        elif connection.vendor == "mysql":
            c.execute(f"ANALYZE TABLE {q('queue_messages')}")
            c.fetchall()
    print(f"filled {messages} messages and {dead_letters} dead letters in "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
