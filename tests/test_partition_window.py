"""A partition's window in memory: where its watermark goes as messages are settled, and
which waiting messages it parks.

No database here: these are the transitions of ``worker.partitions.Partition`` alone, which
the worker tests exercise through real workers.
"""

from __future__ import annotations

from django.test import override_settings

from django_sqlqueue.consuming.backoff import ExponentialBackoff
from django_sqlqueue.consuming.registry import Subscription
from django_sqlqueue.models.delivery import DeliveryRow, ReadRow
from django_sqlqueue.models.messages import MessageRow
from django_sqlqueue.models.waiting import PARKED_BEHIND, PARKED_DUE
from django_sqlqueue.worker.partitions import Partition
from django_sqlqueue.worker.window import Admitted

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


# ----------------------------------------------------------------- waiting messages

STRICT = Subscription(
    topic="t", group="g", handler=lambda message: None, max_attempts=3,
    visibility_timeout=30.0, batch_size=1, backoff=ExponentialBackoff(), auto_extend=True,
)
NOW = 1_000_000_000
DAY_MS = 86_400_000


def admit(partition: Partition, position: int, key: str = "", deliver_at: int = 0,
          may_deliver: bool = True) -> Admitted:
    row = MessageRow(offset=1000 + position, position=position, topic="t", key=key,
                     id=str(position), payload="{}", metadata="{}", published_at=0,
                     deliver_at=deliver_at)
    return partition.admit(ReadRow("0", row, None), now_ms=NOW, may_deliver=may_deliver)


def parked(partition: Partition) -> list[tuple[int, int]]:
    return [(park.position, park.state) for park in partition.take_parking()]


def test_a_delayed_message_is_parked_and_the_watermark_passes_it():
    partition = Partition(SUBSCRIPTION, "0", generation=1)
    assert admit(partition, 1, deliver_at=NOW + DAY_MS).entry is None
    assert admit(partition, 2).deliver

    assert parked(partition) == [(1, PARKED_DUE)]
    assert partition.parked_next is None  # not looked for yet: the next cycle looks
    settle(partition, range(2, 3))
    assert partition.advance() == (0, 2)


def test_reading_the_next_message_moves_the_watermark_over_other_partitions_positions_only():
    partition = Partition(SUBSCRIPTION, "0", generation=1)
    admit_positions(partition, range(10, 11))
    settle(partition, range(10, 11))
    assert partition.advance() == (0, 10)  # passed an acked message: its row goes
    partition.progress_written()

    # The partition's next message is at 20: 11-19 went to other partitions. Moving the
    # watermark to 19 passes none of its messages: nothing to drop, and the saved
    # watermark (10) is worth 19.
    admit_positions(partition, range(20, 21))
    assert partition.advance() is None
    assert (partition.watermark, partition.saved_watermark) == (19, 19)
    assert partition.progress_due()  # the read cursor moved: saved at once

    # A parked message passed on the way is not nothing: that move is returned.
    assert admit(partition, 25, deliver_at=NOW + DAY_MS).entry is None
    admit_positions(partition, range(30, 31))
    settle(partition, range(20, 21))
    assert partition.advance() == (19, 29)


def test_a_message_due_within_a_second_stays_in_the_window():
    partition = Partition(SUBSCRIPTION, "0", generation=1)
    assert admit(partition, 1, deliver_at=NOW + 500).entry is not None
    assert parked(partition) == []


@override_settings(SQLQUEUE={"MAX_WINDOW": 10})
def test_messages_that_wait_in_a_crowded_window_are_parked():
    partition = Partition(STRICT, "0", generation=1)
    for position in range(1, 6):  # five keys in flight: half the window
        admit(partition, position, key=f"k{position}")
    admit(partition, 6, key="k1")  # waits behind k1's head, and the window is crowded
    admit(partition, 7, key="k7", deliver_at=NOW + 500)  # waits briefly, crowded too
    assert parked(partition) == [(6, PARKED_BEHIND), (7, PARKED_DUE)]
    assert len(partition.entries) == 5


def test_strict_mode_parks_a_keys_later_messages_behind_its_parked_head():
    partition = Partition(STRICT, "0", generation=1)
    admit(partition, 1, key="k", deliver_at=NOW + DAY_MS)
    admit(partition, 2, key="k")  # due, but its key's head waits
    assert admit(partition, 3, key="other").deliver
    assert parked(partition) == [(1, PARKED_DUE), (2, PARKED_BEHIND)]
    # Read later, "k" is known (from the database) to have parked messages.
    partition.keys_have_parked({"k"})
    assert admit(partition, 4, key="k").entry is None
    assert parked(partition) == [(4, PARKED_BEHIND)]


def test_a_retry_backing_off_for_long_is_parked_with_the_messages_of_its_key():
    partition = Partition(STRICT, "0", generation=1)
    head = admit(partition, 1, key="k").entry
    assert head is not None
    partition.delivered(head, NOW + 30_000)
    admit(partition, 2, key="k")
    admit(partition, 3, key="k")
    partition.retry_at(head, NOW + 3 * DAY_MS, "later")
    partition.park_retries(NOW)

    assert parked(partition) == [(1, PARKED_DUE), (2, PARKED_BEHIND), (3, PARKED_BEHIND)]
    assert partition.entries == {} and partition.key_queues == {}
    assert partition.advance() == (0, 3)


def test_a_parked_message_read_back_when_due_goes_first_of_its_key_and_holds_no_watermark():
    partition = Partition(STRICT, "0", generation=1)
    admit(partition, 5, key="other")
    row = MessageRow(offset=1001, position=1, topic="t", key="k", id="1", payload="{}",
                     metadata="{}", published_at=0, deliver_at=NOW)
    entry = partition.unpark(ReadRow("0", row, DeliveryRow(False, -1, NOW, "")))
    assert entry is not None and entry.parked
    assert partition.take_ready(NOW, 10) == [entry]
    settle(partition, range(5, 6))
    assert partition.advance() == (0, 5)  # not held below the parked message
    partition.settled(entry)
    assert "k" in partition.take_key_checks()  # look for its next parked message


def test_a_rebuilt_message_is_parked_only_if_no_handler_of_this_worker_runs_it():
    partition = Partition(SUBSCRIPTION, "0", generation=1)
    rows = [ReadRow("0", MessageRow(offset=1000 + p, position=p, topic="t", key="", id=str(p),
                                    payload="{}", metadata="{}", published_at=0, deliver_at=0),
                    DeliveryRow(False, 0, NOW + 30_000, "")) for p in (1, 2)]
    running = partition.admit(rows[0], NOW, may_deliver=False).entry
    orphan = partition.admit(rows[1], NOW, may_deliver=False).entry
    assert running is not None and orphan is not None
    partition.running(running)  # its handler runs here: its outcome needs the entry
    partition.park_retries(NOW)
    assert parked(partition) == [(2, PARKED_DUE)]  # back when its visibility runs out
    assert list(partition.entries) == [running.offset]
