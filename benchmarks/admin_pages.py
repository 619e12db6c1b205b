"""``admin_pages``: every admin page of the queue on a big log, timed, with its plans checked.

Fills the log with ``--admin-messages`` messages (default 1,000,000) in four topics and
``--admin-dead-letters`` dead letters (default 100,000) with SQL of its own (publishing a
million messages one by one would take longer than every other benchmark together), then
renders each page in-process with Django's test client as a superuser: one warm-up, then
the median of five. On MariaDB/MySQL every SELECT a page sends is EXPLAINed and a full
scan of ``queue_messages`` is reported. Target: each page under 300 ms.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction

from benchmarks.suite import Context, Result, at_most

PAGE_LIMIT_MS = 300.0
RUNS = 5
TOPICS = 4
PARTITIONS = 16
GROUPS = ("billing", "shipping")
CUSTOMERS = 50_000  # distinct payload customer_id values
BATCH = 100_000  # rows per INSERT … SELECT


def _series(vendor: str, low: int, high: int) -> str:
    """A one-column (``seq``) row source of the integers low..high."""
    if vendor == "mysql":
        return f"(SELECT seq FROM seq_{low}_to_{high}) AS s"  # noqa: S608 - numbers only
    if vendor == "postgresql":
        return f"generate_series({low}, {high}) AS s(seq)"
    return (f"(WITH RECURSIVE r(seq) AS (SELECT {low} UNION ALL SELECT seq + 1 FROM r "  # noqa: S608 - numbers only
            f"WHERE seq < {high}) SELECT seq FROM r) AS s")


def _concat(vendor: str, *parts: str) -> str:
    if vendor == "mysql":
        return f"CONCAT({', '.join(parts)})"
    return "(" + " || ".join(f"CAST({p} AS TEXT)" if not p.startswith("'") else p
                             for p in parts) + ")"


def _json(vendor: str, text: str) -> str:
    return f"CAST({text} AS jsonb)" if vendor == "postgresql" else text


def fill(ctx: Context, messages: int, dead_letters: int) -> dict[str, float]:
    """The big log: published messages, sequenced, and dead-letter copies; watermarks a
    little behind, so every group lags; leases and heartbeats."""
    from django_sqlqueue.models import (
        ConsumerOffset,
        LogSequencer,
        PartitionLease,
        SubscriberHeartbeat,
        Topic,
    )

    v = ctx.vendor
    q = connection.ops.quote_name
    columns = ", ".join(q(c) for c in (
        "topic", "message_key", "partition_key", "id", "payload", "metadata", "failed_at",
        "failure_count", "last_error", "original_topic", "original_offset", "consumer_group",
        "created_at", "published_at", "deliver_at", "position", "original_id"))
    now = int(time.time() * 1000)
    timings = {}

    def c(*parts: str) -> str:
        return _concat(v, *parts)

    def insert(expressions: list[str], low: int, high: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {q('queue_messages')} ({columns}) "  # noqa: S608 - bench SQL, no input
                f"SELECT {', '.join(expressions)} FROM {_series(v, low, high)}")

    published = [
        c("'topic'", f"seq % {TOPICS}"), c("'key-'", "seq % 10000"), c("''", f"seq % {PARTITIONS}"),
        c("'m-'", "seq"),
        _json(v, c("'{\"customer_id\": '", f"seq % {CUSTOMERS}", "', \"order_id\": '", "seq",
                   "', \"note\": \"bench\"}'")),
        _json(v, "'{}'"), "0", "0", "''", "''", "0", "''", f"{now} - seq", f"{now} - seq",
        f"{now} - seq", "seq", "''",
    ]
    began = time.monotonic()
    for low in range(1, messages + 1, BATCH):
        insert(published, low, min(messages, low + BATCH - 1))
    timings["fill_messages_s"] = round(time.monotonic() - began, 1)
    group = f"CASE WHEN seq % 2 = 0 THEN '{GROUPS[0]}' ELSE '{GROUPS[1]}' END"
    dead = [
        c("'topic'", f"seq % {TOPICS}", "'_dlq'"), c("'key-'", "seq % 10000"),
        c("''", f"seq % {PARTITIONS}"), c(group, "':'", "seq"),
        _json(v, c("'{\"customer_id\": '", f"seq % {CUSTOMERS}", "', \"order_id\": '", "seq",
                   "'}'")),
        _json(v, "'{}'"), f"{now} - seq * 1000", "5",
        c("'RuntimeError: customer '", f"seq % {CUSTOMERS}", "' was refused'"),
        c("'topic'", f"seq % {TOPICS}"), "seq", group, str(now), str(now), str(now),
        f"{messages} + seq", c("'m-'", "seq"),
    ]
    began = time.monotonic()
    for low in range(1, dead_letters + 1, BATCH):
        insert(dead, low, min(dead_letters, low + BATCH - 1))
    timings["fill_dead_letters_s"] = round(time.monotonic() - began, 1)
    topics = [f"topic{t}" for t in range(TOPICS)]
    Topic.objects.record({**{t: PARTITIONS for t in topics},
                          **{f"{t}_dlq": PARTITIONS for t in topics}}, "default")
    with transaction.atomic():
        LogSequencer.objects.lock_counter_wait("default")
        LogSequencer.objects.advance(messages + dead_letters, "bench", "default")
    partitions = [str(p) for p in range(PARTITIONS)]
    behind = 200 * PARTITIONS * TOPICS  # each group lags by about this many positions
    for group in GROUPS:
        for topic in topics:
            ConsumerOffset.objects.ensure(group, topic, partitions, "default")
            PartitionLease.objects.ensure_partitions(group, topic, partitions, "default")
            SubscriberHeartbeat.objects.beat(group, topic, f"{group}-worker", now, "default")
        ConsumerOffset.objects.filter(consumer_group=group).update(offset_acked=messages - behind)
        PartitionLease.objects.filter(consumer_group=group).update(
            leased_by=f"{group}-worker", leased_at=now - 60_000, lease_renewed_at=now)
    if v == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE TABLE {q('queue_messages')}")
            cursor.fetchall()
    elif v == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {q('queue_messages')}")
    return timings


class _Statements:
    """An execute wrapper keeping each statement a page sends, with its parameters bound."""

    def __init__(self) -> None:
        self.sql: list[str] = []
        self.slowest: tuple[float, str] = (0.0, "")

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        cursor = context["cursor"]
        began = time.perf_counter()
        result = execute(sql, params, many, context)
        took = (time.perf_counter() - began) * 1000
        last = getattr(cursor.cursor, "_executed", None)  # MySQLdb: the statement as sent
        self.sql.append(last.decode() if isinstance(last, bytes) else (last or sql))
        if took > self.slowest[0]:
            self.slowest = (took, self.sql[-1])
        return result


def _full_scans(statements: list[str]) -> list[str]:
    """The SELECTs (of a page) MariaDB/MySQL would run as a full scan of queue_messages."""
    found = []
    for sql in statements:
        if not sql.lstrip().upper().startswith("SELECT") or "queue_messages" not in sql:
            continue
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql)
            names = [c[0] for c in cursor.description]
            for row in cursor.fetchall():
                plan = dict(zip(names, row, strict=True))
                if plan.get("table") in ("queue_messages", "U0", "U1") and plan.get("type") == "ALL":
                    found.append(sql[:160])
    return found


def admin_pages(ctx: Context) -> list[Result]:
    from django.contrib.auth.models import User
    from django.test import Client, override_settings
    from django.urls import reverse

    from django_sqlqueue.conf import raw_settings
    from django_sqlqueue.models import DeadLetter, QueueMessage
    from django_sqlqueue.models.payload_search import ensure_search_indexes

    ctx.empty_queue()
    timings = fill(ctx, ctx.admin_messages, ctx.admin_dead_letters)
    began = time.monotonic()
    ensure_search_indexes(["customer_id"])
    timings["search_index_s"] = round(time.monotonic() - began, 1)
    ctx.log(f"  filled in {timings}")
    User.objects.filter(username="bench-admin").delete()
    user = User.objects.create_superuser("bench-admin", password="x")  # noqa: S106 - bench only
    client = Client()
    client.force_login(user)
    letter = DeadLetter.objects.order_by("-failed_at", "-offset").first()
    message = QueueMessage.objects.filter(failed_at=0).order_by("-offset").first()
    dl = reverse("admin:django_sqlqueue_deadletter_changelist")
    msgs = reverse("admin:django_sqlqueue_queuemessage_changelist")
    pages: dict[str, Callable[[], Any]] = {
        "overview": lambda: client.get(reverse("admin:django_sqlqueue_overview")),
        "dead_letters": lambda: client.get(dl),
        "dead_letters_topic": lambda: client.get(dl, {"original_topic": "topic1"}),
        "dead_letters_group": lambda: client.get(dl, {"consumer_group": "billing"}),
        "dead_letters_failed_1h": lambda: client.get(dl, {"failed": "1h"}),
        "dead_letters_search_field": lambda: client.get(dl, {"q": "customer_id=4242"}),
        "dead_letters_search_key": lambda: client.get(dl, {"q": "key-77"}),
        "dead_letters_search_text": lambda: client.get(dl, {"q": "customer 4242 was"}),
        "dead_letters_search_other_field": lambda: client.get(dl, {"q": "order_id=4242"}),
        "dead_letter_detail": lambda: client.get(
            reverse("admin:django_sqlqueue_deadletter_change", args=[letter.offset])),
        "replay_confirmation_all": lambda: client.post(dl + "?original_topic=topic1", {
            "action": "replay_dead_letters", "index": "0", "select_across": "1",
            "_selected_action": [str(letter.offset)]}),
        "messages": lambda: client.get(msgs),
        "messages_topic": lambda: client.get(msgs, {"topic": "topic2"}),
        "messages_partition": lambda: client.get(msgs, {"topic": "topic2", "partition": "5"}),
        "message_detail": lambda: client.get(
            reverse("admin:django_sqlqueue_queuemessage_change", args=[message.offset])),
        "partitions": lambda: client.get(reverse("admin:django_sqlqueue_partition_changelist")),
        "subscribers": lambda: client.get(reverse("admin:django_sqlqueue_subscriber_changelist")),
    }
    results = []
    with override_settings(SQLQUEUE={**raw_settings(), "SEARCH_FIELDS": ["customer_id"]},
                           ALLOWED_HOSTS=["testserver"]):
        for name, get in pages.items():
            captured = _Statements()
            with connection.execute_wrapper(captured):
                response = get()
            if response.status_code != 200:
                raise RuntimeError(f"{name} answered {response.status_code}")
            scans = _full_scans(captured.sql) if ctx.vendor == "mysql" else []
            times = []
            for _ in range(RUNS):
                t0 = time.perf_counter()
                get()
                times.append((time.perf_counter() - t0) * 1000)
            results.append(at_most(f"admin_{name}", round(statistics.median(times), 1), "ms",
                                   PAGE_LIMIT_MS, {"queries": len(captured.sql),
                                                   "max_ms": round(max(times), 1),
                                                   "slowest_statement_ms": round(captured.slowest[0], 1),
                                                   "slowest_statement": captured.slowest[1][:300],
                                                   "full_scans": scans}))
    results.append(Result("admin_fill", timings["fill_messages_s"], "s", details={
        **timings, "messages": ctx.admin_messages, "dead_letters": ctx.admin_dead_letters}))
    _drop_search_index(ctx)
    return results


def _drop_search_index(ctx: Context) -> None:
    """Later benchmarks publish into the same table: leave it as the library makes it."""
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        if ctx.vendor == "mysql":
            cursor.execute(f"ALTER TABLE {q('queue_messages')} DROP COLUMN {q('sqlqueue_s_customer_id')}")
        else:
            cursor.execute(f"DROP INDEX IF EXISTS {q('queue_msg_s_customer_id')}")


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {"admin_pages": admin_pages}
