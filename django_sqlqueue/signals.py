"""Signals sent by the worker, each with ``message`` (a Message) and ``subscription``.

``message_nacked`` also sends ``delay`` (seconds) and ``error``; ``message_dead_lettered``
sends ``error``. They are sent from the worker's main thread after the change committed.

``dead_letters_replayed`` is sent by ``operations.replay`` (the admin's and the CLI's
replay) with ``replays`` (a list of ``Replayed``: group, original topic, original id) and
``using``, *inside* the transaction that writes the replays: a receiver's writes commit
with them, and a receiver that raises rolls that batch back. Task results use it to go
back to READY.
"""

from django.dispatch import Signal

message_delivered = Signal()
message_acked = Signal()
message_nacked = Signal()
message_dead_lettered = Signal()
dead_letters_replayed = Signal()
