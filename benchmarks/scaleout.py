"""Scale-out (scaleout): the same fleet over one MariaDB server and over two.

Two topics, ``bench`` and ``bench_b`` (no-op handlers), ``--scaleout-messages`` each
(20,000 by default), drained by two workers serving both. In the ``one`` layout both
topics live on the benchmark's server; in the ``two`` layout ``SQLQUEUE["TOPICS"]``
places ``bench_b`` on a second ``mariadbd`` on this machine (clusters/mariadb.py, port
23306), so each worker runs one engine per server. Rounds alternate the layouts; the
medians are reported:

- ``scaleout_one_total`` / ``scaleout_two_total``: messages/s over both topics, from the
  workers' launch until the last topic is drained;
- ``scaleout_two_server_<alias>``: messages/s of the topic on each server, until that
  topic was drained;
- ``scaleout_gain``: ``two_total`` / ``one_total``.

Both servers run on the same two cores as the workers, so the figures say what splitting
topics costs and gains when the machine, not the server, is the limit; docs/operating.md
("When one server is not enough") says when a second server pays.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import connections

import django_sqlqueue as sqlqueue

from . import database, suite
from .suite import Context, Result

TOPICS = ("bench", "bench_b")
SECOND = "second"
ROUNDS = 3
WORKERS = ("a", "b")
TIMEOUT = 300.0
BATCH = 5000


def scaleout(ctx: Context) -> list[Result]:
    if ctx.vendor != "mysql" or SECOND not in settings.DATABASES:
        return [Result("scaleout_gain", None, "x",
                       details={"skipped": "needs MariaDB/MySQL (a second mariadbd)"})]
    from clusters.mariadb import MariaDBServer

    server = MariaDBServer()
    server.start()
    second = settings.DATABASES[SECOND]
    database.ensure_database(second)
    call_command("migrate", database=SECOND, verbosity=0, interactive=False)
    total = ctx.scaleout_messages
    runs: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}
    try:
        for n in range(ROUNDS):
            for layout in ("one", "two"):
                ctx.log(f"  round {n + 1}: {layout} server(s), {total} messages per topic, "
                        f"{len(WORKERS)} workers")
                runs[layout].append(_round(ctx, layout, total))
                ctx.log(f"    {json.dumps(runs[layout][-1])}")
    finally:
        suite.stop_workers(ctx)
        for alias in ("default", SECOND):
            connections[alias].close()
        database.truncate(second)
        server.stop()
    one = statistics.median(r["total_rate"] for r in runs["one"])
    two = statistics.median(r["total_rate"] for r in runs["two"])
    results = [
        Result("scaleout_one_total", round(one), "msg/s", details={"rounds": runs["one"]}),
        Result("scaleout_two_total", round(two), "msg/s", details={"rounds": runs["two"]}),
    ]
    for alias in ("default", SECOND):
        rate = statistics.median(r["rates"][alias] for r in runs["two"])
        results.append(Result(f"scaleout_two_server_{alias}", round(rate), "msg/s"))
    results.append(Result("scaleout_gain", round(two / one, 2), "x"))
    return results


def _round(ctx: Context, layout: str, total: int) -> dict[str, Any]:
    placed = {"bench": "default", "bench_b": SECOND if layout == "two" else "default"}
    ctx.empty_queue()
    connections[SECOND].close()
    database.truncate(settings.DATABASES[SECOND])
    for topic, alias in placed.items():
        for start in range(0, total, BATCH):
            sqlqueue.publish_many(topic, [
                {"payload": suite.make_payload(i), "key": f"k{i % 64}"}
                for i in range(start, min(total, start + BATCH))], using=alias)
    topics = dict(settings.SQLQUEUE.get("TOPICS") or {})
    if layout == "two":
        topics["bench_b"] = {"DATABASE": SECOND}
    env = {"SQLQUEUE_BENCH_SETTINGS": json.dumps({"TOPICS": topics})}
    launch = time.monotonic()
    for name in WORKERS:
        suite.start_worker(ctx, "bench", f"scaleout-{layout}-{name}", env,
                           ["--topic", "bench_b", "--name", f"scaleout-{name}"])
    done: dict[str, float] = {}
    try:
        while len(done) < len(placed) and time.monotonic() - launch < TIMEOUT:
            for topic, alias in placed.items():
                if topic not in done and _drained(alias, topic, total):
                    done[topic] = time.monotonic() - launch
            suite.check_workers_alive(ctx)
            time.sleep(0.05)
    finally:
        suite.stop_workers(ctx)
    if len(done) < len(placed):
        raise RuntimeError(f"scaleout ({layout}): not drained within {TIMEOUT:g} s: {done}")
    rates: dict[str, float] = {}
    for topic, alias in placed.items():
        rates[alias] = rates.get(alias, 0.0) + total / done[topic]
    return {"seconds": {t: round(s, 2) for t, s in done.items()},
            "total_rate": round(total * len(placed) / max(done.values())),
            "rates": {alias: round(rate) for alias, rate in rates.items()}}


def _drained(alias: str, topic: str, total: int) -> bool:
    """Whether every message of ``topic`` on ``alias`` is acked by group ``bench``."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT COUNT(*), COALESCE(MAX(position), 0) FROM queue_messages "
                       "WHERE topic = %s", [topic])
        count, _ = cursor.fetchone()
        if count < total:
            return False
        cursor.execute(
            "SELECT COUNT(*) FROM queue_messages m LEFT JOIN queue_offsets o "
            "ON o.consumer_group = 'bench' AND o.topic = m.topic "
            "AND o.partition_key = m.partition_key "
            "WHERE m.topic = %s AND (m.position IS NULL OR o.offset_acked IS NULL "
            "OR o.offset_acked < m.position)", [topic])
        (left,) = cursor.fetchone()
        return int(left) == 0


BENCHMARKS = {"scaleout": scaleout}
