"""Liveness tokens: the token of a worker process that holds a liveness lock, on its lease
rows and heartbeats, so other workers can tell a dead holder from a slow one at once."""

from __future__ import annotations

from django.db import migrations, models

from django_sqlqueue.db.exact_names import exact_names


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot roll back DDL anyway (see 0002)

    dependencies = [
        ("django_sqlqueue", "0017_limit_slot_turns"),
    ]

    operations = [
        migrations.AddField(
            model_name="partitionlease",
            name="liveness_token",
            field=models.CharField(blank=True, db_default="", max_length=32),
        ),
        migrations.AddField(
            model_name="subscriberheartbeat",
            name="liveness_token",
            field=models.CharField(blank=True, db_default="", max_length=32),
        ),
        exact_names({"queue_partition_leases": ["liveness_token"],
                     "queue_subscriber_heartbeats": ["liveness_token"]}),
    ]
