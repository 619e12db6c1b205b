"""Migrate the database ``DATABASE_URL`` names, use names that differ only in case, and print
what the queue made of them as JSON (run by tests/test_exact_names.py in a process of its
own, on a database it created with a case-insensitive default collation).

    DATABASE_URL=mysql://root@127.0.0.1:3306/x_ci python -m tests.exact_names_probe
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    os.environ.pop("SQLQUEUE_TEST_DB_NAME", None)  # this database, not the test run's
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    json.dump(probe(), sys.stdout)


def probe() -> dict[str, Any]:
    from django.db import connection, transaction

    from django_sqlqueue import schedules
    from django_sqlqueue.models import LimitSlot, Schedule, TaskResultRecord
    from django_sqlqueue.scheduling.firing import fire, tick_id
    from django_sqlqueue.scheduling.spec import from_definition
    from django_sqlqueue.store import archive
    from django_sqlqueue.store.connection import django_connection
    from django_sqlqueue.testing import drain

    seen: dict[str, Any] = {}
    # Two schedules, one tick: their task results are "schedule:Nightly:…" and
    # "schedule:nightly:…", and each task runs once.
    tick = 1_800_000_000_000
    for name in ("Nightly", "nightly"):
        schedules.add(name, cron="0 3 * * *", task="tests.testapp.tasks.noop")
        row = Schedule.objects.get(name=name)
        with transaction.atomic():
            fire(from_definition(row.name, row.definition), tick_id(name, tick), "default")
    try:
        drain("tasks.default")
    except Exception as exc:  # noqa: BLE001 - reported to the test as it is
        seen["drain_error"] = f"{type(exc).__name__}: {exc}"
    seen["task_results"] = sorted(
        TaskResultRecord.objects.values_list("id", "status").filter(id__startswith="schedule:"))

    # The archive marks of "orders" are not those of "Orders".
    conn = django_connection("default")
    with conn.atomic():
        archive.set_pending(conn, "orders", {"0": 5000}, "run-1")
        archive.finish(conn, "run-1")
    seen["archive_marks"] = {topic: archive.marks(conn, topic) for topic in ("orders", "Orders")}

    # The slots of two scopes differing in case are two sets of rows.
    for scope in ("group:Orders", "group:orders"):
        LimitSlot.objects.ensure(scope, "", 1, 0, "default")
    seen["limit_scopes"] = sorted(LimitSlot.objects.values_list("scope", flat=True))

    if connection.vendor != "mysql":
        return seen
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name, data_type, collation_name "
            "FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND collation_name IS NOT NULL")
        seen["columns"] = [list(row) for row in cursor.fetchall()]
        cursor.execute("SELECT default_collation_name FROM information_schema.schemata "
                       "WHERE schema_name = DATABASE()")
        seen["database_collation"] = cursor.fetchone()[0]
    return seen


if __name__ == "__main__":
    main()
