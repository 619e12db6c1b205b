"""One module per table; each model's manager holds that table's SQL."""

from .delivery import DeliveryState
from .heartbeats import SubscriberHeartbeat
from .leases import PartitionLease
from .messages import QueueMessage
from .offsets import ConsumerOffset
from .operated import ConsumerGroupPage, DeadLetter, PartitionPage, SubscriberPage
from .sequencer import LogSequencer
from .topics import Topic

__all__ = [
    "ConsumerGroupPage",
    "ConsumerOffset",
    "DeadLetter",
    "DeliveryState",
    "LogSequencer",
    "PartitionPage",
    "PartitionLease",
    "QueueMessage",
    "SubscriberHeartbeat",
    "SubscriberPage",
    "Topic",
]
