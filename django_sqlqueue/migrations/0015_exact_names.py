"""On MySQL/MariaDB, every name column compares byte for byte (see django_sqlqueue/db/exact_names.py).

0002, 0003, 0007, 0011, 0012 and 0014 converted the queue's own name columns; the tables
added since kept the database's default collation, which is case-insensitive on most
servers. Under it the task results of schedules ``Nightly`` and ``nightly`` shared an id,
the archive marks of topics ``Orders`` and ``orders`` were one, and so were the limit slots
of scopes ``group:Orders`` and ``group:orders``. This converts every remaining CHAR/VARCHAR
column, keeping its type, nullability and default, and the virtual columns that index
``SEARCH_FIELDS`` (an exact match on ``customer_id`` is exact).

Each listed table is rebuilt once; ``queue_messages`` is among them (``original_id``), so on
a large log the migration takes as long as copying the table.
"""

from typing import Any

from django.db import migrations

from django_sqlqueue.db.exact_names import exact_names, make_exact

NAME_COLUMNS = {
    "queue_task_results": ["id", "task_path", "backend", "queue_name", "status"],
    "queue_archive": ["topic", "partition_key", "pending_run"],
    "queue_limit_slots": ["scope", "limit_key", "key_label", "holder", "held_for"],
    "queue_limit_buckets": ["scope", "limit_key", "key_label", "rate"],
    "queue_messages": ["original_id"],
    "queue_partition_leases": ["lease_token"],
    "queue_schedules": ["origin", "cron", "timezone", "catch_up", "target", "last_message"],
    "queue_group_controls": ["changed_by"],
    "queue_cancellations": ["cancelled_by"],
}


def search_columns(apps: Any, schema_editor: Any) -> None:
    """The indexed virtual columns of ``SEARCH_FIELDS`` that ``migrate`` has made so far."""
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND table_name = %s AND column_name LIKE %s", ["queue_messages", "sqlqueue\\_s\\_%"],
        )
        names = [row[0] for row in cursor.fetchall()]
    make_exact(schema_editor, {"queue_messages": names})


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot roll back DDL anyway (see 0002)

    dependencies = [("django_sqlqueue", "0014_cancellations")]

    operations = [
        exact_names(NAME_COLUMNS),
        migrations.RunPython(search_columns, migrations.RunPython.noop, elidable=False),
    ]
