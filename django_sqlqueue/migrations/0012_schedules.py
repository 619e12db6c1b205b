"""Recurring schedules (docs/scheduling.md): one row per schedule with its next tick."""

from typing import Any

from django.db import migrations, models


def binary_names(apps: Any, schema_editor: Any) -> None:
    """Names compare byte for byte, as the message ids they go into do: under a
    case-insensitive collation "Nightly" and "nightly" would be one schedule."""
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    quote = connection.ops.quote_name
    schema_editor.execute(
        f"ALTER TABLE {quote('queue_schedules')} MODIFY {quote('name')} "
        f"VARCHAR(100) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
    )


class Migration(migrations.Migration):

    atomic = False  # MySQL cannot roll back DDL anyway (see 0002)

    dependencies = [
        ('django_sqlqueue', '0011_waiting_messages'),
    ]

    operations = [
        migrations.CreateModel(
            name='Schedule',
            fields=[
                ('name', models.CharField(max_length=100, primary_key=True, serialize=False)),
                ('origin', models.CharField(default='api', max_length=10)),
                ('cron', models.CharField(max_length=200)),
                ('timezone', models.CharField(default='UTC', max_length=64)),
                ('catch_up', models.CharField(default='latest', max_length=10)),
                ('target', models.CharField(max_length=300)),
                ('definition', models.TextField()),
                ('paused', models.BooleanField(default=False)),
                ('next_run_at', models.BigIntegerField()),
                ('last_run_at', models.BigIntegerField(blank=True, null=True)),
                ('last_message', models.CharField(blank=True, default='', max_length=128)),
                ('created_at', models.BigIntegerField(default=0)),
                ('updated_at', models.BigIntegerField(default=0)),
            ],
            options={
                'verbose_name': 'schedule',
                'verbose_name_plural': 'schedules',
                'db_table': 'queue_schedules',
                'indexes': [models.Index(fields=['paused', 'next_run_at'], name='queue_sched_due')],
            },
        ),
        migrations.RunPython(binary_names, migrations.RunPython.noop),
    ]
