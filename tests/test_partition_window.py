"""A partition's window in memory: where its watermark goes as messages are settled.

No database here: these are the transitions of ``worker.partitions.Partition`` alone, which
the worker tests exercise through real workers.
"""

from __future__ import annotations

from django_sqlqueue.consuming.backoff import ExponentialBackoff
from django_sqlqueue.consuming.registry import Subscription
from django_sqlqueue.models.delivery import ReadRow
from django_sqlqueue.models.messages import MessageRow
from django_sqlqueue.worker.partitions import Partition

SUBSCRIPTION = Subscription(
    topic="t", group="g", handler=lambda message: None, max_attempts=3,
    visibility_timeout=30.0, batch_size=10, backoff=ExponentialBackoff(), auto_extend=True,
)


def admit_positions(partition: Partition, positions: range) -> None:
    for position in positions:
        row = MessageRow(offset=1000 + position, position=position, topic="t", key="",
                         id=str(position), payload="{}", metadata="{}", published_at=0,
                         deliver_at=0)
        partition.admit(ReadRow("0", row, None), now_ms=0, may_deliver=True)


def settle(partition: Partition, positions: range) -> None:
    for position in positions:
        partition.settled(partition.entries[1000 + position])


def test_the_watermark_stops_below_an_unsettled_head_and_passes_it_once_settled():
    partition = Partition(SUBSCRIPTION, "0", generation=1)
    admit_positions(partition, range(1, 1001))
    settle(partition, range(2, 1001))

    assert partition.advance() is None  # 999 acked, but all above the unsettled head
    assert partition.watermark == 0

    settle(partition, range(1, 2))
    assert partition.advance() == (0, 1000)
    assert partition.watermark == 1000


def test_the_watermark_follows_a_head_that_moves_through_a_long_stream():
    # Thousands settle behind a slow head, then the head settles, again and again: the
    # watermark is always just below the lowest message still unsettled.
    partition = Partition(SUBSCRIPTION, "0", generation=1)
    admit_positions(partition, range(1, 5001))
    for head in range(1, 5001, 500):
        settle(partition, range(head + 1, head + 500))
        partition.advance()
        assert partition.watermark == head - 1
        settle(partition, range(head, head + 1))
    partition.advance()
    assert partition.watermark == 5000
    assert partition.entries == {}
