"""``captured()``: what publish(), publish_many() and task enqueue wrote inside a block.

Capturing observes, it does not replace: the messages are still written, so ``drain()``
can run them afterwards. Publishes are seen in every thread, committed or not (a block
rolled back still shows what it tried to publish), and nested blocks each see their own.

It records what the block wrote: a publish whose (topic, key, id) was stored before the
block wrote nothing, and is listed apart, in ``duplicates``, never among the messages.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..models.task_results import TASK_TOPIC_PREFIX
from ..publishing import StoredMessage, observe

_ANY: Any = object()  # an argument left out: anything matches
SHOWN = 10  # messages an assertion's error lists at most


@dataclass(frozen=True)
class CapturedTask:
    """A task enqueued through the queue's Tasks backend, as its message carries it."""

    id: str  # the task result's id
    task_path: str  # the task function's dotted path
    queue_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    run_after: datetime | None
    message: StoredMessage


class Captured:
    """The messages published while a ``captured()`` block ran, in publish order.

    ``len(box)``, iteration and ``box.messages`` give them all; ``filter()`` and
    ``payloads()`` narrow them down; ``assert_published()`` and ``assert_enqueued()``
    check them with an error that lists what was published instead. ``duplicates`` lists
    the publishes that wrote nothing (their id was taken before the block).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_offset: dict[int, StoredMessage] = {}
        self._duplicates: list[StoredMessage] = []

    def _record(self, messages: Sequence[StoredMessage]) -> None:
        with self._lock:
            for message in messages:
                # A duplicate publish (same topic, key and id) returns the stored message
                # and writes nothing: one of a message this block wrote is listed once,
                # one of a message stored before is no message of the block's at all.
                if message.written or message.offset in self._by_offset:
                    self._by_offset.setdefault(message.offset, message)
                else:
                    self._duplicates.append(message)

    # ----------------------------------------------------------------- reading

    @property
    def messages(self) -> list[StoredMessage]:
        with self._lock:
            return list(self._by_offset.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_offset)

    def __iter__(self) -> Iterator[StoredMessage]:
        return iter(self.messages)

    def __repr__(self) -> str:
        return f"<Captured: {len(self)} message(s)>"

    def filter(self, topic: str | None = None, *, key: Any = _ANY, payload: Any = _ANY,
               headers: Any = _ANY) -> list[StoredMessage]:
        """The messages of ``topic`` (every topic when None) that match each given field
        (compared with ==, so ``unittest.mock.ANY`` works inside a payload)."""
        return [m for m in self.messages if _matches(m, topic, key, payload, headers)]

    def payloads(self, topic: str | None = None) -> list[Any]:
        """The payloads published to ``topic`` (every topic when None), in order."""
        return [m.payload for m in self.filter(topic)]

    @property
    def duplicates(self) -> list[StoredMessage]:
        """Publishes in the block that wrote nothing, because a message with the same
        (topic, key, id) was stored before it: the stored messages they found, in order."""
        with self._lock:
            return list(self._duplicates)

    @property
    def tasks(self) -> list[CapturedTask]:
        """The tasks enqueued, in order."""
        return [task for m in self.messages if (task := _as_task(m)) is not None]

    def clear(self) -> None:
        """Forget what was captured so far (the messages stay in the log)."""
        with self._lock:
            self._by_offset.clear()
            self._duplicates.clear()

    # ----------------------------------------------------------------- asserting

    def assert_published(self, topic: str, *, key: Any = _ANY, payload: Any = _ANY,
                         headers: Any = _ANY, count: int | None = None) -> StoredMessage:
        """Assert that a message of ``topic`` matching the given fields was published
        (exactly ``count`` of them, when given); return the first."""
        found = self.filter(topic, key=key, payload=payload, headers=headers)
        if found and (count is None or len(found) == count):
            return found[0]
        wanted = _describe(topic, key=key, payload=payload, headers=headers)
        times = "" if count is None else f" {count} time(s), found {len(found)}"
        raise AssertionError(f"expected {wanted} to be published{times}; "
                             + self._listing(topic))

    def assert_not_published(self, topic: str | None = None, *, key: Any = _ANY,
                             payload: Any = _ANY, headers: Any = _ANY) -> None:
        """Assert that no message of ``topic`` (of any topic when None) matching the given
        fields was published."""
        found = self.filter(topic, key=key, payload=payload, headers=headers)
        if found:
            wanted = _describe(topic, key=key, payload=payload, headers=headers)
            raise AssertionError(f"expected no {wanted}, found {len(found)}: "
                                 + _lines(found))

    def assert_enqueued(self, task: Any, *, args: Any = _ANY, kwargs: Any = _ANY,
                        queue_name: str | None = None, count: int | None = None) -> CapturedTask:
        """Assert that ``task`` (a task, or its dotted path) was enqueued with the given
        arguments (exactly ``count`` times, when given); return the first."""
        path = task if isinstance(task, str) else getattr(task, "module_path", repr(task))
        found = [t for t in self.tasks if t.task_path == path
                 and (args is _ANY or t.args == list(args))
                 and (kwargs is _ANY or t.kwargs == kwargs)
                 and (queue_name is None or t.queue_name == queue_name)]
        if found and (count is None or len(found) == count):
            return found[0]
        given = ", ".join(f"{name}={value!r}" for name, value in
                          (("args", args), ("kwargs", kwargs), ("queue_name", queue_name))
                          if value is not _ANY and value is not None)
        times = "" if count is None else f" {count} time(s), found {len(found)}"
        enqueued = self.tasks
        listing = ("no task was enqueued" if not enqueued else
                   f"{len(enqueued)} task(s) were enqueued: " + "; ".join(
                       f"{t.task_path}(args={t.args!r}, kwargs={t.kwargs!r}) on "
                       f"{t.queue_name!r}" for t in enqueued[:SHOWN]))
        raise AssertionError(f"expected {path}{f' with {given}' if given else ''} to be "
                             f"enqueued{times}; {listing}")

    def _listing(self, topic: str) -> str:
        same = self.filter(topic)
        dropped = [m for m in self.duplicates if m.topic == topic]
        if dropped:
            ids = ", ".join(f"key={m.key!r} id={m.id!r}" for m in dropped[:SHOWN])
            dropped_text = (f"; {len(dropped)} publish(es) to {topic!r} wrote nothing, their "
                            f"(topic, key, id) being stored already: {ids}")
        else:
            dropped_text = ""
        if same:
            return f"{len(same)} message(s) of {topic!r} were: " + _lines(same) + dropped_text
        topics = sorted({m.topic for m in self.messages})
        if not topics:
            return "nothing was published" + dropped_text
        return (f"nothing was published to {topic!r}; topics published to: "
                f"{', '.join(topics)}" + dropped_text)


@contextmanager
def captured() -> Iterator[Captured]:
    """Record every message published (and task enqueued) inside the block, in any
    thread, committed or not; the messages are still written."""
    box = Captured()
    stop = observe(box._record)
    try:
        yield box
    finally:
        stop()


def _matches(message: StoredMessage, topic: str | None, key: Any, payload: Any,
             headers: Any) -> bool:
    return ((topic is None or message.topic == topic)
            and (key is _ANY or message.key == key)
            and (payload is _ANY or message.payload == payload)
            and (headers is _ANY or message.headers == headers))


def _describe(topic: str | None, **fields: Any) -> str:
    given = ", ".join(f"{name}={value!r}" for name, value in fields.items() if value is not _ANY)
    where = "a message" if topic is None else f"a message of {topic!r}"
    return f"{where} with {given}" if given else where


def _lines(messages: list[StoredMessage]) -> str:
    shown = "; ".join(f"key={m.key!r} payload={m.payload!r}"
                      + (f" headers={m.headers!r}" if m.headers else "")
                      for m in messages[:SHOWN])
    return shown + (f"; ... and {len(messages) - SHOWN} more" if len(messages) > SHOWN else "")


def _as_task(message: StoredMessage) -> CapturedTask | None:
    payload = message.payload
    if not message.topic.startswith(TASK_TOPIC_PREFIX) or not isinstance(payload, dict):
        return None
    if not all(isinstance(payload.get(name), str) for name in ("id", "task", "backend")):
        return None
    run_after = payload.get("run_after")
    return CapturedTask(
        id=payload["id"], task_path=payload["task"],
        queue_name=message.topic[len(TASK_TOPIC_PREFIX):], args=list(payload.get("args", [])),
        kwargs=dict(payload.get("kwargs", {})), priority=int(payload.get("priority", 0)),
        run_after=datetime.fromisoformat(run_after) if run_after else None, message=message,
    )
