"""factory-boy factories for the queue's tables.

Times are epoch milliseconds; rows built here bypass publish(), so they are useful for
arranging state (an existing message, a lease, an advanced sequencer) before a test acts.
"""

from __future__ import annotations

import time
import uuid

import factory
from factory.django import DjangoModelFactory

from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    LogSequencer,
    PartitionLease,
    QueueMessage,
    Schedule,
    SubscriberHeartbeat,
)


def _now_ms() -> int:
    return int(time.time() * 1000)


class QueueMessageFactory(DjangoModelFactory):
    """A committed-looking log entry; unsequenced (``position=None``) unless given one."""

    class Meta:
        model = QueueMessage

    topic = factory.Sequence(lambda n: f"topic-{n}")
    partition_key = ""
    message_id = factory.LazyFunction(lambda: uuid.uuid4().hex)
    payload = factory.Sequence(lambda n: {"n": n})
    metadata = factory.LazyFunction(dict)
    created_at = factory.LazyFunction(_now_ms)
    published_at = factory.SelfAttribute("created_at")
    deliver_at = factory.SelfAttribute("published_at")
    position = None


class DeliveryStateFactory(DjangoModelFactory):
    class Meta:
        model = DeliveryState

    consumer_group = "group"
    topic = factory.Sequence(lambda n: f"topic-{n}")
    partition_key = ""
    message_offset = factory.Sequence(lambda n: n + 1)
    acked = False
    invisible_until = 0
    retry_count = 0
    last_error = ""


class PartitionLeaseFactory(DjangoModelFactory):
    class Meta:
        model = PartitionLease

    consumer_group = "group"
    topic = factory.Sequence(lambda n: f"topic-{n}")
    partition_key = ""
    leased_by = factory.Sequence(lambda n: f"worker-{n}")
    leased_at = factory.LazyFunction(_now_ms)
    lease_renewed_at = factory.SelfAttribute("leased_at")
    generation = 1


class ConsumerOffsetFactory(DjangoModelFactory):
    class Meta:
        model = ConsumerOffset

    consumer_group = "group"
    topic = factory.Sequence(lambda n: f"topic-{n}")
    partition_key = ""
    offset_acked = 0
    updated_at = factory.LazyFunction(_now_ms)


class SubscriberHeartbeatFactory(DjangoModelFactory):
    class Meta:
        model = SubscriberHeartbeat

    consumer_group = "group"
    topic = factory.Sequence(lambda n: f"topic-{n}")
    subscriber_name = factory.Sequence(lambda n: f"host-{n}:1234")
    heartbeat_at = factory.LazyFunction(_now_ms)
    deregistered_at = 0


class LogSequencerFactory(DjangoModelFactory):
    class Meta:
        model = LogSequencer

    name = "default"
    last_position = 0
    sequenced_by = ""
    sequenced_at = 0


class ScheduleFactory(DjangoModelFactory):
    """A schedule publishing {"n": 1} to "reports" hourly; set ``next_run_at`` (epoch ms)
    in the past to make it due, and ``definition`` through :func:`schedule_definition`."""

    class Meta:
        model = Schedule

    name = factory.Sequence(lambda n: f"schedule-{n}")
    origin = "api"
    cron = "0 * * * *"
    timezone = "UTC"
    catch_up = "latest"
    target = "topic reports"
    definition = factory.LazyAttribute(lambda o: schedule_definition(
        cron=o.cron, timezone=o.timezone, catch_up=o.catch_up))
    next_run_at = factory.LazyFunction(_now_ms)


def schedule_definition(**options: object) -> str:
    """A schedule's stored definition: ``options`` over a message schedule's defaults."""
    from django_sqlqueue.scheduling.spec import normalize

    merged = {"cron": "0 * * * *", "topic": "reports", "payload": {"n": 1}, **options}
    return normalize("x", {k: v for k, v in merged.items() if v is not None}).definition_json()
