"""Fleet-wide limits: the slots of ``max_running`` limits and the token buckets of ``rate``
limits (see django_sqlqueue/models/limit_slots.py and limit_buckets.py)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0012_schedules'),
    ]

    operations = [
        migrations.CreateModel(
            name='LimitBucket',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('scope', models.CharField(max_length=360)),
                ('limit_key', models.CharField(blank=True, default='', max_length=40)),
                ('key_label', models.CharField(blank=True, default='', max_length=255)),
                ('rate', models.CharField(blank=True, default='', max_length=32)),
                ('tokens', models.FloatField()),
                ('refilled_at', models.BigIntegerField()),
                ('full_at', models.BigIntegerField()),
            ],
            options={
                'db_table': 'queue_limit_buckets',
                'indexes': [models.Index(fields=['full_at'], name='queue_limit_bucket_full')],
                'constraints': [models.UniqueConstraint(fields=('scope', 'limit_key'), name='queue_limit_bucket_unique')],
            },
        ),
        migrations.CreateModel(
            name='LimitSlot',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('scope', models.CharField(max_length=360)),
                ('limit_key', models.CharField(blank=True, default='', max_length=40)),
                ('key_label', models.CharField(blank=True, default='', max_length=255)),
                ('slot', models.IntegerField()),
                ('holder', models.CharField(blank=True, default='', max_length=64)),
                ('held_for', models.CharField(blank=True, default='', max_length=255)),
                ('expires_at', models.BigIntegerField(default=0)),
                ('idle_since', models.BigIntegerField(default=0)),
            ],
            options={
                'db_table': 'queue_limit_slots',
                'indexes': [models.Index(fields=['holder', 'idle_since'], name='queue_limit_slot_idle')],
                'constraints': [models.UniqueConstraint(fields=('scope', 'limit_key', 'slot'), name='queue_limit_slot_unique')],
            },
        ),
    ]
