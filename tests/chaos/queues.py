"""The chaos handlers: three consumer groups on one topic, each misbehaving its own way.

A message's payload says how it behaves (``publisher.py`` decides):
``poison`` fails in every group on every attempt, so it must end in each group's
dead-letter topic and nowhere else; ``flaky`` fails the first attempt; ``hang`` blocks its
first run for an hour (only ``MAX_HANDLER_TIME`` gets it redelivered); ``slow`` outlasts
the visibility timeout of ``audit`` on its first run (that group does not extend it).
"""

from __future__ import annotations

import threading

import django_sqlqueue as sqlqueue

from . import observe, records
from .settings import TOPIC, VISIBILITY_TIMEOUT

FAST_RETRY = sqlqueue.ExponentialBackoff(base=0.05, cap=0.5)
HANG_SECONDS = 3600.0
_forever = threading.Event()  # never set: a hung handler waits on it


def run(message: sqlqueue.Message, slow_seconds: float = 0.0) -> None:
    payload = message.payload
    records.write("runs", e="start", g=message.group, n=payload["n"], k=message.key,
                  o=message.offset, pos=message.position, a=message.attempt,
                  part=message.partition, th=threading.get_ident())
    observe.read_clock()
    ok = False
    try:
        if payload.get("poison"):
            raise RuntimeError("poison message")
        if payload.get("flaky") and message.attempt == 1:
            raise RuntimeError("flaky: fails its first attempt")
        if payload.get("hang") and message.attempt == 1:
            records.write("hang", g=message.group)  # the orchestrator kills another worker
            _forever.wait(HANG_SECONDS)
        if slow_seconds and payload.get("slow") and message.attempt == 1:
            _forever.wait(slow_seconds)
        ok = True
    finally:
        records.write("runs", e="end", g=message.group, n=payload["n"], k=message.key,
                      o=message.offset, pos=message.position, a=message.attempt, ok=ok)


@sqlqueue.subscriber(TOPIC, group="ledger", backoff=FAST_RETRY)
def ledger(message: sqlqueue.Message) -> None:
    """Concurrent mode: a key's messages may run side by side on one worker."""
    run(message)


@sqlqueue.subscriber(TOPIC, group="strict", batch_size=1, backoff=FAST_RETRY)
def strict(message: sqlqueue.Message) -> None:
    """Strict mode: one message of a key at a time, in log order."""
    run(message)


@sqlqueue.subscriber(TOPIC, group="audit", auto_extend=False, backoff=FAST_RETRY)
def audit(message: sqlqueue.Message) -> None:
    """No automatic extension: a slow first run times out and the message comes back."""
    run(message, slow_seconds=VISIBILITY_TIMEOUT + 1.5)
