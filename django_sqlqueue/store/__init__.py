"""The SQL of the tables a Spark job shares with the workers, written once.

Each statement on the log, the sequencer, ``queue_topics``, ``queue_offsets``,
``queue_subscriber_heartbeats`` and ``queue_archive`` lives here, on a DB-API connection
(:class:`.connection.Connection`): the model managers run it on their Django connection
(:func:`.connection.django_connection`), Spark executors and drivers, which have no settings
module, on a plain one (:func:`.connection.open_connection`). One module per table, the
log's split by job (:mod:`.messages`, :mod:`.message_reads`, :mod:`.message_scans`,
:mod:`.dead_letters`, :mod:`.message_gc`); what differs between databases comes from
:mod:`django_sqlqueue.db.vendor`.
"""
