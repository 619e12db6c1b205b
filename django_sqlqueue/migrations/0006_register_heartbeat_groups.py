"""Register every consumer group that so far was known only by its heartbeat rows.

Before this release GC waited for the groups it found in ``queue_subscriber_heartbeats``;
now it waits for the *registered* groups, those with ``queue_offsets`` rows (heartbeats are
pruned, and a group whose workers are all down must still hold GC back). A group whose
workers were down during the upgrade, and that had not yet written a watermark for every
partition, would otherwise stop holding GC back until its workers return, and GC could
collect messages it has not consumed. This gives each (group, topic) seen in the heartbeat
table a watermark at 0 on every partition that lacks one; existing watermarks are kept.
"""

import time

from django.db import migrations

BATCH = 1000


def register_heartbeat_groups(apps, schema_editor):
    alias = schema_editor.connection.alias
    heartbeat = apps.get_model("django_sqlqueue", "SubscriberHeartbeat")
    offset = apps.get_model("django_sqlqueue", "ConsumerOffset")
    topic_model = apps.get_model("django_sqlqueue", "Topic")
    partitions = dict(topic_model.objects.using(alias).values_list("topic", "partitions"))
    pairs = (
        heartbeat.objects.using(alias)
        .values_list("consumer_group", "topic").distinct().order_by("consumer_group", "topic")
    )
    now_ms = int(time.time() * 1000)
    for group, topic in pairs:
        count = partitions.get(topic)
        if not count:  # a topic that never had a message has no partition count and no log
            continue
        existing = set(
            offset.objects.using(alias).filter(consumer_group=group, topic=topic)
            .values_list("partition_key", flat=True)
        )
        missing = [
            offset(consumer_group=group, topic=topic, partition_key=str(number),
                   offset_acked=0, offset_fetched=0, updated_at=now_ms)
            for number in range(count) if str(number) not in existing
        ]
        offset.objects.using(alias).bulk_create(missing, batch_size=BATCH, ignore_conflicts=True)


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0005_heartbeat_indexes'),
    ]

    operations = [
        migrations.RunPython(register_heartbeat_groups, migrations.RunPython.noop, elidable=False),
    ]
