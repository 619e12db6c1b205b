"""Waiting messages the watermark may pass.

A delayed message, a retry backing off and (in strict mode) a message waiting behind its
key's parked head are *parked*: their delivery row says so, with the message's key and
position, and the group's watermark moves on past them. Indexes find a partition's parked
rows by due time and a key's parked rows in log order. Rows written by older code are not
parked (the column's default), so they stay in their owner's window as before.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def binary_collation(apps: Any, schema_editor: Any) -> None:
    """The key is compared byte for byte, as ``queue_messages.message_key`` is."""
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    quote = connection.ops.quote_name
    schema_editor.execute(
        f"ALTER TABLE {quote('queue_delivery_state')} MODIFY {quote('message_key')} "
        f"VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL DEFAULT ''"
    )


class Migration(migrations.Migration):

    atomic = False  # MySQL cannot roll back DDL anyway (see 0002)

    dependencies = [
        ("django_sqlqueue", "0010_archive"),
    ]

    operations = [
        migrations.AddField(
            model_name="deliverystate",
            name="message_key",
            field=models.CharField(blank=True, db_default="", max_length=255),
        ),
        migrations.AddField(
            model_name="deliverystate",
            name="message_position",
            field=models.BigIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="deliverystate",
            name="parked",
            field=models.SmallIntegerField(db_default=0),
        ),
        migrations.RunPython(binary_collation, migrations.RunPython.noop, elidable=False),
        migrations.AddIndex(
            model_name="deliverystate",
            index=models.Index(
                fields=["parked", "consumer_group", "topic", "partition_key", "acked",
                        "invisible_until"],
                name="queue_delivery_parked",
            ),
        ),
        migrations.AddIndex(
            model_name="deliverystate",
            index=models.Index(fields=["message_key", "consumer_group", "topic", "message_position"],
                               name="queue_delivery_parked_key"),
        ),
    ]
