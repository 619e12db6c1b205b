"""Indexes for the heartbeat queries: live workers of a topic's groups (fair share and
membership checks, several times a second per worker), a live worker under a name (start-up)
and pruning by age. Without them each was a scan of every row ever written."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0004_fencing_tokens_and_dead_letter_ids'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='subscriberheartbeat',
            index=models.Index(fields=['topic', 'deregistered_at', 'heartbeat_at'], name='queue_hb_live'),
        ),
        migrations.AddIndex(
            model_name='subscriberheartbeat',
            index=models.Index(fields=['subscriber_name', 'heartbeat_at'], name='queue_hb_name'),
        ),
        migrations.AddIndex(
            model_name='subscriberheartbeat',
            index=models.Index(fields=['heartbeat_at'], name='queue_hb_age'),
        ),
    ]
