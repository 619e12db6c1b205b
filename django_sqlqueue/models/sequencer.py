from __future__ import annotations

from django.db import models

from ..store import sequencer as store_sequencer
from ..store.connection import django_connection

DEFAULT_SEQUENCER = store_sequencer.DEFAULT_SEQUENCER


class LogSequencerManager(models.Manager["LogSequencer"]):
    """``queue_sequencer`` for Django code: lock the counter (skipping or waiting), advance
    it, read the log head. The sequencing itself is :mod:`django_sqlqueue.store.sequencer`."""

    def lock_counter(self, using: str, name: str = DEFAULT_SEQUENCER) -> int | None:
        """Lock the counter row and return its last position; None if another worker holds it
        (:func:`django_sqlqueue.store.sequencer.lock_counter`). Must run inside a transaction."""
        return store_sequencer.lock_counter(django_connection(using), name)

    def lock_counter_wait(self, using: str, name: str = DEFAULT_SEQUENCER) -> int:
        """Lock the counter row, waiting for whoever holds it; return its last position.

        Must run inside a transaction. Unlike :meth:`lock_counter` it does not skip a busy
        sequencer: an operation that must stop sequencing for a moment (repartitioning)
        queues behind it instead. The row is created if missing. SQLite has no row locks;
        its transaction's write lock (``transaction_mode = IMMEDIATE``) serializes writers.
        """
        locked = (
            self.using(using).select_for_update().filter(name=name)
            .values_list("last_position", flat=True)
        )
        positions = list(locked.all())  # .all(): a fresh query each time, not the cache
        if not positions:
            # Created by us, or by a concurrent transaction whose INSERT this one waits
            # for: either way the row exists afterwards, and the SELECT locks it.
            self._create_counter(using, name)
            positions = list(locked.all())
        return int(positions[0])

    def _create_counter(self, using: str, name: str) -> bool:
        """Insert the counter row unless it exists; True when this call inserted it."""
        return store_sequencer.create_counter(django_connection(using), name)

    def advance(self, last_position: int, sequenced_by: str, using: str,
                name: str = DEFAULT_SEQUENCER) -> None:
        store_sequencer.advance(django_connection(using), last_position, sequenced_by, name)

    def head(self, using: str, name: str = DEFAULT_SEQUENCER) -> tuple[int, bool, int]:
        """(last position, whether unsequenced messages wait, database time in ms): one query.

        This is an idle worker's whole poll: nothing else runs until the head moves.
        """
        return self._head(using, name, "0")[:3]

    def poll_head(self, using: str, controls_sql: str,
                  name: str = DEFAULT_SEQUENCER) -> tuple[int, bool, int, int]:
        """:meth:`head` and the value of the scalar subquery ``controls_sql`` (the operator
        controls' version), still one query."""
        return self._head(using, name, controls_sql)

    def _head(self, using: str, name: str, extra_sql: str) -> tuple[int, bool, int, int]:
        return store_sequencer.head(django_connection(using), name, extra_sql)


class LogSequencer(models.Model):
    """The counter behind ``QueueMessage.position`` (``queue_sequencer``; not in the RFC).

    Offsets are allocated at INSERT but become visible at COMMIT, so they do not follow
    commit order. Positions do: they are handed out only to committed rows, under this
    row's lock, so a reader that sees position N also sees every position below N. The
    counter lives in its own row, not in ``MAX(position)``, because GC may delete the
    highest-positioned message and positions must never be reused.
    """

    name = models.CharField(max_length=64, primary_key=True)
    last_position = models.BigIntegerField(default=0)
    sequenced_by = models.CharField(max_length=255, blank=True, default="")
    sequenced_at = models.BigIntegerField(default=0)  # epoch ms, database clock

    objects = LogSequencerManager()

    class Meta:
        db_table = "queue_sequencer"
        verbose_name = "log sequencer"
        verbose_name_plural = "log sequencer"

    def __str__(self) -> str:
        return f"{self.name} @ {self.last_position}"
