"""Topics nobody consumes, and subscriptions to topics nobody publishes to.

A topic with messages and no consumer group (a publisher's typo, or a subscriber's) would
otherwise appear nowhere: the overview lists registered groups. A subscriber whose topic
has never had a message may be the other half of the same typo. Both are bounded reads:
an index seek per topic of the log, capped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..conf import get_settings, queue_database
from ..models import ConsumerOffset, QueueMessage

TOPIC_CAP = 1000  # topics of the log looked at, at most
MESSAGE_CAP = 10_000  # messages counted per unclaimed topic, at most


@dataclass(frozen=True)
class UnclaimedTopic:
    """A topic with messages in the log and no registered consumer group."""

    topic: str
    messages: int  # counted up to MESSAGE_CAP
    capped: bool

    @property
    def line(self) -> str:
        count = f"{self.messages}{'+' if self.capped else ''}"
        return (f"topic {self.topic!r} has {count} message(s) and no consumer group: no "
                "worker has subscribed to it (check the topic of its @subscriber)")


def has_messages(topic: str, using: str | None = None) -> bool:
    """Whether the log holds a message of ``topic`` (published, consumed or not)."""
    using = using or queue_database(topic)
    return QueueMessage.objects.using(using).filter(topic=topic).exists()


def unclaimed_topics(*, topic: str | None = None, using: str | None = None) -> list[UnclaimedTopic]:
    """Topics (or ``topic``) with messages and no consumer group registered for them,
    dead-letter topics left out (nobody need consume those)."""
    using = using or queue_database(topic)
    suffix = get_settings().dlq_suffix
    if topic is not None:
        names = [topic] if has_messages(topic, using) else []
    else:
        names = QueueMessage.objects.topics(TOPIC_CAP, using)
    names = [name for name in names if not name.endswith(suffix)]
    if not names:
        return []
    claimed = set(ConsumerOffset.objects.using(using).filter(topic__in=names)
                  .values_list("topic", flat=True).distinct())
    found = []
    for name in names:
        if name in claimed:
            continue
        count = QueueMessage.objects.using(using).filter(topic=name)[:MESSAGE_CAP].count()
        found.append(UnclaimedTopic(name, count, count >= MESSAGE_CAP))
    return found


def silent_topics(topics: Iterable[str], using: str | None = None) -> list[str]:
    """Of ``topics`` (those the project's @subscriber handlers consume), the ones that have
    never had a message: none in the log, and no group has acked one."""
    using = using or queue_database()
    silent = []
    for topic in sorted(set(topics)):
        if has_messages(topic, using):
            continue
        if ConsumerOffset.objects.using(using).filter(topic=topic, offset_acked__gt=0).exists():
            continue
        silent.append(topic)
    return silent
