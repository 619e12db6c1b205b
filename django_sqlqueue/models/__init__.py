"""One module per table; each model's manager holds that table's SQL."""

from .archive import ArchiveMark
from .delivery import DeliveryState
from .heartbeats import SubscriberHeartbeat
from .leases import PartitionLease
from .messages import QueueMessage
from .offsets import ConsumerOffset
from .sequencer import LogSequencer
from .topics import Topic

__all__ = [
    "ArchiveMark",
    "ConsumerOffset",
    "DeliveryState",
    "LogSequencer",
    "PartitionLease",
    "QueueMessage",
    "SubscriberHeartbeat",
    "Topic",
]
