"""Fencing by worker process, and the original id of dead-letter copies.

* ``queue_partition_leases.lease_token``: a token each worker process draws at start.
  Fencing by worker name and generation alone let a process paused past its lease and a
  replacement started under the same ``--name`` both pass for the owner. Existing leases
  get an empty token, which no running worker has: they are taken over once stale, like
  any other lease of a worker that went away.
* ``queue_messages.original_id``: the id a dead-lettered message was published with (the
  copy's own id is ``<group>:<original offset>``). Empty for earlier copies.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_sqlqueue", "0003_partitions"),
    ]

    operations = [
        migrations.AddField(
            model_name="partitionlease",
            name="lease_token",
            field=models.CharField(blank=True, db_default="", max_length=32),
        ),
        migrations.AddField(
            model_name="queuemessage",
            name="original_id",
            field=models.CharField(blank=True, db_default="", max_length=128),
        ),
    ]
