"""Why a schedule's due ticks wait: a task or queue this worker's release lacks, shown on
the schedule (admin, ``sqlqueue schedules``) while another release's workers fire them."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_sqlqueue", "0015_exact_names"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedule",
            name="reason",
            field=models.CharField(blank=True, db_default="", max_length=300,
                                   verbose_name="waiting because"),
        ),
    ]
