"""Signals sent by the worker, each with ``message`` (a Message) and ``subscription``.

``message_nacked`` also sends ``delay`` (seconds) and ``error``; ``message_dead_lettered``
sends ``error``. They are sent from the worker's main thread after the change committed.
"""

from django.dispatch import Signal

message_delivered = Signal()
message_acked = Signal()
message_nacked = Signal()
message_dead_lettered = Signal()
