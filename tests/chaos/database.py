"""The chaos run's database: set-up, the faults it suffers (a restart, a lock held by an
idle transaction) and what the report reads from it."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from django.core.management import call_command
from django.db import DatabaseError, connection, connections, transaction

from benchmarks.database import QUEUE_TABLES, ensure_database, truncate
from django_sqlqueue.models import ConsumerOffset, QueueMessage

from . import records
from .server import Server
from .settings import TOPIC


def prepare() -> None:
    """Create and migrate the chaos database, and empty the queue tables."""
    db = connection.settings_dict
    ensure_database(db)
    call_command("migrate", verbosity=0, interactive=False)
    truncate(db, QUEUE_TABLES)


def describe() -> str:
    db = connection.settings_dict
    where = db["NAME"] if connection.vendor == "sqlite" else \
        f"{db.get('HOST') or 'localhost'}:{db.get('PORT') or ''}/{db['NAME']}"
    return f"{connection.vendor} {where}"


# --------------------------------------------------------------------------- restart


def restart_server(server: Server, down_seconds: float = 2.0) -> float:
    """Stop the database server, keep it down ``down_seconds``, start it again and wait
    until it answers; return how long it was unreachable. The records name the server's
    start time and pid before and after, so the report can tell it really restarted."""
    before = server.state()
    connection.close()
    started = time.monotonic()
    records.write("faults", e="db_down", server=before)
    server.stop()
    time.sleep(down_seconds)
    server.start()
    server.wait_until_up()
    records.write("faults", e="db_up", server=server.state())
    return time.monotonic() - started


# --------------------------------------------------------------------------- idle lock


FIND_ROW_TIMEOUT = 15.0  # seconds the lock fault waits for a sequenced row to lock


class LockHolder(threading.Thread):
    """An idle transaction that locks one consumed message row (as a forgotten shell
    session or a stuck request would) and holds it for ``seconds``. Its record says which
    row, whether another connection found it locked, and how long it was held."""

    def __init__(self, seconds: float) -> None:
        super().__init__(name="chaos-lock", daemon=True)
        self.seconds = seconds
        self.locked: int | None = None
        self.error = ""

    def run(self) -> None:
        probed = False
        held_from = held_until = 0.0
        try:
            # The fault needs a sequenced row to lock: on a loaded machine (a cluster
            # starting beside a test suite) the workers may not have sequenced one yet.
            deadline = time.monotonic() + FIND_ROW_TIMEOUT
            while (not QueueMessage.objects.filter(topic=TOPIC, position__isnull=False).exists()
                   and time.monotonic() < deadline):
                time.sleep(0.2)
            with transaction.atomic():
                target = (QueueMessage.objects.select_for_update()
                          .filter(topic=TOPIC, position__isnull=False)
                          .order_by("-position").values_list("offset", flat=True)[:1])
                self.locked = next(iter(target), None)
                held_from = time.monotonic()
                records.write("faults", e="lock", offset=self.locked)
                if self.locked is not None:
                    probed = _locked_elsewhere(self.locked)
                time.sleep(max(0.0, held_from + self.seconds - time.monotonic()))
                held_until = time.monotonic()
        except DatabaseError as exc:
            self.error = str(exc)
        finally:
            records.write("faults", e="unlock", offset=self.locked, probed=probed,
                          held=round(held_until - held_from, 3) if held_until else 0.0,
                          intended=self.seconds, error=self.error[:200])
            connections.close_all()


def _locked_elsewhere(offset: int) -> bool:
    """Whether another connection finds the row locked (a NOWAIT locking read fails)."""
    found: list[bool] = []

    def probe() -> None:
        try:
            with transaction.atomic():
                list(QueueMessage.objects.select_for_update(nowait=True)
                     .filter(offset=offset).values_list("offset", flat=True))
            found.append(False)
        except DatabaseError:
            found.append(True)
        finally:
            connections.close_all()

    thread = threading.Thread(target=probe, name="chaos-lock-probe")
    thread.start()
    thread.join(30)
    return bool(found and found[0])


# --------------------------------------------------------------------------- reading


def dead_letters(groups: tuple[str, ...], suffix: str) -> dict[str, Counter[int]]:
    """Per group, its dead-letter copies counted per original offset."""
    result: dict[str, Counter[int]] = {group: Counter() for group in groups}
    rows = QueueMessage.objects.filter(topic=TOPIC + suffix).values_list("consumer_group",
                                                                        "original_offset")
    for group, offset in rows:
        if group in result:
            result[group][int(offset)] += 1
    return result


def lag(groups: tuple[str, ...]) -> dict[str, int]:
    """Per group, messages not yet consumed: above its watermarks, or not yet sequenced."""
    unsequenced = QueueMessage.objects.filter(topic=TOPIC, position__isnull=True).count()
    counts = ConsumerOffset.objects.unconsumed_counts(TOPIC, list(groups), "default")
    return {group: counts[group] + unsequenced for group in groups}


def safely(fn: Any, default: Any) -> Any:
    """``fn()``, or ``default`` when the database is unreachable right now."""
    try:
        return fn()
    except DatabaseError:
        connections.close_all()
        return default
