"""One chaos publisher process: ``python -m tests.chaos.publisher KIND INDEX SECONDS SEED``.

Kinds:
- ``steady``: one to three messages per transaction, about 35 messages a second;
- ``bulk``: ``publish_many`` of 20 to 100 messages, about once a second;
- ``slow``: keeps each transaction open for 2 to 4 seconds (0.5 s on SQLite, whose one
  writer would block everybody) while the others commit later offsets;
- ``rollback``: publishes, then rolls the transaction back; those messages must never
  be handled.

Every kind now and then re-publishes a message it committed earlier (same topic, key and
id): the queue must store it once. A transaction that fails on a database fault (the
server restarting) is retried with the same ids, as an application would; ids make the
retry safe even when the first commit went through.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.chaos.settings")
django.setup()

from django.db import DatabaseError, connection, transaction  # noqa: E402

import django_sqlqueue as sqlqueue  # noqa: E402
from django_sqlqueue.models import QueueMessage  # noqa: E402
from tests.chaos import records  # noqa: E402
from tests.chaos.settings import TOPIC  # noqa: E402

COLD_KEYS = 30_000  # most messages: many keys with one or two messages each
HOT_KEYS = 200  # a fifth: few keys with many messages, where order matters
NUMBERS_PER_PUBLISHER = 10_000_000


class RolledBack(Exception):
    """Raised inside a transaction to roll it back on purpose."""


class Publisher:
    def __init__(self, kind: str, index: int, seed: int) -> None:
        self.kind = kind
        self.random = random.Random(seed * 1000 + index)
        self.next_number = index * NUMBERS_PER_PUBLISHER + 1
        self.committed: list[dict[str, Any]] = []
        self.transactions = 0

    def message(self) -> dict[str, Any]:
        n = self.next_number
        self.next_number += 1
        r = self.random
        key = f"hot{r.randrange(HOT_KEYS)}" if r.random() < 0.2 else f"k{r.randrange(COLD_KEYS)}"
        payload: dict[str, Any] = {"n": n}
        roll = r.random()
        if roll < 0.002:
            payload["poison"] = True
        elif roll < 0.052:
            payload["flaky"] = True
        elif roll < 0.062:
            payload["slow"] = True
        return {"payload": payload, "key": key, "id": f"m{n}"}

    def batch(self) -> list[dict[str, Any]]:
        r = self.random
        if self.kind == "bulk":
            return [self.message() for _ in range(r.randint(20, 100))]
        return [self.message() for _ in range(r.choice((1, 1, 1, 2, 3)))]

    def pause(self) -> float:
        """Seconds between transactions."""
        return {"steady": 0.045, "bulk": 1.0, "slow": 0.1, "rollback": 0.2}[self.kind]

    def publish(self, batch: list[dict[str, Any]]) -> None:
        duplicate = self.pick_duplicate()
        numbers = [m["payload"]["n"] for m in batch]
        self.transactions += 1
        commit_asked: float | None = None  # the first try's, when the commit's outcome is unknown
        while True:
            try:
                with transaction.atomic():
                    if self.kind == "bulk":
                        stored = sqlqueue.publish_many(TOPIC, batch)
                    else:
                        stored = [sqlqueue.publish(TOPIC, m["payload"], key=m["key"], id=m["id"])
                                  for m in batch]
                    if duplicate is not None:
                        # The stored row of this id, if GC has not collected it: then the
                        # re-publish must find it instead of storing a new one. A locking
                        # read, so GC cannot collect it between this read and the publish
                        # (and a collection in progress is waited for, not read around).
                        existed = QueueMessage.objects.select_for_update().filter(
                            topic=TOPIC, message_key=duplicate["key"],
                            message_id=duplicate["id"]).values_list("offset", flat=True).first()
                        again = sqlqueue.publish(TOPIC, duplicate["payload"],
                                                 key=duplicate["key"], id=duplicate["id"])
                    if self.kind == "slow":
                        time.sleep(0.5 if connection.vendor == "sqlite"
                                   else self.random.uniform(2.0, 4.0))
                    if self.kind == "rollback":
                        raise RolledBack
                    if commit_asked is None:
                        commit_asked = time.monotonic()  # the commit follows, on leaving atomic
            except RolledBack:
                records.write("published", e="rolled_back", ns=numbers)
                return
            except DatabaseError as exc:
                # The outcome of a failed commit is unknown: retry with the same ids.
                records.write("published", e="retry", ns=numbers, error=str(exc)[:200])
                connection.close()
                time.sleep(0.5)
                continue
            break
        committed = time.monotonic()
        flags = {m["payload"]["n"]: flag for m in batch for flag in ("poison", "flaky", "slow")
                 if m["payload"].get(flag)}
        # Per transaction, its messages in publish order and the window it committed in:
        # the order each key's messages must be consumed in follows from these.
        records.write("published", e="committed", tx=self.transactions, ns=numbers,
                      keys=[m["key"] for m in batch], offsets=[m.offset for m in stored],
                      flags=flags, c0=commit_asked, c1=committed)
        if duplicate is not None:
            records.write("published", e="duplicate", tx=self.transactions, i=len(batch),
                          n=duplicate["payload"]["n"], k=duplicate["key"],
                          offset=duplicate["offset"], again=again.offset, existed=existed)
        for m, s in zip(batch, stored, strict=True):
            self.committed.append({**m, "offset": s.offset})
        if len(self.committed) > 5000:
            del self.committed[:1000]

    def pick_duplicate(self) -> dict[str, Any] | None:
        """Now and then a message committed earlier: mostly a recent one (still in the
        log, so the re-publish must be a no-op), sometimes an old one (perhaps collected
        already: then it is published anew, as documented)."""
        r = self.random
        if not self.committed or r.random() >= 0.03:
            return None
        recent = self.committed[-20:] if r.random() < 0.7 else self.committed
        return r.choice(recent)


def main(argv: list[str]) -> int:
    kind, index, seconds, seed = argv[0], int(argv[1]), float(argv[2]), int(argv[3])
    if kind == "poison":
        return publish_poison(index, seconds, seed)
    publisher = Publisher(kind, index, seed)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        publisher.publish(publisher.batch())
        time.sleep(max(0.0, publisher.pause() - (time.monotonic() - started)))
    return 0


def publish_poison(index: int, seconds: float, seed: int) -> int:
    """The poison publisher (poison.py): a transaction that fails on a database fault is
    not retried; what it would have published is simply not written down."""
    from tests.chaos.poison import PoisonPublisher

    publisher = PoisonPublisher(index, seed, index * NUMBERS_PER_PUBLISHER + 1)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            publisher.publish_one()
        except DatabaseError:
            connection.close()
        time.sleep(max(0.0, publisher.pause() - (time.monotonic() - started)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
