"""One module per table; each model's manager holds that table's SQL."""

from .controls import GroupControl
from .delivery import DeliveryState
from .heartbeats import SubscriberHeartbeat
from .leases import PartitionLease
from .messages import QueueMessage
from .offsets import ConsumerOffset
from .operated import ConsumerGroupPage, DeadLetter, PartitionPage, SubscriberPage
from .sequencer import LogSequencer
from .throughput import Throughput
from .topics import Topic

__all__ = [
    "ConsumerGroupPage",
    "ConsumerOffset",
    "DeadLetter",
    "DeliveryState",
    "GroupControl",
    "LogSequencer",
    "PartitionPage",
    "PartitionLease",
    "QueueMessage",
    "SubscriberHeartbeat",
    "SubscriberPage",
    "Throughput",
    "Topic",
]
