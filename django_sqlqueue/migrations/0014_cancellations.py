"""Cancelling messages that have not started: the record of each cancellation, the
delivery rows' flag telling a running attempt from a waiting one, and the lease rows'
counter that tells the partition's owner to rebuild its window."""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def binary_collation(apps: Any, schema_editor: Any) -> None:
    """Names are compared byte for byte, and joined with the other tables' (see 0002)."""
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    quote = connection.ops.quote_name
    columns = (("topic", 255), ("consumer_group", 100), ("partition_key", 255))
    schema_editor.execute(
        f"ALTER TABLE {quote('queue_cancellations')} " + ", ".join(
            f"MODIFY {quote(name)} VARCHAR({length}) CHARACTER SET utf8mb4 COLLATE {collation} "
            f"NOT NULL" for name, length in columns)
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot roll back DDL anyway (see 0002)

    dependencies = [("django_sqlqueue", "0013_limits")]

    operations = [
        migrations.AddField(
            model_name="deliverystate",
            name="in_flight",
            field=models.BooleanField(db_default=False),
        ),
        migrations.AddField(
            model_name="partitionlease",
            name="cancellations",
            field=models.BigIntegerField(db_default=0),
        ),
        migrations.CreateModel(
            name="Cancellation",
            fields=[
                ("pk", models.CompositePrimaryKey("topic", "message_offset", "consumer_group",
                                                  blank=True, editable=False,
                                                  primary_key=True, serialize=False)),
                ("topic", models.CharField(max_length=255)),
                ("message_offset", models.BigIntegerField()),
                ("consumer_group", models.CharField(blank=True, max_length=100)),
                ("partition_key", models.CharField(blank=True, max_length=255)),
                ("cancelled_by", models.CharField(blank=True, default="", max_length=255)),
                ("cancelled_at", models.BigIntegerField(default=0)),
            ],
            options={
                "verbose_name": "cancellation",
                "verbose_name_plural": "cancellations",
                "db_table": "queue_cancellations",
            },
        ),
        migrations.RunPython(binary_collation, migrations.RunPython.noop, elidable=False),
        migrations.AlterModelOptions(
            name="queuemessage",
            options={
                "permissions": [
                    ("deliver_message", "Can make a waiting message deliverable now"),
                    ("cancel_message", "Can cancel a message that has not started"),
                ],
                "verbose_name": "message",
                "verbose_name_plural": "messages",
            },
        ),
    ]
