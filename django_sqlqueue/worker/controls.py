"""Operator controls as a worker sees them: paused subscriptions, and nudges to reload.

The worker learns that something changed from the controls' version, read with its log
head in the same query every poll; only then does it read the controls table (one small
query). So pausing reaches every worker within a poll interval and costs nothing while
nothing changes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..models import GroupControl
from ..models.controls import ControlState
from .partitions import Ident, Partition

logger = logging.getLogger("django_sqlqueue.worker")

Subscriber = tuple[str, str]  # (consumer group, topic)


class Controls:
    def __init__(self, subscribers: Iterable[Subscriber], using: str) -> None:
        self.subscribers = set(subscribers)
        self.topics = sorted({topic for _, topic in self.subscribers})
        self.using = using
        self.version: int | None = None  # None: never read
        self.states: dict[Subscriber, ControlState] = {}
        self.paused: set[Subscriber] = set()
        # Subscriptions whose windows must be rebuilt from the database (a nudge).
        self._reload: set[Subscriber] = set()
        self._changed = False

    def note_version(self, version: int) -> None:
        """Read the controls when their version moved since the last read."""
        if version == self.version:
            return
        states = {k: v for k, v in GroupControl.objects.states(self.topics, self.using).items()
                  if k in self.subscribers}
        first = self.version is None
        for subscriber, state in states.items():
            before = self.states.get(subscriber)
            if not first and before != state and (before is None or before.paused == state.paused):
                self._reload.add(subscriber)  # a nudge: the version moved, the flag did not
        paused = {s for s, state in states.items() if state.paused}
        for subscriber in sorted(paused - self.paused):
            logger.info("paused by an operator group=%s topic=%s", *subscriber)
        for subscriber in sorted(self.paused - paused):
            logger.info("resumed by an operator group=%s topic=%s", *subscriber)
        self.states, self.paused, self.version = states, paused, version
        self._changed = True

    def apply(self, partitions: dict[Ident, Partition]) -> None:
        """Mark held partitions paused or not, and unload the nudged ones. Free while no
        subscription is paused and nothing changed; else one pass over the partitions."""
        if not self._changed and not self.paused:
            return
        for partition in partitions.values():
            subscriber = (partition.group, partition.topic)
            partition.paused = subscriber in self.paused
            if subscriber in self._reload:
                partition.unreliable()
        self._reload.clear()
        self._changed = False
