"""``queue_schedules``: one row per recurring schedule, declared in settings or added at
run time, with the tick it fires next.

Workers look at the earliest ``next_run_at`` of the running schedules (one index read)
about once a second, and claim the due rows with ``SELECT … FOR UPDATE SKIP LOCKED``
(SQLite: its one writer), so any number of workers share the firing and each tick is
fired by one of them. The advance of a row and what its tick publishes commit together.
"""

from __future__ import annotations

from collections.abc import Collection

from django.db import connections, models

from ..db import sql as sqlb
from ..db import vendor
from .fields import ID_LENGTH

ORIGIN_SETTINGS = "settings"  # from SQLQUEUE["SCHEDULES"]: synced, kept until removed
REASON_LENGTH = 300
ORIGIN_API = "api"  # from django_sqlqueue.schedules.add(): kept until removed


class ScheduleManager(models.Manager["Schedule"]):
    def claim_due(self, now_ms: int, limit: int, using: str,
                  skip: Collection[str] = ()) -> list[Schedule]:
        """Lock up to ``limit`` running schedules due at ``now_ms``, earliest first,
        passing over rows another worker holds and those named in ``skip``. Inside
        ``transaction.atomic``: the locks last until it commits, and a row another worker
        advanced meanwhile is no longer due (row locks read the latest committed row;
        SQLite's writer is alone anyway)."""
        rows = self.using(using).filter(paused=False, next_run_at__lte=now_ms)
        if skip:
            rows = rows.exclude(name__in=sorted(skip))
        return list(rows.order_by("next_run_at").select_for_update(skip_locked=True)[:limit])

    def next_due(self, using: str, skip: Collection[str] = ()) -> tuple[int | None, int]:
        """(earliest next_run_at of the running schedules not named in ``skip``, or None;
        the database's now in epoch ms): the one statement an idle scheduler runs, an
        index read."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        names = sorted(skip)
        passed_over = (f" AND {q('name')} NOT IN ({', '.join(['%s'] * len(names))})"
                       if names else "")
        rows = sqlb.fetch_all(
            connection,
            f"SELECT MIN({q('next_run_at')}), {vendor.now_ms_sql(connection)} "  # noqa: S608 - names quoted
            f"FROM {q('queue_schedules')} WHERE {q('paused')} = {vendor.false_sql(connection)}"
            + passed_over,
            names,
        )
        earliest, now = rows[0]
        return (None if earliest is None else int(earliest)), int(now)

    def now_ms(self, using: str) -> int:
        return vendor.database_now_ms(connections[using])

    def advance(self, name: str, next_run_at: int, fired: int | None, message_id: str,
                now_ms: int, using: str) -> None:
        """Record a firing: the next tick, and the tick fired with its message id (when
        the catch-up policy fired one)."""
        changes: dict[str, object] = {"next_run_at": next_run_at, "updated_at": now_ms,
                                      "reason": ""}
        if fired is not None:
            changes.update(last_run_at=fired, last_message=message_id)
        self.using(using).filter(name=name).update(**changes)

    def hold(self, name: str, reason: str, now_ms: int, using: str) -> int:
        """Record why ``name``'s due ticks wait (left due, not advanced); rows changed,
        0 when that reason is recorded already."""
        return (self.using(using).filter(name=name).exclude(reason=reason)
                .update(reason=reason, updated_at=now_ms))

    def defined(self, names: list[str] | None, using: str) -> dict[str, Schedule]:
        """The schedules named (every one when None), locked until the transaction ends, so
        two workers syncing the settings at once apply them one after the other."""
        # In name order, so two syncing workers lock the rows in one order.
        rows = self.using(using).select_for_update().order_by("name")
        if names is not None:
            rows = rows.filter(name__in=names)
        return {row.name: row for row in rows}

    def add_new(self, rows: list[Schedule], using: str) -> None:
        """Insert ``rows``; one a concurrent caller inserted first is left as it is."""
        self.using(using).bulk_create(rows, ignore_conflicts=True)

    def redefine(self, row: Schedule, using: str) -> None:
        row.save(using=using, update_fields=["origin", "cron", "timezone", "catch_up", "target",
                                             "definition", "next_run_at", "updated_at"])

    def settings_except(self, names: list[str], using: str) -> list[str]:
        """The schedules synced from settings that ``names`` (one release's) leave out."""
        return list(self.using(using).filter(origin=ORIGIN_SETTINGS).exclude(name__in=names)
                    .order_by("name").values_list("name", flat=True))

    def set_paused(self, name: str, paused: bool, now_ms: int, using: str,
                   next_run_at: int | None = None) -> int:
        """Rows changed (0 for an unknown name or no change); a resumed schedule starts
        again at ``next_run_at``."""
        changes: dict[str, object] = {"paused": paused, "updated_at": now_ms}
        if next_run_at is not None:
            changes["next_run_at"] = next_run_at
        return self.using(using).filter(name=name).exclude(paused=paused).update(**changes)


class Schedule(models.Model):
    """A recurring schedule (``queue_schedules``). ``definition`` is its normalized JSON
    (see :mod:`django_sqlqueue.scheduling.spec`); times are epoch ms, database clock."""

    name = models.CharField(primary_key=True, max_length=100)
    origin = models.CharField(max_length=10, default=ORIGIN_API)
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64, default="UTC")
    catch_up = models.CharField(max_length=10, default="latest")
    target = models.CharField(max_length=300)  # "task shop.tasks.cleanup", "topic reports"
    definition = models.TextField()
    paused = models.BooleanField(default=False)
    next_run_at = models.BigIntegerField()
    last_run_at = models.BigIntegerField(null=True, blank=True)
    last_message = models.CharField(max_length=ID_LENGTH, blank=True, default="")
    # Why its due ticks wait for another worker (a task or queue this worker's release
    # lacks); empty once a tick fires.
    reason = models.CharField("waiting because", max_length=REASON_LENGTH, blank=True,
                              db_default="")
    created_at = models.BigIntegerField(default=0)
    updated_at = models.BigIntegerField(default=0)

    objects = ScheduleManager()

    class Meta:
        db_table = "queue_schedules"
        verbose_name = "schedule"
        verbose_name_plural = "schedules"
        indexes = [
            # MIN(next_run_at) of the running schedules, and the due ones in order.
            models.Index(fields=["paused", "next_run_at"], name="queue_sched_due"),
        ]

    def __str__(self) -> str:
        return self.name
