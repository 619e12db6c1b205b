"""What a chaos worker observes of the faults it suffers, written to its ``observed``
records: its wall clock beside the database's (the skewed worker's must be a minute
ahead), every ack it committed, and every partition lease it loses (a redelivery is
explained only by a fault while the message was in the worker's hands, before its ack)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from django.db import DatabaseError, connection

from . import records

CLOCK_EVERY = 5.0  # seconds between two clock readings of one process

_last_clock = -CLOCK_EVERY
_clock_lock = threading.Lock()


def read_clock() -> None:
    """Now and then, record this process's wall clock and the database clock side by side."""
    global _last_clock
    now = time.monotonic()
    with _clock_lock:
        if now - _last_clock < CLOCK_EVERY:
            return
        _last_clock = now
    from django_sqlqueue.db.vendor import database_now_ms

    try:
        db = database_now_ms(connection) / 1000
    except DatabaseError:
        return  # the database is down: the next run reads it
    records.write("observed", e="clock", wall=time.time(), db=db)


class LeaseLossRecorder(logging.Handler):
    """A log handler that records the worker's ``lease lost`` lines, with the monotonic
    time the run's other records use (log lines carry the wall clock, which is skewed in
    one worker)."""

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if not str(record.msg).startswith("lease lost") or not isinstance(args, tuple) \
                or len(args) < 3:
            return
        group, _topic, partition = args[:3]
        with contextlib.suppress(KeyError, OSError):  # KeyError: not in a chaos run
            records.write("observed", e="lease_lost", g=group, part=str(partition))


def record_ack(sender: object, message: Any, **kwargs: Any) -> None:
    """``message_acked`` receiver: the ack committed now (a duplicate of this run is then
    explained only by the lease lost before it, which may have fenced the ack)."""
    records.write("observed", e="acked", g=message.group, o=message.offset)
