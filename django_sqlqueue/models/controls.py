from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from django.db import connections, models

from ..db import sql as sqlb
from ..db import vendor
from .fields import GROUP_LENGTH, TOPIC_LENGTH


class ControlState(NamedTuple):
    """An operator's settings for one consumer group on one topic."""

    paused: bool
    version: int  # bumped by every change (pause, resume, a nudge)


class GroupControlManager(models.Manager["GroupControl"]):
    """SQL for ``queue_group_controls``: pause, resume, nudge, and what workers read."""

    def set_paused(self, group: str, topic: str, paused: bool, by: str, using: str) -> bool:
        """Pause or resume; returns whether the state changed. Bumps the version either way
        only when it changed, so workers re-read the table once per real change."""
        current = self.state(group, topic, using)
        if current is not None and current.paused == paused:
            return False
        self._write(group, topic, paused, by, using)
        return True

    def nudge(self, group: str, topic: str, by: str, using: str) -> None:
        """Bump the version without changing the pause flag: the group's workers reload
        their windows of the topic from the database (after deliver-now, say)."""
        current = self.state(group, topic, using)
        self._write(group, topic, current.paused if current else False, by, using)

    def _write(self, group: str, topic: str, paused: bool, by: str, using: str) -> None:
        connection = connections[using]
        q = sqlb.quoter(connection)
        now = vendor.now_ms_sql(connection)
        flag = vendor.true_sql(connection) if paused else vendor.false_sql(connection)
        tail = sqlb.on_conflict_update(
            connection, "queue_group_controls", ("consumer_group", "topic"),
            {"paused": "{new}", "version": "{old} + 1", "changed_at": "{new}",
             "changed_by": "{new}"},
        )
        columns = ", ".join(q(c) for c in ("consumer_group", "topic", "paused", "version",
                                            "changed_at", "changed_by"))
        sqlb.execute(
            connection,
            f"INSERT INTO {q('queue_group_controls')} ({columns}) "  # noqa: S608 - names quoted, values bound
            f"VALUES (%s, %s, {flag}, 1, {now}, %s){tail}",
            [group, topic, by[:255]],
        )

    def state(self, group: str, topic: str, using: str) -> ControlState | None:
        row = (self.using(using).filter(consumer_group=group, topic=topic)
               .values_list("paused", "version").first())
        return None if row is None else ControlState(bool(row[0]), int(row[1]))

    def states(self, topics: Sequence[str] | None, using: str
               ) -> dict[tuple[str, str], ControlState]:
        """Per (group, topic), the control state (every topic when ``topics`` is None)."""
        rows = self.using(using).all()
        if topics is not None:
            rows = rows.filter(topic__in=list(topics))
        return {(g, t): ControlState(bool(p), int(v))
                for g, t, p, v in rows.values_list("consumer_group", "topic", "paused", "version")}

    def version_sql(self, connection: object) -> str:
        """A scalar subquery that changes whenever any control changes (the sum of
        versions, each only ever incremented): the worker reads it with its poll's head."""
        q = sqlb.quoter(connection)  # type: ignore[arg-type]
        return f"(SELECT COALESCE(SUM({q('version')}), 0) FROM {q('queue_group_controls')})"  # noqa: S608 - names quoted

    def delete_group(self, group: str, topic: str, using: str) -> int:
        return self.using(using).filter(consumer_group=group, topic=topic).delete()[0]


class GroupControl(models.Model):
    """Operator controls of one consumer group on one topic (``queue_group_controls``).

    ``paused``: the group's workers take no new deliveries of the topic (in-flight ones
    finish, leases are kept, publishing goes on). ``version`` is bumped on every change;
    workers poll the sum of all versions with their log head, so a change reaches them
    within one poll interval at no extra cost per poll.
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    paused = models.BooleanField(default=False)
    version = models.BigIntegerField(default=0)
    changed_at = models.BigIntegerField(default=0)  # epoch ms, database clock
    changed_by = models.CharField(max_length=255, blank=True, default="")

    objects = GroupControlManager()

    class Meta:
        db_table = "queue_group_controls"
        verbose_name = "group control"
        verbose_name_plural = "group controls"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic} {'paused' if self.paused else 'running'}"
