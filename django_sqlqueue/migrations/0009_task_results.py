"""The results table of the Tasks backend (django_sqlqueue.tasks.QueueBackend)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0008_operated_admin'),
    ]

    operations = [
        migrations.CreateModel(
            name='TaskResultRecord',
            fields=[
                ('id', models.CharField(max_length=128, primary_key=True, serialize=False)),
                ('task_path', models.CharField(max_length=255)),
                ('backend', models.CharField(max_length=100)),
                ('queue_name', models.CharField(max_length=100)),
                ('priority', models.IntegerField(default=0)),
                ('status', models.CharField(default='READY', max_length=10)),
                ('args', models.JSONField(default=list)),
                ('kwargs', models.JSONField(default=dict)),
                ('run_after', models.DateTimeField(blank=True, null=True)),
                ('enqueued_at', models.DateTimeField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('last_attempted_at', models.DateTimeField(blank=True, null=True)),
                ('worker_ids', models.JSONField(default=list)),
                ('errors', models.JSONField(default=list)),
                ('return_value', models.JSONField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'task result',
                'verbose_name_plural': 'task results',
                'db_table': 'queue_task_results',
                'indexes': [models.Index(fields=['finished_at'], name='queue_task_results_finished')],
            },
        ),
    ]
