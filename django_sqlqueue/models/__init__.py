"""One module per table; each model's manager holds that table's SQL."""

from .delivery import DeliveryState
from .heartbeats import SubscriberHeartbeat
from .leases import PartitionLease
from .messages import QueueMessage
from .offsets import ConsumerOffset
from .sequencer import LogSequencer
from .task_results import TaskResultRecord
from .topics import Topic

__all__ = [
    "ConsumerOffset",
    "DeliveryState",
    "LogSequencer",
    "PartitionLease",
    "QueueMessage",
    "SubscriberHeartbeat",
    "TaskResultRecord",
    "Topic",
]
