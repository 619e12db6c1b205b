"""Turns at a full ``max_running`` limit: when each slot was taken (the one held longest
is asked back first) and which worker asked for it (the slot, given back, waits a moment
for that worker, so the worker waiting longest is served first, not whoever looks first)."""

from __future__ import annotations

from django.db import migrations, models

from django_sqlqueue.db.exact_names import exact_names


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot roll back DDL anyway (see 0002)

    dependencies = [
        ("django_sqlqueue", "0016_schedule_reasons"),
    ]

    operations = [
        migrations.AddField(
            model_name="limitslot",
            name="held_since",
            field=models.BigIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="limitslot",
            name="wanted_by",
            field=models.CharField(blank=True, db_default="", max_length=64),
        ),
        exact_names({"queue_limit_slots": ["wanted_by"]}),
    ]
