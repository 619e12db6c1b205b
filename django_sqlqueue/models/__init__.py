"""One module per table; each model's manager runs that table's SQL.

The statements on the tables a Spark job shares (the log, sequencer, topics, offsets,
heartbeats, archive) are written in :mod:`django_sqlqueue.store`, and their managers call
them with the Django connection; the other managers hold their table's SQL themselves.
"""

from .archive import ArchiveMark
from .cancellations import Cancellation
from .controls import GroupControl
from .delivery import DeliveryState
from .heartbeats import SubscriberHeartbeat
from .leases import PartitionLease
from .limit_buckets import LimitBucket
from .limit_slots import LimitSlot
from .messages import QueueMessage
from .offsets import ConsumerOffset
from .operated import DeadLetter, Overview, Partition, Subscriber
from .schedules import Schedule
from .sequencer import LogSequencer
from .task_results import TaskResultRecord
from .throughput import Throughput
from .topics import Topic

__all__ = [
    "ArchiveMark",
    "Cancellation",
    "ConsumerOffset",
    "DeadLetter",
    "DeliveryState",
    "GroupControl",
    "LimitBucket",
    "LimitSlot",
    "LogSequencer",
    "Overview",
    "Partition",
    "PartitionLease",
    "QueueMessage",
    "Schedule",
    "Subscriber",
    "SubscriberHeartbeat",
    "TaskResultRecord",
    "Throughput",
    "Topic",
]
