"""Partitions that scale with keys.

Until now a partition *was* a key: ``partition_key`` held the key as published. From here
on it holds the partition number the key maps to (see django_sqlqueue.partitioning), and
the key moves to the new ``message_key`` column. The data is converted in place:

* every message keeps its key in ``message_key`` and gets its partition;
* each group's per-key watermarks become per-partition watermarks: a partition's watermark
  is the lowest watermark of its keys that still have messages above it, and messages of
  other keys that were acked above that point get an acked delivery row, so nothing is
  delivered twice and nothing is skipped;
* lease rows are dropped; workers create one per partition when they start.

Stop every worker and publisher before migrating, and start them again on the new code
afterwards: a row published by the old code after the migration would carry no key.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

from django_sqlqueue.conf import get_settings
from django_sqlqueue.partitioning import assign_partition

BATCH = 2000


def binary_collation(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    quote = connection.ops.quote_name
    for table, column, null_default in (
        ("queue_messages", "message_key", "NOT NULL DEFAULT ''"),
        ("queue_topics", "topic", "NOT NULL"),
    ):
        schema_editor.execute(
            f"ALTER TABLE {quote(table)} MODIFY {quote(column)} VARCHAR(255) CHARACTER SET utf8mb4 "
            f"COLLATE {collation} {null_default}"
        )


def keys_to_partitions(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    q = connection.ops.quote_name
    conf = get_settings()
    true = "TRUE" if connection.vendor == "postgresql" else "1"
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {q('queue_messages')} SET {q('message_key')} = {q('partition_key')}")  # noqa: S608 - names quoted, values bound

        topics: set[str] = set()
        for table in ("queue_messages", "queue_offsets", "queue_delivery_state",
                      "queue_partition_leases", "queue_subscriber_heartbeats"):
            cursor.execute(f"SELECT DISTINCT {q('topic')} FROM {q(table)}")  # noqa: S608 - names quoted, values bound
            topics.update(row[0] for row in cursor.fetchall())
        counts = {topic: conf.partitions_for(topic) for topic in sorted(topics)}
        for topic, count in counts.items():
            cursor.execute(
                f"INSERT INTO {q('queue_topics')} ({q('topic')}, {q('partitions')}, "  # noqa: S608 - names quoted, values bound
                f"{q('created_at')}, {q('updated_at')}) VALUES (%s, %s, 0, 0)", [topic, count],
            )

        # Every message gets its partition.
        last = 0
        while True:
            cursor.execute(
                f"SELECT {q('offset')}, {q('topic')}, {q('message_key')} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
                f"WHERE {q('offset')} > %s ORDER BY {q('offset')} LIMIT {BATCH}", [last],
            )
            rows = cursor.fetchall()
            if not rows:
                break
            cases = " ".join(["WHEN %s THEN %s"] * len(rows))
            params: list[Any] = []
            for offset, topic, key in rows:
                params += [offset, assign_partition(key, int(offset), counts[topic])]
            offsets = [row[0] for row in rows]
            cursor.execute(
                f"UPDATE {q('queue_messages')} SET {q('partition_key')} = CASE {q('offset')} {cases} "  # noqa: S608 - names quoted, values bound
                f"END WHERE {q('offset')} IN ({', '.join(['%s'] * len(offsets))})",
                params + offsets,
            )
            last = int(rows[-1][0])

        # Delivery rows follow their message; rows of collected messages are never read.
        cursor.execute(
            f"DELETE FROM {q('queue_delivery_state')} WHERE NOT EXISTS (SELECT 1 FROM "  # noqa: S608 - names quoted, values bound
            f"{q('queue_messages')} m WHERE m.{q('offset')} = "
            f"{q('queue_delivery_state')}.{q('message_offset')})"
        )
        cursor.execute(
            f"UPDATE {q('queue_delivery_state')} SET {q('partition_key')} = (SELECT m.{q('partition_key')} "  # noqa: S608 - names quoted, values bound
            f"FROM {q('queue_messages')} m WHERE m.{q('offset')} = "
            f"{q('queue_delivery_state')}.{q('message_offset')})"
        )

        # Per-key watermarks become per-partition watermarks.
        cursor.execute(
            f"SELECT {q('consumer_group')}, {q('topic')}, {q('partition_key')}, {q('offset_acked')} "  # noqa: S608 - names quoted, values bound
            f"FROM {q('queue_offsets')}"
        )
        old: dict[tuple[str, str], dict[str, int]] = {}
        for group, topic, key, watermark in cursor.fetchall():
            old.setdefault((group, topic), {})[key] = int(watermark)
        cursor.execute(f"DELETE FROM {q('queue_offsets')}")  # noqa: S608 - names quoted, values bound
        for (group, topic), watermarks in sorted(old.items()):
            count = counts[topic]
            cursor.execute(
                f"SELECT {q('message_key')}, {q('partition_key')}, MAX({q('position')}) "  # noqa: S608 - names quoted, values bound
                f"FROM {q('queue_messages')} WHERE {q('topic')} = %s AND {q('position')} IS NOT NULL "
                f"GROUP BY {q('message_key')}, {q('partition_key')}",
                [topic],
            )
            # (key, partition) -> highest position; a keyless "key" spans partitions.
            newest = {(key, part): int(top) for key, part, top in cursor.fetchall()}
            members: dict[str, set[str]] = {str(p): set() for p in range(count)}
            for key, part in newest:
                members.setdefault(part, set()).add(key)
            for key in watermarks:
                if key:
                    members.setdefault(assign_partition(key, 0, count), set()).add(key)
            for part, keys in sorted(members.items()):
                behind = [watermarks.get(k, 0) for k in keys
                          if newest.get((k, part), 0) > watermarks.get(k, 0)]
                done = [watermarks.get(k, 0) for k in keys]
                mark = min(behind) if behind else max(done, default=0)
                for key in sorted(keys):
                    if watermarks.get(key, 0) > mark:
                        # Acked under the old per-key watermark, above the partition's: keep
                        # them acked.
                        cursor.execute(
                            f"INSERT INTO {q('queue_delivery_state')} ({q('consumer_group')}, "  # noqa: S608 - names quoted, values bound
                            f"{q('topic')}, {q('partition_key')}, {q('message_offset')}, {q('acked')}, "
                            f"{q('invisible_until')}, {q('retry_count')}, {q('last_error')}) "
                            f"SELECT %s, {q('topic')}, {q('partition_key')}, {q('offset')}, {true}, 0, 0, '' "
                            f"FROM {q('queue_messages')} m WHERE {q('topic')} = %s "
                            f"AND {q('message_key')} = %s AND {q('partition_key')} = %s "
                            f"AND {q('position')} > %s AND {q('position')} <= %s "
                            f"AND NOT EXISTS (SELECT 1 FROM {q('queue_delivery_state')} d "
                            f"WHERE d.{q('consumer_group')} = %s AND d.{q('topic')} = m.{q('topic')} "
                            f"AND d.{q('partition_key')} = m.{q('partition_key')} "
                            f"AND d.{q('message_offset')} = m.{q('offset')})",
                            [group, topic, key, part, mark, watermarks[key], group],
                        )
                cursor.execute(
                    f"INSERT INTO {q('queue_offsets')} ({q('consumer_group')}, {q('topic')}, "  # noqa: S608 - names quoted, values bound
                    f"{q('partition_key')}, {q('offset_acked')}, {q('offset_fetched')}, {q('updated_at')}) "
                    f"VALUES (%s, %s, %s, %s, %s, 0)",
                    [group, topic, part, mark, mark],
                )

        cursor.execute(f"DELETE FROM {q('queue_partition_leases')}")  # noqa: S608 - names quoted, values bound


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot roll back DDL; the data conversion is one transaction

    dependencies = [("django_sqlqueue", "0002_binary_collation")]

    operations = [
        migrations.CreateModel(
            name="Topic",
            fields=[
                ("topic", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("partitions", models.IntegerField()),
                ("created_at", models.BigIntegerField(default=0)),
                ("updated_at", models.BigIntegerField(default=0)),
            ],
            options={
                "verbose_name": "topic",
                "verbose_name_plural": "topics",
                "db_table": "queue_topics",
            },
        ),
        migrations.AddField(
            model_name="consumeroffset",
            name="offset_fetched",
            field=models.BigIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="queuemessage",
            name="message_key",
            field=models.CharField(blank=True, db_default="", max_length=255),
        ),
        migrations.RunPython(binary_collation, migrations.RunPython.noop, elidable=False),
        # Many keys now share a partition, so (topic, partition, id) is no longer unique.
        migrations.RemoveConstraint(model_name="queuemessage", name="queue_msg_idempotency"),
        migrations.RunPython(keys_to_partitions, migrations.RunPython.noop, atomic=True,
                             elidable=False),
        migrations.AddConstraint(
            model_name="queuemessage",
            constraint=models.UniqueConstraint(
                fields=("topic", "message_key", "message_id"), name="queue_msg_key_idempotency"
            ),
        ),
    ]
