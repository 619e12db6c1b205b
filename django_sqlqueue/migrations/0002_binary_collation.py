"""On MySQL/MariaDB, compare names byte for byte.

The server's default collations are case-insensitive and (for PAD SPACE collations) ignore
trailing spaces, so ``Order-7`` and ``order-7`` would be one idempotency id, one partition
and one lease. PostgreSQL and SQLite already compare text exactly.
"""

from typing import Any

from django.db import migrations

# table -> [(column, length)]
NAME_COLUMNS = {
    "queue_messages": [
        ("topic", 255), ("partition_key", 255), ("id", 128), ("original_topic", 255),
        ("consumer_group", 100),
    ],
    "queue_delivery_state": [("consumer_group", 100), ("topic", 255), ("partition_key", 255)],
    "queue_partition_leases": [
        ("consumer_group", 100), ("topic", 255), ("partition_key", 255), ("leased_by", 255),
    ],
    "queue_offsets": [("consumer_group", 100), ("topic", 255), ("partition_key", 255)],
    "queue_subscriber_heartbeats": [
        ("consumer_group", 100), ("topic", 255), ("subscriber_name", 255),
    ],
    "queue_sequencer": [("name", 64), ("sequenced_by", 255)],
}


def binary_collation(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    # NO PAD collations also treat trailing spaces as significant.
    collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    quote = connection.ops.quote_name
    for table, columns in NAME_COLUMNS.items():
        changes = ", ".join(
            f"MODIFY {quote(column)} VARCHAR({length}) CHARACTER SET utf8mb4 "
            f"COLLATE {collation} NOT NULL"
            for column, length in columns
        )
        schema_editor.execute(f"ALTER TABLE {quote(table)} {changes}")


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot roll back DDL anyway

    dependencies = [("django_sqlqueue", "0001_initial")]

    operations = [migrations.RunPython(binary_collation, migrations.RunPython.noop, elidable=False)]
