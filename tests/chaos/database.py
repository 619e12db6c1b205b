"""The chaos run's database: set-up, the faults it suffers (a restart, a lock held by an
idle transaction) and what the report reads from it."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.db import DatabaseError, connection, connections, transaction

from benchmarks.database import QUEUE_TABLES, ensure_database, truncate
from django_sqlqueue.models import ConsumerOffset, QueueMessage

from . import records
from .settings import TOPIC

LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}


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


def restart_command() -> str:
    """Why the server cannot be restarted here, or '' when it can."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return "SQLite has no server"
    if str(db.get("HOST") or "") not in LOCAL_HOSTS:
        return "the server is not on this machine"
    if connection.vendor == "mysql" and not (Path("/usr/sbin/mariadbd").exists()
                                             and shutil.which("mysqladmin")):
        return "no /usr/sbin/mariadbd and mysqladmin here"
    if connection.vendor == "postgresql" and not shutil.which("pg_ctlcluster"):
        return "no pg_ctlcluster here"
    return ""


def restart_server(down_seconds: float = 2.0) -> float:
    """Stop the database server, keep it down ``down_seconds``, start it again and wait
    until it answers; return how long it was unreachable."""
    db = connection.settings_dict
    connection.close()
    started = time.monotonic()
    records.write("faults", e="db_down")
    if connection.vendor == "mysql":
        port = str(db.get("PORT") or 3306)
        user = str(db.get("USER") or "root")
        subprocess.run(["mysqladmin", "-h127.0.0.1", f"-P{port}", f"-u{user}", "shutdown"],
                       check=True, capture_output=True, timeout=60)
        time.sleep(down_seconds)
        subprocess.run(["start-stop-daemon", "--start", "--oknodo", "--background", "--exec",
                        "/usr/sbin/mariadbd"], check=True, capture_output=True, timeout=60)
    else:
        version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "stop",
                        "-m", "fast"], check=True, capture_output=True, timeout=60)
        time.sleep(down_seconds)
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
                       check=True, capture_output=True, timeout=60)
    deadline = time.monotonic() + 60
    while True:
        try:
            connection.ensure_connection()
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            break
        except DatabaseError:
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    records.write("faults", e="db_up")
    return time.monotonic() - started


# --------------------------------------------------------------------------- idle lock


class LockHolder(threading.Thread):
    """An idle transaction that locks one consumed message row (as a forgotten shell
    session or a stuck request would) and holds it for ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(name="chaos-lock", daemon=True)
        self.seconds = seconds
        self.locked: int | None = None
        self.error = ""

    def run(self) -> None:
        try:
            with transaction.atomic():
                target = (QueueMessage.objects.select_for_update()
                          .filter(topic=TOPIC, position__isnull=False)
                          .order_by("-position").values_list("offset", flat=True)[:1])
                self.locked = next(iter(target), None)
                records.write("faults", e="lock", offset=self.locked)
                time.sleep(self.seconds)
            records.write("faults", e="unlock", offset=self.locked)
        except DatabaseError as exc:
            self.error = str(exc)
            records.write("faults", e="unlock", offset=self.locked, error=self.error[:200])
        finally:
            connections.close_all()


# --------------------------------------------------------------------------- reading


def dead_letters(groups: tuple[str, ...], suffix: str) -> dict[str, set[int]]:
    """Per group, the message numbers of its dead-letter copies."""
    result: dict[str, set[int]] = {group: set() for group in groups}
    rows = QueueMessage.objects.filter(topic=TOPIC + suffix).values_list("consumer_group",
                                                                        "payload")
    for group, payload in rows:
        if group in result:
            result[group].add(int(_payload(payload)["n"]))
    return result


def _payload(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


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
